"""Storage migration on the real kube-apiserver: Greeting objects stored in v1alpha1, the CRD switched to v1
storage, every object rewritten (rate-limited, resumable), ``status.storedVersions`` pruned to ``["v1"]``.

The Greeting example's models and conversion, under a group of this module's own (``migration.kanri.dev``) so the
session's shared Greeting CRD is never switched under another module. One CRD and one conversion webhook serve the
whole module; the tests run in order (the first interrupts a migration that the second resumes).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from examples.greeting.api import Greeting
from examples.greeting.versions import GreetingV1Alpha1, from_v1, to_v1
from kanri.local import Endpoint
from kanri.local.ports import free_port
from kanri.postgres.api import v1beta1
from kanri.postgres.api.conversion import (
    DEPRECATION_WARNING,
    PostgresClusterV1Alpha1,
    cluster_from_v1beta1,
    cluster_to_v1beta1,
)
from kanri.runtime import (
    ApiError,
    Client,
    Conversion,
    Conversions,
    ConversionWebhook,
    EventRecorder,
    Kind,
    StorageMigration,
    WebhookOptions,
    crd_for,
    install_crd,
)
from kanri.runtime.kinds import CRD, EVENT, NAMESPACE
from tests.support import NotYet, eventually

GROUP = "migration.kanri.dev"
OBJECTS = 24


class MigrationGreeting(Greeting, group=GROUP, version="v1", kind="Greeting", plural="greetings"):
    """Greeting v1 (the hub) in this module's group."""


class MigrationGreetingV1Alpha1(GreetingV1Alpha1, group=GROUP, version="v1alpha1", kind="Greeting",
                                plural="greetings", storage=False):  # fmt: skip
    """Greeting v1alpha1 in this module's group."""


V1 = MigrationGreeting.resource.api_kind
V1ALPHA1 = MigrationGreetingV1Alpha1.resource.api_kind
CRD_NAME = MigrationGreeting.resource.crd_name
GREETINGS = Conversion(MigrationGreeting)
GREETINGS.spoke(MigrationGreetingV1Alpha1, to_hub=to_v1, from_hub=from_v1)  # type: ignore[arg-type]


@dataclass
class Cluster:
    client: Client
    namespace: str
    crd: dict[str, Any]
    written_in_v1alpha1: dict[str, str]  # name -> resourceVersion when created (stored in v1alpha1)


def _with_storage(crd: dict[str, Any], version: str) -> dict[str, Any]:
    for entry in crd["spec"]["versions"]:
        entry["storage"] = entry["name"] == version
    return crd


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def cluster(control_plane: Endpoint) -> AsyncIterator[Cluster]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        namespace = f"migration-{secrets.token_hex(3)}"
        await client.create(NAMESPACE, {"metadata": {"name": namespace}})
        port = free_port()
        options = WebhookOptions(namespace=namespace, secret="migration-webhook", host="127.0.0.1", port=port,
                                 url=f"https://127.0.0.1:{port}/convert", check_interval=2.0)  # fmt: skip
        # First the old operator's CRD: v1alpha1 is the storage version.
        crd = _with_storage(crd_for(*GREETINGS.resources, webhook=options.client_config()), "v1alpha1")
        await install_crd(client, crd, field_manager="migration-tests")
        webhook = ConversionWebhook(client, Conversions(GREETINGS), options, registry=CollectorRegistry())
        serving = asyncio.create_task(webhook.run())
        try:
            written = {}
            for index in range(OBJECTS):
                created = await _create(client, {"metadata": {"name": f"g{index:02}", "namespace": namespace},
                                                 "spec": {"text": f"hello {index}"}})  # fmt: skip
                written[created["metadata"]["name"]] = created["metadata"]["resourceVersion"]
            # The upgrade: v1 becomes the storage version; the objects stay stored in v1alpha1 until rewritten.
            current = await client.get(CRD, CRD_NAME)
            await client.replace(CRD, _with_storage(current, "v1"))
            await eventually(lambda: _stored_versions(client, ["v1alpha1", "v1"]), timeout=30)
            try:
                await eventually(lambda: _readable_in_v1(client, namespace), timeout=60)
            except NotYet as error:
                raise AssertionError(f"{error}; the webhook's last problem: {webhook.last_problem}") from None
            yield Cluster(client, namespace, crd, written)
        finally:
            serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await serving
            await client.delete(NAMESPACE, namespace)
            await client.delete(CRD, CRD_NAME)


