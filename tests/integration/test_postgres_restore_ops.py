"""The operator's side of recovery and restore rehearsals against the real API server (no pods run; a pod's end
is written into its status as the kubelet would): a bootstrap.recovery cluster gets the source's key pair, the
recovery entry and condition Restored; a new kanri.dev/restore-test value starts one rehearsal pod, whose verdict is
recorded in status.backup.lastRestoreTest with an Event, after which the pod is deleted and not started again."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import pytest_asyncio

from kanri.local.controlplane import Endpoint
from kanri.local.seaweedfs import SeaweedFS, backup_tools_bin
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.backup.tenant_identity import keys_secret_name
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import CONFIG_MAP, EVENT, POD, SECRET, STATEFUL_SET
from tests.integration.test_postgres_reconciler import condition, pgc
from tests.postgres_support import Operator, install_postgres_crd
from tests.seaweedfs_support import bucket_store
from tests.support import eventually

Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    """The conftest's client, with the PostgresCluster CRD installed and Established."""
    await install_postgres_crd(client)
    return client


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def platform(client: Client, namespace: str, store: SeaweedFS | None = None) -> S3Repository:
    """The platform's default repository, its key Secret in the operator's namespace (the test's): ``store``'s, or
    a store nobody runs."""
    access, secret = (store.keys.access_key_id, store.keys.secret_access_key) if store else ("AKID", "very-secret")
    keys = {"accessKeyId": _b64(access), "secretAccessKey": _b64(secret)}
    meta = {"name": "platform-keys", "namespace": namespace}
    await client.create(SECRET, {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "data": keys})
    endpoint = store.endpoint if store else "http://127.0.0.1:8333"
    return S3Repository.model_validate({"endpoint": endpoint, "bucket": "platform", "path": "dev",
                                        "credentialsSecret": {"name": "platform-keys"}})  # fmt: skip


async def get_or_none(client: Client, kind: Any, name: str, namespace: str) -> Obj | None:
    try:
        return await client.get(kind, name, namespace)
    except ApiError as exc:
        if exc.not_found:
            return None
        raise


