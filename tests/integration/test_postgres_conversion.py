"""The PostgreSQL operator serving its API versions on the real kube-apiserver (issue 28).

The operator's own Manager (``build_manager`` with a webhook reached by URL) brings the two-version CRDs over the
single-version ones the release before installed, serves conversion, and migrates storage. In order, as one
module (the tests share one control plane with every other module of the session, so the real PostgreSQL CRDs are
put back to v1alpha1 alone at the end):

1. this release (``served.SERVED``): v1alpha1 stored, v1beta1 served; objects created in either version read in
   both (PostgresClusters and PostgresPoolers);
2. nobody serving: v1alpha1 still reads and writes, v1beta1 and the group's preferred version fail (namespace
   deletion stalls);
3. the next release (``conversion.POSTGRES``, v1beta1 stored): the leader's migration rewrites every object and
   prunes ``storedVersions`` to ``["v1beta1"]``, with an Event; a restarted operator writes nothing;
4. nobody serving after the migration: v1beta1 (the storage and preferred version) works, v1alpha1 fails.

The controllers watch a namespace of their own with no cluster in it: what is tested is the version machinery,
not the reconciler.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from kanri import __version__
from kanri.local import Endpoint
from kanri.local.ports import free_port
from kanri.postgres.api import v1alpha1
from kanri.postgres.api.conversion import POSTGRES
from kanri.postgres.api.served import SERVED
from kanri.postgres.api.v1alpha1.postgres_pooler import PostgresPooler
from kanri.postgres.operator import OperatorOptions, build_manager
from kanri.runtime import ApiError, Client, Conversions, Kind, Manager, WebhookOptions
from kanri.runtime._crd_upgrade import VERSION_ANNOTATION
from kanri.runtime.kinds import CRD, EVENT, NAMESPACE
from tests.postgres_support import install_postgres_crd, put_back_single_version_crds
from tests.support import NotYet, eventually

OLD = v1alpha1.PostgresCluster.resource.api_kind
NEW = Kind("kanri.dev/v1beta1", "PostgresCluster", "postgresclusters")
CLUSTERS_CRD = v1alpha1.PostgresCluster.resource.crd_name
OLD_POOLER = PostgresPooler.resource.api_kind
NEW_POOLER = Kind("kanri.dev/v1beta1", "PostgresPooler", "postgrespoolers")
POOLERS_CRD = PostgresPooler.resource.crd_name
CRDS = (v1alpha1.PostgresCluster, v1alpha1.PostgresBackup, PostgresPooler)
SPEC = {"version": 17, "storage": {"size": "1Gi"}}


@dataclass
class Api:
    client: Client
    namespace: str
    quiet: str
    """The namespace the operator's controllers watch: empty, so they never act on the objects here."""
    webhook: WebhookOptions
    written: dict[str, str] = field(default_factory=dict)
    """name -> resourceVersion of each object while stored in v1alpha1."""
    poolers: dict[str, str] = field(default_factory=dict)
    """name -> resourceVersion of each PostgresPooler while stored in v1alpha1."""
    manager: Manager | None = None
    task: asyncio.Task[None] | None = None
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)


async def start(api: Api, versions: Conversions) -> None:
    """The operator of the release serving ``versions``: it brings its CRDs, serves conversion, migrates."""
    api.registry = CollectorRegistry()
    options = OperatorOptions(namespace=api.quiet, leader_election=False, health_port=None, upgrade_crds=True,
                              webhook=api.webhook, versions=versions, storage_migration_rate=50)  # fmt: skip
    manager = api.manager = build_manager(api.client, options, registry=api.registry)
    task = api.task = asyncio.create_task(manager.run(handle_signals=False))

    async def ready() -> bool:
        if task.done():
            task.result()  # the manager crashed: say why
        return manager.ready()

    try:
        await eventually(ready, timeout=90)
    except NotYet as error:
        raise AssertionError(f"{error}; the operator is not ready (caches synced and conversion working)") from None


async def stop(api: Api) -> None:
    if api.manager is not None and api.task is not None:
        await api.manager.stop()
        with contextlib.suppress(asyncio.CancelledError):
            await api.task
    api.manager = api.task = None


