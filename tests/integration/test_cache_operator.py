"""The Cache operator on the real API server (no nodes, so no pod runs): it writes its children, reports that no
primary answers yet, and deletionPolicy keeps or deletes the password Secret."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry
from typer.testing import CliRunner

from kanri.cache.api import KIND, Cache
from kanri.cache.operator import controller
from kanri.cli.main import app
from kanri.local.controlplane import Endpoint
from kanri.runtime import ApiError, Client, Manager, ManagerOptions, get_condition, install_crd
from kanri.runtime.kinds import CONFIG_MAP, PERSISTENT_VOLUME, SECRET, SERVICE, STATEFUL_SET
from tests.integration.test_kafka_volumes import claims_bound, grown, storage_class, volume_for
from tests.support import eventually, exists

DURABLE: dict[str, Any] = {"dataPolicy": "Durable", "replicas": 3, "storage": {"size": "1Gi"}}


@pytest.fixture
def registry() -> CollectorRegistry:
    """The operator's metrics, read to count its passes."""
    return CollectorRegistry()


@pytest_asyncio.fixture(loop_scope="session")
async def operator(control_plane: Endpoint, namespace: str, registry: CollectorRegistry) -> AsyncIterator[Client]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        await install_crd(client, Cache, field_manager="kanri-tests")
        options = ManagerOptions(name="cache-operator", namespace=namespace, leader_election=False, health_port=None)
        manager = Manager(client, options, registry=registry)
        manager.add(controller(manager))
        task = asyncio.create_task(manager.run(handle_signals=False))
        try:
            yield client
        finally:
            manager.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 20)


def passes(registry: CollectorRegistry) -> float:
    """Reconciles the cache controller finished (it looks again every 5 s while no primary answers)."""
    labels = [{"controller": "cache", "result": result} for result in ("success", "requeue_after")]
    return sum(registry.get_sample_value("controller_runtime_reconcile_total", x) or 0.0 for x in labels)


async def test_children_are_written_and_no_primary_is_reported(
    operator: Client, namespace: str, registry: CollectorRegistry
) -> None:
    client = operator
    await client.create(KIND, {"metadata": {"name": "orders", "namespace": namespace}, "spec": DURABLE})

    async def reported() -> dict[str, Any] | None:
        status = (await client.get(KIND, "orders", namespace)).get("status") or {}
        ready = get_condition(status.get("conditions"), "Ready")
        return status if ready is not None and ready["reason"] == "NoPrimary" else None

    status = await eventually(reported, timeout=30)
    assert status["writablePrimaries"] == []
    sts = await client.get(STATEFUL_SET, "orders", namespace)
    assert sts["spec"]["replicas"] == 3
    assert sts["spec"]["updateStrategy"] == {"type": "OnDelete"}, "the operator, not the controller, replaces pods"
    updating = get_condition(status["conditions"], "Updating")
    assert updating is not None
    assert updating["status"] == "False", updating
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
    config = await client.get(CONFIG_MAP, "orders-config", namespace)
    assert "min-replicas-to-write 1" in config["data"]["valkey.conf"]
    for service in ("orders-hl", "orders-rw", "orders-ro", "orders-sentinel"):
        assert await exists(client, SERVICE, service, namespace), service
    secret = await client.get(SECRET, "orders-password", namespace)
    assert not secret["metadata"].get("ownerReferences"), "the password is deletionPolicy's, not the GC's"
    versions = {kind.kind: (await client.get(kind, name, namespace))["metadata"]["resourceVersion"]
                for kind, name in ((STATEFUL_SET, "orders"), (CONFIG_MAP, "orders-config"))}  # fmt: skip
    # two more whole passes over the converged cache (it looks again every 5 s): nothing is rewritten
    seen = passes(registry)

    async def two_more() -> float | None:
        now = passes(registry)
        return now if now >= seen + 2 else None

    await eventually(two_more, timeout=60)
    for kind, name in ((STATEFUL_SET, "orders"), (CONFIG_MAP, "orders-config")):
        assert (await client.get(kind, name, namespace))["metadata"]["resourceVersion"] == versions[kind.kind]


