"""The operator's side of WAL archiving against the real API server (no pods run): the seed's `backup:
{retentionDays: 14}` is accepted; without a repository the cluster says so once, without a hot loop; with the
platform's default repository the key pair is copied for the pods and the archive target reaches instance.json."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest_asyncio

from kanri.local.controlplane import Endpoint
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.backup.archiving import DefaultRepository
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import CONFIG_MAP, EVENT, SECRET
from tests.integration.test_postgres_reconciler import condition, pgc
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    """The conftest's client, with the PostgresCluster CRD installed and Established."""
    await install_postgres_crd(client)
    return client


async def test_retention_alone_without_any_repository_is_accepted_and_reported_once(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, pgc("plain", namespace, replicas=1, backup={"retentionDays": 14}))
    operator = Operator(control_plane, namespace)
    async with operator.running(refresh=0.3):

        async def reported() -> Obj | None:
            return await condition(client, namespace, "plain", "ContinuousArchiving")

        found = await eventually(reported, timeout=30)
        assert (found["status"], found["reason"]) == ("False", "NoRepository")
        reconciles = operator.reconciles()

        async def refreshed() -> bool:
            return operator.reconciles() >= reconciles + 5

        await eventually(refreshed, timeout=30)
        # looked at again on the ordinary refresh only: the condition is not rewritten, the Event not repeated
        assert await condition(client, namespace, "plain", "ContinuousArchiving") == found
        assert operator.errors() == 0
    events, _ = await client.list(EVENT, namespace)
    told = [e for e in events if e.get("reason") == "NoRepository"]
    assert len(told) == 1, told
    assert (told[0]["type"], told[0].get("count", 1)) == ("Warning", 1)
    configmap = await client.get(CONFIG_MAP, "plain-config", namespace)
    assert "archive" not in json.loads(configmap["data"]["instance.json"])


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def copied(client: Client, namespace: str, name: str) -> Obj | None:
    try:
        return await client.get(SECRET, name, namespace)
    except ApiError as exc:
        if exc.not_found:
            return None
        raise


async def test_the_platform_default_repository_reaches_the_instances_without_its_keys_in_the_config(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    # the operator's namespace is the test namespace here: the default's key Secret lives there. The store's IAM API
    # does not answer (nothing listens on its endpoint): the platform's keys must not be handed out instead.
    keys = {"accessKeyId": _b64("AKID"), "secretAccessKey": _b64("very-secret")}
    meta = {"name": "platform-keys", "namespace": namespace}
    await client.create(SECRET, {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": keys})
    default = S3Repository.model_validate({"endpoint": "http://127.0.0.1:9", "bucket": "platform", "path": "dev",
                                           "credentialsSecret": {"name": "platform-keys"}})  # fmt: skip
    await client.create(POSTGRES_CLUSTER, pgc("shop", namespace, replicas=1, backup={"retentionDays": 14}))
    operator = Operator(control_plane, namespace, default_backup_repository=default)
    async with operator.running(refresh=0.3):

        async def failing() -> Obj | None:
            found = await condition(client, namespace, "shop", "ContinuousArchiving")
            return found if found is not None and found["reason"] == "TenantIdentityFailing" else None

        found = await eventually(failing, timeout=60)
        assert found["status"] == "False"
        assert f"namespace {namespace} its own identity" in found["message"], found
        assert "very-secret" not in found["message"]
        assert await copied(client, namespace, "shop-backup-credentials") is None
    configmap = await client.get(CONFIG_MAP, "shop-config", namespace)
    document = configmap["data"]["instance.json"]
    assert json.loads(document)["archive"] == {
        "destination": f"s3://platform/dev/{namespace}",
        "endpointURL": "http://127.0.0.1:9",
        "serverName": "shop",
    }
    assert "very-secret" not in document
    cluster = await client.get(POSTGRES_CLUSTER, "shop", namespace)
    assert "very-secret" not in json.dumps(cluster)


async def test_a_shared_default_repository_hands_out_the_platforms_keys_as_declared(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    keys = {"accessKeyId": _b64("AKID"), "secretAccessKey": _b64("very-secret")}
    meta = {"name": "platform-keys", "namespace": namespace}
    await client.create(SECRET, {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": keys})
    default = DefaultRepository.model_validate({"endpoint": "http://127.0.0.1:9", "bucket": "platform",
                                                "credentialsSecret": {"name": "platform-keys"},
                                                "tenantIsolation": "Shared"})  # fmt: skip
    await client.create(POSTGRES_CLUSTER, pgc("shop", namespace, replicas=1, backup={"retentionDays": 14}))
    operator = Operator(control_plane, namespace, default_backup_repository=default)
    async with operator.running(refresh=0.3):
        secret = await eventually(lambda: copied(client, namespace, "shop-backup-credentials"), timeout=30)
        assert base64.b64decode(secret["data"]["ACCESS_SECRET_KEY"]).decode() == "very-secret"
        assert secret["metadata"]["ownerReferences"][0]["name"] == "shop"

        async def waiting() -> Obj | None:
            found = await condition(client, namespace, "shop", "ContinuousArchiving")
            return found if found is not None and found["reason"] == "WaitingForPrimary" else None

        found = await eventually(waiting, timeout=30)
        assert f"s3://platform/{namespace}/shop (default)" in found["message"]  # a folder per namespace