async def _create(client: Client, obj: dict[str, Any]) -> dict[str, Any]:
    """Create through v1alpha1. Each update of the CRD (the webhook patching in its caBundle) replaces the API
    server's storage for the kind, and a request meeting the old one is answered 503 (kubernetes#77752): retry."""

    async def attempt() -> dict[str, Any] | None:
        try:
            return await client.create(V1ALPHA1, obj)
        except ApiError as error:
            if error.already_exists:
                return await client.get(V1ALPHA1, obj["metadata"]["name"], obj["metadata"]["namespace"])
            if error.status == 503:
                return None
            raise

    return await eventually(attempt, timeout=30)


async def _stored_versions(client: Client, expected: list[str]) -> list[str] | None:
    stored = (await client.get(CRD, CRD_NAME)).get("status", {}).get("storedVersions")
    return stored if sorted(stored or []) == sorted(expected) else None


async def _readable_in_v1(client: Client, namespace: str) -> dict[str, Any] | None:
    try:
        return await client.get(V1, "g00", namespace)  # stored in v1alpha1: converted by the webhook
    except ApiError:
        return None  # the webhook is not trusted yet (its CA bundle is still being patched into the CRD)


def _count(registry: CollectorRegistry, result: str) -> float:
    value = registry.get_sample_value("kanri_storage_migration_objects_total", {"crd": CRD_NAME, "result": result})
    return value or 0.0


async def test_an_interrupted_migration_leaves_stored_versions_alone(cluster: Cluster) -> None:
    registry = CollectorRegistry()
    migration = StorageMigration(cluster.client, CRD_NAME, registry=registry, rate=10, page_size=5)
    task = asyncio.create_task(migration.migrate())

    async def some_migrated() -> bool:
        return _count(registry, "migrated") >= 6

    await eventually(some_migrated, timeout=30)
    task.cancel()  # the operator stops (an upgrade, a lost lease) in the middle
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert 6 <= _count(registry, "migrated") < OBJECTS
    assert await _stored_versions(cluster.client, ["v1alpha1", "v1"]), "pruned although objects are left"


async def test_the_next_run_resumes_rewrites_the_rest_at_its_rate_and_prunes(cluster: Cluster) -> None:
    client, registry = cluster.client, CollectorRegistry()
    events = EventRecorder(client, component="migration-tests")
    rate = 20.0
    migration = StorageMigration(client, CRD_NAME, registry=registry, events=events, rate=rate, page_size=5)
    started = time.monotonic()
    result = await migration.migrate()
    elapsed = time.monotonic() - started

    # Each object was written once: those the first run rewrote are current now (the API server wrote nothing).
    assert result.current >= 6
    assert result.migrated + result.current == OBJECTS
    assert (result.gone, result.conflicts) == (0, 0)
    assert elapsed >= (OBJECTS - 1) / rate * 0.9, f"{OBJECTS} writes in {elapsed:.2f} s exceed {rate}/s"
    crd = await client.get(CRD, CRD_NAME)
    assert crd["status"]["storedVersions"] == ["v1"]
    assert registry.get_sample_value("kanri_storage_migration_stored_versions", {"crd": CRD_NAME}) == 1
    assert _count(registry, "migrated") == result.migrated

    # Every object was rewritten since it was created in v1alpha1, and reads the same in both versions.
    new, _ = await client.list(V1, cluster.namespace)
    old, _ = await client.list(V1ALPHA1, cluster.namespace)
    assert len(new) == len(old) == OBJECTS
    for item in new:
        assert item["metadata"]["resourceVersion"] != cluster.written_in_v1alpha1[item["metadata"]["name"]]
    assert sorted(i["spec"]["message"] for i in new) == sorted(i["spec"]["text"] for i in old)

    recorded, _ = await client.list(EVENT, "default", field_selector=f"involvedObject.name={CRD_NAME}")
    (event,) = [e for e in recorded if e["reason"] == "StorageMigrated"]
    assert f"{result.migrated} object(s) rewritten" in event["message"]
    assert "storedVersions was v1alpha1, v1" in event["message"]

    # Idempotent: run again (a restarted operator) and nothing is written.
    again = await StorageMigration(client, CRD_NAME, registry=CollectorRegistry()).migrate()
    assert not again.needed
    assert again.migrated == again.current == 0