async def _create(client: Client, kind: Kind, obj: dict[str, Any]) -> dict[str, Any]:
    """Create, riding out the 503 of a kind whose storage the API server is swapping after a CRD update
    (kubernetes#77752) and a webhook not trusted yet."""

    async def attempt() -> dict[str, Any] | None:
        try:
            return await client.create(kind, obj)
        except ApiError as error:
            if error.already_exists:
                return await client.get(kind, obj["metadata"]["name"], obj["metadata"]["namespace"])
            if error.status in (500, 503):
                return None
            raise

    return await eventually(attempt, timeout=30)


async def _read(client: Client, kind: Kind, name: str, namespace: str) -> dict[str, Any] | None:
    try:
        return await client.get(kind, name, namespace)
    except ApiError as error:
        if error.status in (500, 503):
            return None
        raise


async def _stored_versions(client: Client, expected: list[str], crd: str = CLUSTERS_CRD) -> list[str] | None:
    stored = (await client.get(CRD, crd)).get("status", {}).get("storedVersions")
    return stored if stored == expected else None


async def _all_stored_in(client: Client, version: str) -> bool:
    """Every CRD's storedVersions is ``[version]``."""
    for model in CRDS:
        if await _stored_versions(client, [version], model.resource.crd_name) is None:
            return False
    return True


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def api(control_plane: Endpoint) -> AsyncIterator[Api]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        token = secrets.token_hex(3)
        namespace, quiet = f"pg-versions-{token}", f"pg-versions-quiet-{token}"
        for name in (namespace, quiet):
            await client.create(NAMESPACE, {"metadata": {"name": name}})
        port = free_port()
        # The certificate's Secret in the namespace deleted last: the teardown's operator still needs it.
        webhook = WebhookOptions(namespace=quiet, secret="kanri-webhook", url=f"https://127.0.0.1:{port}/convert",
                                 host="127.0.0.1", port=port, check_interval=2.0)  # fmt: skip
        api = Api(client, namespace, quiet, webhook)
        # The release before: v1alpha1 alone; a cluster created through it.
        await install_postgres_crd(client)
        spec = {**SPEC, "failover": {"maxDataLossBytes": 1048576}}
        created = await _create(client, OLD, {"metadata": {"name": "before", "namespace": namespace}, "spec": spec})
        api.written["before"] = created["metadata"]["resourceVersion"]
        pooler = {"metadata": {"name": "before-pool", "namespace": namespace}, "spec": {"cluster": "before"}}
        api.poolers["before-pool"] = (await _create(client, OLD_POOLER, pooler))["metadata"]["resourceVersion"]
        try:
            yield api
        finally:
            await stop(api)
            # Back to v1alpha1 storage (this release's operator migrates back), then to v1alpha1 alone.
            with contextlib.suppress(Exception):
                await client.delete(NAMESPACE, namespace)
            await start(api, SERVED)
            await eventually(lambda: _all_stored_in(client, "v1alpha1"), timeout=120)
            await stop(api)
            await put_back_single_version_crds(client)
            await client.delete(NAMESPACE, quiet)