async def test_delete_policy_deletes_the_password_and_retain_keeps_it(operator: Client, namespace: str) -> None:
    client = operator
    for name, policy in (("kept", "Retain"), ("gone", "Delete")):
        spec = {"dataPolicy": "Regenerable", "replicas": 1, "deletionPolicy": policy}
        await client.create(KIND, {"metadata": {"name": name, "namespace": namespace}, "spec": spec})
    for name in ("kept", "gone"):
        await eventually(lambda n=name: exists(client, SECRET, f"{n}-password", namespace), timeout=30)  # type: ignore[misc]
        await client.delete(KIND, name, namespace)

    async def settled() -> bool:
        caches_gone = not await exists(client, KIND, "kept", namespace) and not await exists(client, KIND, "gone",
                                                                                             namespace)  # fmt: skip
        return caches_gone and not await exists(client, SECRET, "gone-password", namespace)

    await eventually(settled, timeout=30)
    assert await exists(client, SECRET, "kept-password", namespace)


async def test_kanri_status_shows_the_cache(operator: Client, namespace: str, control_plane: Endpoint) -> None:
    client = operator
    spec = {"dataPolicy": "Regenerable", "replicas": 2, "deletionPolicy": "Delete"}
    await client.create(KIND, {"metadata": {"name": "shown", "namespace": namespace}, "spec": spec})

    async def reported() -> bool:
        status = (await client.get(KIND, "shown", namespace)).get("status") or {}
        return get_condition(status.get("conditions"), "Updating") is not None

    await eventually(reported, timeout=30)
    args = ["status", "cache/shown", "-n", namespace, "--kubeconfig", str(control_plane.kubeconfig)]
    result = await asyncio.to_thread(CliRunner().invoke, app, args, env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    assert f"Cache {namespace}/shown" in result.output
    assert "Regenerable: in memory only" in result.output
    for service in ("shown-hl", "shown-rw", "shown-ro", "shown-sentinel"):
        assert service in result.output
    assert "NoPrimary" in result.output
    missing = await asyncio.to_thread(CliRunner().invoke, app, [*args[:1], "cache/nope", *args[2:]])
    assert missing.exit_code == 1
    assert f"Cache {namespace}/nope not found" in missing.output


async def test_a_bigger_volume_grows_the_claims_and_the_statefulset_stays_writable(
    operator: Client, namespace: str
) -> None:
    """The claim template cannot change (the API server would refuse the whole StatefulSet): the claims are grown
    and a change in the same edit (a fourth pod) still lands."""
    client = operator
    await storage_class(client, "kanri-test-expands", True)
    names = [f"data-grow-{n}" for n in range(3)]
    for name in names:
        await volume_for(client, namespace, name, "kanri-test-expands")
    spec = DURABLE | {"storage": {"size": "1Gi", "storageClassName": "kanri-test-expands"}}
    await client.create(KIND, {"metadata": {"name": "grow", "namespace": namespace}, "spec": spec})
    await eventually(lambda: claims_bound(client, namespace, names), timeout=60)
    await client.patch(KIND, "grow", {"spec": {"replicas": 4, "storage": {"size": "2Gi"}}}, namespace)

    async def four_pods() -> dict[str, Any] | None:
        sts = await client.get(STATEFUL_SET, "grow", namespace)
        return sts if sts["spec"]["replicas"] == 4 else None

    sts = await eventually(four_pods, timeout=30)
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "1Gi"
    await eventually(lambda: grown(client, namespace, names, "2Gi"), timeout=30)

    async def resizing() -> list[str] | None:
        return ((await client.get(KIND, "grow", namespace)).get("status") or {}).get("resizingVolumes")

    assert await eventually(resizing, timeout=30) == names
    for name in names:
        with contextlib.suppress(ApiError):
            await client.delete(PERSISTENT_VOLUME, f"pv-{namespace}-{name}"[:63])