async def test_a_crd_that_never_changed_storage_needs_nothing(cluster: Cluster) -> None:
    result = await StorageMigration(cluster.client, CRD_NAME, registry=CollectorRegistry()).migrate()
    assert (result.storage_version, result.stored_before, result.needed) == ("v1", ("v1",), False)


# --- the PostgresCluster CRD the next session switches to (served here under this module's group) --------------


class MigrationPostgresCluster(v1beta1.PostgresCluster, group=GROUP, version="v1beta1", kind="PostgresCluster",
                               plural="postgresclusters"):  # fmt: skip
    """PostgresCluster v1beta1 in this module's group."""


class MigrationPostgresClusterV1Alpha1(PostgresClusterV1Alpha1, group=GROUP, version="v1alpha1",
                                       kind="PostgresCluster", plural="postgresclusters", storage=False,
                                       deprecation_warning=DEPRECATION_WARNING):  # fmt: skip
    """PostgresCluster v1alpha1 in this module's group."""


async def test_the_two_version_postgrescluster_crd_is_served_and_its_rules_hold(cluster: Cluster) -> None:
    client, namespace = cluster.client, cluster.namespace
    clusters = Conversion(MigrationPostgresCluster)
    clusters.spoke(MigrationPostgresClusterV1Alpha1, to_hub=cluster_to_v1beta1, from_hub=cluster_from_v1beta1)  # type: ignore[arg-type]
    port = free_port()
    options = WebhookOptions(namespace=namespace, secret="pg-webhook", host="127.0.0.1", port=port,
                             url=f"https://127.0.0.1:{port}/convert", check_interval=2.0)  # fmt: skip
    crd = crd_for(*clusters.resources, webhook=options.client_config())
    await install_crd(client, crd, field_manager="migration-tests")  # the API server compiles every CEL rule
    webhook = ConversionWebhook(client, Conversions(clusters), options, registry=CollectorRegistry())
    serving = asyncio.create_task(webhook.run())
    new = MigrationPostgresCluster.resource.api_kind
    old = MigrationPostgresClusterV1Alpha1.resource.api_kind
    try:
        spec = {"version": 17, "storage": {"size": "1Gi"}, "failover": {"maxDataLossBytes": 1048576},
                "replication": {"maxReadLagBytes": 33554432}}  # fmt: skip
        manifest = {"metadata": {"name": "db", "namespace": namespace}, "spec": spec}
        created = await eventually(lambda: _create_in(client, old, manifest), timeout=60)
        assert created["spec"]["failover"]["maxDataLossBytes"] == 1048576
        stored = await client.get(new, "db", namespace)
        assert stored["spec"]["failover"] == {"policy": "Automatic", "maxDataLoss": "1Mi", "delaySeconds": 0}
        assert stored["spec"]["replication"] == {"mode": "Async", "maxReadLag": "32Mi"}
        for loss in ("1500m", "16Ei"):
            bad = {"metadata": {"name": f"bad-{loss.lower()}", "namespace": namespace},
                   "spec": {"version": 17, "storage": {"size": "1Gi"}, "failover": {"maxDataLoss": loss}}}  # fmt: skip
            with pytest.raises(ApiError) as refused:
                await client.create(new, bad)
            assert refused.value.status == 422
            assert "spec.failover.maxDataLoss: Invalid value" in refused.value.message
            assert "must be a whole number of bytes" in refused.value.message
    finally:
        serving.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        await client.delete(CRD, MigrationPostgresCluster.resource.crd_name)


async def _create_in(client: Client, kind: Kind, obj: dict[str, Any]) -> dict[str, Any] | None:
    try:
        return await client.create(kind, obj)
    except ApiError as error:
        if error.already_exists:
            return await client.get(kind, obj["metadata"]["name"], obj["metadata"]["namespace"])
        if error.status in (404, 500, 503):  # the kind not served yet, or the webhook not trusted yet
            return None
        raise