async def test_this_release_serves_v1beta1_beside_the_stored_v1alpha1(api: Api) -> None:
    client, ns = api.client, api.namespace
    await start(api, SERVED)
    crd = await client.get(CRD, CLUSTERS_CRD)
    versions = {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]}
    assert versions == {"v1alpha1": (True, True), "v1beta1": (True, False)}
    assert crd["metadata"]["annotations"][VERSION_ANNOTATION] == __version__
    webhook = crd["spec"]["conversion"]["webhook"]["clientConfig"]
    assert webhook["url"] == api.webhook.url
    assert webhook["caBundle"]

    # Created through v1alpha1 by the release before: read through v1beta1, its byte count a quantity.
    before = await eventually(lambda: _read(client, NEW, "before", ns), timeout=30)
    assert before["spec"]["failover"]["maxDataLoss"] == "1Mi"
    # Written through v1beta1, read through v1alpha1.
    await client.patch(NEW, "before", {"spec": {"failover": {"maxDataLoss": "32Mi"}}}, ns)
    assert (await client.get(OLD, "before", ns))["spec"]["failover"]["maxDataLossBytes"] == 32 * 1048576
    manifest = {"metadata": {"name": "after", "namespace": ns}, "spec": {**SPEC, "replication": {"maxReadLag": "64Mi"}}}
    await _create(client, NEW, manifest)
    after = await client.get(OLD, "after", ns)
    assert after["spec"]["replication"]["maxReadLagBytes"] == 64 * 1048576
    api.written["before"] = (await client.get(OLD, "before", ns))["metadata"]["resourceVersion"]
    api.written["after"] = after["metadata"]["resourceVersion"]
    listed, _ = await client.list(NEW, ns)
    assert sorted(item["metadata"]["name"] for item in listed) == ["after", "before"]

    # The PostgresPooler too: its CRD serves both versions, and an object crosses with only apiVersion changed.
    pooler_crd = await client.get(CRD, POOLERS_CRD)
    versions = {v["name"]: (v["served"], v["storage"]) for v in pooler_crd["spec"]["versions"]}
    assert versions == {"v1alpha1": (True, True), "v1beta1": (True, False)}
    pooler = await eventually(lambda: _read(client, NEW_POOLER, "before-pool", ns), timeout=30)
    assert (pooler["apiVersion"], pooler["spec"]["cluster"], pooler["spec"]["mode"]) == (
        "kanri.dev/v1beta1", "before", "transaction")  # fmt: skip
    parameters = {"default_pool_size": "20"}
    await client.patch(NEW_POOLER, "before-pool", {"spec": {"instances": 3, "parameters": parameters}}, ns)
    old_pooler = await client.get(OLD_POOLER, "before-pool", ns)
    assert (old_pooler["spec"]["instances"], old_pooler["spec"]["parameters"]) == (3, parameters)
    manifest = {"metadata": {"name": "after-pool", "namespace": ns}, "spec": {"cluster": "after", "type": "ro"}}
    await _create(client, NEW_POOLER, manifest)
    after_pool = await client.get(OLD_POOLER, "after-pool", ns)
    assert (after_pool["apiVersion"], after_pool["spec"]["type"]) == ("kanri.dev/v1alpha1", "ro")
    api.poolers["before-pool"] = old_pooler["metadata"]["resourceVersion"]
    api.poolers["after-pool"] = after_pool["metadata"]["resourceVersion"]

    # v1alpha1 is still the storage version: nothing to migrate.
    assert await _stored_versions(client, ["v1alpha1"])

    async def migration_checked() -> float | None:
        return api.registry.get_sample_value("kanri_storage_migration_stored_versions", {"crd": CLUSTERS_CRD})

    assert await eventually(migration_checked, timeout=30) == 1
    assert api.registry.get_sample_value("kanri_conversion_webhook_objects_total", {"result": "success"})