@pytest.mark.skipif(not (backup_tools_bin() / "weed").exists(), reason="no backup tools (make backup-tools)")
async def test_a_recovery_cluster_gets_the_namespace_keys_the_recovery_entry_and_condition_restoring(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    async with bucket_store("platform") as store:
        await _recovery_of_the_default_repository(control_plane, client, namespace, store)


async def _recovery_of_the_default_repository(
    control_plane: Endpoint, client: Client, namespace: str, store: SeaweedFS
) -> None:
    default = await platform(client, namespace, store)
    await client.create(POSTGRES_CLUSTER, pgc("orders", namespace, replicas=1, backup={"retentionDays": 14}))
    bootstrap = {"recovery": {"source": "orders", "targetTime": "2026-12-01T10:00:00Z"}}
    await client.create(POSTGRES_CLUSTER, pgc("copy", namespace, replicas=1, backup={"retentionDays": 14},
                                              bootstrap=bootstrap))  # fmt: skip
    operator = Operator(control_plane, namespace, default_backup_repository=default)
    async with operator.running(refresh=0.3):
        restoring = await eventually(lambda: condition(client, namespace, "copy", "Restored"), timeout=30)
        assert (restoring["status"], restoring["reason"]) == ("False", "Restoring")
        assert f"s3://platform/dev/{namespace}/orders (default), up to 2026-12-01T10:00:00+00:00" in restoring[
            "message"]  # fmt: skip
        keys = await eventually(lambda: get_or_none(client, SECRET, "copy-recovery-credentials", namespace))
        # the namespace's own identity in the default repository, never the platform's key pair
        given = base64.b64decode(keys["data"]["ACCESS_KEY_ID"]).decode()
        assert given != store.keys.access_key_id
        assert base64.b64decode(keys["data"]["ACCESS_SECRET_KEY"]).decode() != store.keys.secret_access_key
        kept = await client.get(SECRET, keys_secret_name(namespace), namespace)
        assert base64.b64decode(kept["data"]["accessKeyId"]).decode() == given
        document = json.loads((await client.get(CONFIG_MAP, "copy-config", namespace))["data"]["instance.json"])
        assert document["recovery"] == {
            "source": {"destination": f"s3://platform/dev/{namespace}", "endpointURL": store.endpoint,
                       "serverName": "orders"},
            "targetTime": "2026-12-01T10:00:00+00:00",
        }  # fmt: skip
        assert document["archive"]["serverName"] == "copy"  # its own path, never the source's
        sts = await eventually(lambda: get_or_none(client, STATEFUL_SET, "copy-1", namespace))
        container = sts["spec"]["template"]["spec"]["containers"][0]
        assert {"name": "KANRI_RECOVERY_CREDENTIALS_DIR", "value": "/etc/kanri/recovery"} in container["env"]
        assert {"name": "recovery", "mountPath": "/etc/kanri/recovery", "readOnly": True} in container["volumeMounts"]
        assert operator.errors() == 0
        assert await condition(client, namespace, "orders", "Restored") is None


async def test_an_annotation_runs_one_rehearsal_whose_verdict_is_recorded_and_whose_pod_is_removed(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    default = await platform(client, namespace)
    await client.create(POSTGRES_CLUSTER, pgc("shop", namespace, replicas=1, backup={"retentionDays": 14}))
    operator = Operator(control_plane, namespace, default_backup_repository=default)
    async with operator.running(refresh=0.3):
        await eventually(lambda: get_or_none(client, STATEFUL_SET, "shop-1", namespace), timeout=30)
        assert await get_or_none(client, POD, "shop-restore-test", namespace) is None  # no backup yet: not scheduled
        await client.patch(POSTGRES_CLUSTER, "shop", {"metadata": {"annotations": {"kanri.dev/restore-test": "1"}}},
                           namespace)  # fmt: skip
        pod = await eventually(lambda: get_or_none(client, POD, "shop-restore-test", namespace), timeout=30)
        assert pod["spec"]["containers"][0]["args"] == ["restore-test"]
        assert pod["metadata"]["annotations"]["kanri.dev/restore-test-request"] == "1"
        verdict = {"result": "Failed", "durationSeconds": 7.6, "backup": "20261206T030000",
                   "message": "recovery: PostgreSQL stopped before the end of recovery (exit code 1): could not "
                   "locate required checkpoint record"}  # fmt: skip
        terminated = {"exitCode": 1, "reason": "Error", "message": json.dumps(verdict),
                      "startedAt": "2026-12-06T05:00:05Z", "finishedAt": "2026-12-06T05:00:20Z"}  # fmt: skip
        status = {"phase": "Failed", "containerStatuses": [{"name": "restore-test", "image": "kanri.dev/postgres:16",
                  "imageID": "", "ready": False, "restartCount": 0, "state": {"terminated": terminated}}]}  # fmt: skip
        await client.patch_status(POD, "shop-restore-test", {"status": status}, namespace)

        async def recorded() -> Obj | None:
            cluster = await client.get(POSTGRES_CLUSTER, "shop", namespace)
            return ((cluster.get("status") or {}).get("backup") or {}).get("lastRestoreTest")

        record = await eventually(recorded, timeout=30)
        assert record["result"] == "Failed"
        assert record["request"] == "1"
        assert record["durationSeconds"] == 8
        assert record["message"].startswith("backup 20261206T030000: recovery: PostgreSQL stopped")

        async def gone() -> bool:
            return await get_or_none(client, POD, "shop-restore-test", namespace) is None

        await eventually(gone, timeout=30)
        reconciles = operator.reconciles()
        await eventually(lambda: _more(operator, reconciles + 5), timeout=30)
        assert await gone()  # the value was answered: not run again
        assert operator.errors() == 0
    events, _ = await client.list(EVENT, namespace)
    failed = [e for e in events if e.get("reason") == "RestoreTestFailed"]
    assert len(failed) == 1, failed
    assert failed[0]["type"] == "Warning"
    assert "could not locate required checkpoint record" in failed[0]["message"]
    assert [e["reason"] for e in events if e.get("reason") == "RestoreTestStarted"] == ["RestoreTestStarted"]


async def _more(operator: Operator, count: float) -> bool:
    return operator.reconciles() >= count