async def test_with_nobody_serving_v1alpha1_still_works_and_v1beta1_does_not(api: Api) -> None:
    client, ns = api.client, api.namespace
    await stop(api)
    assert (await client.get(OLD, "before", ns))["metadata"]["name"] == "before"
    await client.patch(OLD, "before", {"metadata": {"labels": {"down": "yes"}}}, ns)
    created = await client.create(OLD, {"metadata": {"name": "down", "namespace": ns}, "spec": SPEC})
    api.written["down"] = created["metadata"]["resourceVersion"]
    api.written["before"] = (await client.get(OLD, "before", ns))["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as failed:
        await client.get(NEW, "before", ns)
    assert failed.value.status == 500
    assert "conversion webhook" in failed.value.message
    # v1beta1 is the group's preferred version, which namespace deletion and the garbage collector read through
    # (metadata only): that fails too.
    status, text = await _metadata_list(client, NEW)
    assert (status, "conversion webhook" in text) == (500, True), (status, text)
    doomed = f"{ns}-doomed"
    await client.create(NAMESPACE, {"metadata": {"name": doomed}})
    await client.create(OLD, {"metadata": {"name": "stuck", "namespace": doomed}, "spec": SPEC})
    await client.delete(NAMESPACE, doomed)
    stalled = await eventually(lambda: _deletion_failure(client, doomed), timeout=60)
    assert "conversion webhook" in stalled, stalled


async def _metadata_list(client: Client, kind: Kind) -> tuple[int, str]:
    """A LIST of ``kind`` in every namespace as PartialObjectMetadataList: how namespace deletion and the garbage
    collector read."""
    session = client._session or client._open()
    headers = await client._headers(None)
    headers["Accept"] = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
    url = client._host + kind.path(None)
    async with session.get(url, headers=headers, server_hostname=client._connection.server_hostname) as response:
        return response.status, await response.text()


async def _deletion_failure(client: Client, namespace: str) -> str | None:
    """The message of a namespace's failed-deletion condition, once there is one."""
    conditions = (await client.get(NAMESPACE, namespace)).get("status", {}).get("conditions") or []
    failed = [f"{c['type']}: {c['message']}" for c in conditions if c["status"] == "True" and "Failure" in c["type"]]
    return "; ".join(failed) or None


async def test_the_next_release_migrates_every_object_to_v1beta1_and_prunes(api: Api) -> None:
    client, ns = api.client, api.namespace
    await start(api, POSTGRES)
    crd = await client.get(CRD, CLUSTERS_CRD)
    versions = {v["name"]: (v["served"], v["storage"]) for v in crd["spec"]["versions"]}
    assert versions == {"v1alpha1": (True, False), "v1beta1": (True, True)}
    assert await eventually(lambda: _all_stored_in(client, "v1beta1"), timeout=120)

    # Every object was rewritten since it was last written in v1alpha1, and reads the same in both versions.
    new, _ = await client.list(NEW, ns)
    assert {item["metadata"]["name"] for item in new} == set(api.written)
    for item in new:
        name = item["metadata"]["name"]
        assert item["metadata"]["resourceVersion"] != api.written[name], f"{name} was not rewritten"
    pooler_crd = await client.get(CRD, POOLERS_CRD)
    assert {v["name"]: v["storage"] for v in pooler_crd["spec"]["versions"]} == {"v1alpha1": False, "v1beta1": True}
    poolers, _ = await client.list(NEW_POOLER, ns)
    assert {item["metadata"]["name"] for item in poolers} == set(api.poolers)
    for item in poolers:
        name = item["metadata"]["name"]
        assert item["metadata"]["resourceVersion"] != api.poolers[name], f"pooler {name} was not rewritten"
    migrated = api.registry.get_sample_value(
        "kanri_storage_migration_objects_total", {"crd": CLUSTERS_CRD, "result": "migrated"}
    )
    assert migrated is not None
    assert migrated >= len(api.written)
    # The Event follows the pruning of storedVersions.
    message = await eventually(lambda: _migrated_event(client), timeout=30)
    assert "storedVersions was v1alpha1, v1beta1" in message, message

    # A restarted operator finds nothing to do and writes nothing.
    await stop(api)
    await start(api, POSTGRES)

    async def migration_checked() -> float | None:
        return api.registry.get_sample_value("kanri_storage_migration_stored_versions", {"crd": CLUSTERS_CRD})

    assert await eventually(migration_checked, timeout=30) == 1
    for result in ("migrated", "current"):
        labels = {"crd": CLUSTERS_CRD, "result": result}
        assert not api.registry.get_sample_value("kanri_storage_migration_objects_total", labels)


async def _migrated_event(client: Client) -> str | None:
    recorded, _ = await client.list(EVENT, "default", field_selector=f"involvedObject.name={CLUSTERS_CRD}")
    messages = [e["message"] for e in recorded if e["reason"] == "StorageMigrated" and " to v1beta1 " in e["message"]]
    return messages[-1] if messages else None


async def test_with_nobody_serving_after_the_migration_v1beta1_works_and_v1alpha1_does_not(api: Api) -> None:
    client, ns = api.client, api.namespace
    await stop(api)
    assert (await client.get(NEW, "before", ns))["spec"]["failover"]["maxDataLoss"] == "32Mi"
    await client.patch(NEW, "before", {"metadata": {"labels": {"down": "again"}}}, ns)
    with pytest.raises(ApiError) as failed:
        await client.get(OLD, "before", ns)
    assert failed.value.status == 500
    assert "conversion webhook" in failed.value.message
    assert (await client.get(NEW_POOLER, "before-pool", ns))["spec"]["instances"] == 3  # stored in v1beta1
    with pytest.raises(ApiError) as failed:
        await client.get(OLD_POOLER, "before-pool", ns)
    assert failed.value.status == 500
    # v1beta1, the preferred version, is stored now: metadata-only reads and namespace deletion need no conversion.
    status, text = await _metadata_list(client, NEW)
    assert status == 200, text
    doomed = f"{ns}-doomed-too"
    await client.create(NAMESPACE, {"metadata": {"name": doomed}})
    await client.create(NEW, {"metadata": {"name": "gone", "namespace": doomed}, "spec": SPEC})
    await client.delete(NAMESPACE, doomed)
    await eventually(lambda: _namespace_gone(client, doomed), timeout=60)


async def _namespace_gone(client: Client, namespace: str) -> bool:
    try:
        await client.get(NAMESPACE, namespace)
    except ApiError as error:
        if error.not_found:
            return True
        raise
    return False
