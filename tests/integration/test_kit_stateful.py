"""The stateful example (examples/stateful: a KeyValueStore operator built from kanri.kit) on the real API server."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from examples.stateful.api import APPROVE_REMOVAL, KIND, ROTATE, ROTATED, KeyValueStore
from examples.stateful.operator import controller
from kanri.local import Endpoint
from kanri.runtime import ApiError, Client, Manager, ManagerOptions, get_condition, install_crd
from kanri.runtime.kinds import CONFIG_MAP, EVENT, SECRET
from tests.support import eventually

Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def client(control_plane: Endpoint) -> AsyncIterator[Client]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as c:
        await install_crd(c, KeyValueStore, field_manager="kit-tests")
        yield c


@contextlib.asynccontextmanager
async def operator(client: Client, namespace: str) -> AsyncIterator[CollectorRegistry]:
    registry = CollectorRegistry()
    options = ManagerOptions(name="keyvaluestore-operator", namespace=namespace, leader_election=False,
                             health_port=0, graceful_shutdown_timeout=10)  # fmt: skip
    manager = Manager(client, options, registry=registry)
    manager.add(controller(manager, registry=registry))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        yield registry
    finally:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


def reconciles(registry: CollectorRegistry) -> float:
    labels = [{"controller": "keyvaluestore", "result": result} for result in ("success", "requeue_after")]
    return sum(registry.get_sample_value("controller_runtime_reconcile_total", x) or 0.0 for x in labels)


async def look_again(client: Client, registry: CollectorRegistry, namespace: str, patch: Obj) -> Obj:
    """Patch the store's metadata and return once a reconcile finished after it (its writes have landed then)."""
    before = reconciles(registry)
    patched = await client.patch(KIND, "kv", {"metadata": patch}, namespace)

    async def looked() -> bool:
        return reconciles(registry) > before

    await eventually(looked, timeout=30)
    return patched


async def ready(client: Client, namespace: str, name: str, reason: str = "Published") -> Obj | None:
    store = await client.get(KIND, name, namespace)
    status = store.get("status") or {}
    condition = get_condition(status.get("conditions"), "Ready") or {}
    current = status.get("observedGeneration") == store["metadata"]["generation"]
    return store if current and condition.get("reason") == reason else None


def key_of(secret: Obj) -> str:
    return base64.b64decode(secret["data"]["key"]).decode()


async def test_a_store_converges_and_a_converged_store_costs_no_write(client: Client, namespace: str) -> None:
    await client.create(KIND, {"metadata": {"name": "kv", "namespace": namespace}, "spec": {"data": {"a": "1"}}})
    async with operator(client, namespace) as registry:
        store = await eventually(lambda: ready(client, namespace, "kv"), timeout=60)
        assert store["status"]["keys"] == 1
        assert store["metadata"]["finalizers"] == ["example.kanri.dev/cleanup"]
        assert get_condition(store["status"]["conditions"], "Degraded")["status"] == "False"  # type: ignore[index]
        assert (await client.get(CONFIG_MAP, "kv-data", namespace))["data"] == {"a": "1"}
        secret = await client.get(SECRET, "kv-key", namespace)
        assert not secret["metadata"].get("ownerReferences")  # kept data: deletionPolicy decides, not the collector
        data = await client.get(CONFIG_MAP, "kv-data", namespace)
        # another look at the converged store (a label change queues it): nothing is written
        touched = await look_again(client, registry, namespace, {"labels": {"look": "again"}})
        after = await client.get(KIND, "kv", namespace)
        assert after["metadata"]["resourceVersion"] == touched["metadata"]["resourceVersion"]
        again = await client.get(CONFIG_MAP, "kv-data", namespace)
        assert again["metadata"]["resourceVersion"] == data["metadata"]["resourceVersion"]
        assert (await client.get(SECRET, "kv-key", namespace))["metadata"]["resourceVersion"] == (
            secret["metadata"]["resourceVersion"])  # fmt: skip


async def test_removing_keys_waits_for_an_approval_that_names_them(client: Client, namespace: str) -> None:
    spec = {"data": {"a": "1", "b": "2", "c": "3"}}
    await client.create(KIND, {"metadata": {"name": "kv", "namespace": namespace}, "spec": spec})
    async with operator(client, namespace) as registry:
        await eventually(lambda: ready(client, namespace, "kv"), timeout=60)
        await client.patch(KIND, "kv", {"spec": {"data": {"a": "1", "b": None, "c": None}}}, namespace)
        waiting = await eventually(lambda: ready(client, namespace, "kv", "ApprovalRequired"), timeout=30)
        message = get_condition(waiting["status"]["conditions"], "Ready")["message"]  # type: ignore[index]
        assert "b, c" in message
        assert (await client.get(CONFIG_MAP, "kv-data", namespace))["data"] == spec["data"]  # nothing removed yet
        # an approval of something else approves nothing
        await look_again(client, registry, namespace, {"annotations": {APPROVE_REMOVAL: "b at generation 2"}})
        assert (await client.get(CONFIG_MAP, "kv-data", namespace))["data"] == spec["data"]
        subject = f"b,c at generation {waiting['metadata']['generation']}"
        await client.patch(KIND, "kv", {"metadata": {"annotations": {APPROVE_REMOVAL: subject}}}, namespace)
        done = await eventually(lambda: ready(client, namespace, "kv"), timeout=30)
        assert done["status"]["requests"]["approve-removal"]["value"] == subject
        assert (await client.get(CONFIG_MAP, "kv-data", namespace))["data"] == {"a": "1"}


async def test_a_rotation_request_is_carried_out_once_and_acknowledged(client: Client, namespace: str) -> None:
    await client.create(KIND, {"metadata": {"name": "kv", "namespace": namespace}, "spec": {"data": {}}})
    async with operator(client, namespace) as registry:
        await eventually(lambda: ready(client, namespace, "kv"), timeout=60)
        first = key_of(await client.get(SECRET, "kv-key", namespace))
        await client.patch(KIND, "kv", {"metadata": {"annotations": {ROTATE: "one"}}}, namespace)

        async def acknowledged() -> Obj | None:
            store = await client.get(KIND, "kv", namespace)
            status = store.get("status") or {}
            handled = (status.get("requests") or {}).get("rotate-key") or {}
            return store if handled.get("value") == "one" and "rotation" not in status else None

        await eventually(acknowledged, timeout=30)
        secret = await client.get(SECRET, "kv-key", namespace)
        assert secret["metadata"]["annotations"][ROTATED] == "one"
        assert key_of(secret) != first
        # the same request seen again (any later pass) changes nothing
        await look_again(client, registry, namespace, {"labels": {"look": "again"}})
        assert (await client.get(SECRET, "kv-key", namespace))["metadata"]["resourceVersion"] == (
            secret["metadata"]["resourceVersion"])  # fmt: skip
        events, _ = await client.list(EVENT, namespace)
        assert [e["reason"] for e in events].count("KeyRotated") == 1


async def test_deletion_retains_the_key_for_a_new_store_or_deletes_it(client: Client, namespace: str) -> None:
    for name, policy in (("kept", "Retain"), ("gone", "Delete")):
        body = {"metadata": {"name": name, "namespace": namespace}, "spec": {"deletionPolicy": policy}}
        await client.create(KIND, body)
    async with operator(client, namespace):
        for name in ("kept", "gone"):
            await eventually(lambda n=name: ready(client, namespace, n), timeout=60)  # type: ignore[misc]
        key = key_of(await client.get(SECRET, "kept-key", namespace))
        for name in ("kept", "gone"):
            await client.delete(KIND, name, namespace)

        async def deleted(name: str) -> bool:
            try:
                await client.get(KIND, name, namespace)
            except ApiError as exc:
                return exc.not_found
            return False

        await eventually(lambda: deleted("kept"), timeout=30)
        await eventually(lambda: deleted("gone"), timeout=30)
        assert key_of(await client.get(SECRET, "kept-key", namespace)) == key
        with pytest.raises(ApiError) as missing:
            await client.get(SECRET, "gone-key", namespace)
        assert missing.value.not_found  # deletionPolicy Delete
        # a new store of the kept name adopts its key
        await client.create(KIND, {"metadata": {"name": "kept", "namespace": namespace}, "spec": {}})
        await eventually(lambda: ready(client, namespace, "kept"), timeout=60)
        assert key_of(await client.get(SECRET, "kept-key", namespace)) == key


async def test_a_refused_child_shows_as_degraded_with_one_warning(client: Client, namespace: str) -> None:
    body = {"metadata": {"name": "kv", "namespace": namespace}, "spec": {"data": {"no spaces allowed": "x"}}}
    await client.create(KIND, body)
    async with operator(client, namespace):
        store = await eventually(lambda: ready(client, namespace, "kv", "NotPublished"), timeout=60)
        degraded = get_condition(store["status"]["conditions"], "Degraded") or {}
        assert (degraded.get("status"), degraded.get("reason")) == ("True", "ChildRejected")

        async def warnings() -> list[Obj]:
            events, _ = await client.list(EVENT, namespace)
            return [e for e in events if e["reason"] == "ChildRejected"]

        found = await eventually(warnings, timeout=30)
        assert len(found) == 1
        assert found[0]["type"] == "Warning"
        assert "ConfigMap kv-data" in found[0]["message"]


async def test_a_rotation_on_record_is_finished_by_a_restarted_operator(client: Client, namespace: str) -> None:
    await client.create(KIND, {"metadata": {"name": "kv", "namespace": namespace}, "spec": {"data": {}}})
    async with operator(client, namespace):
        await eventually(lambda: ready(client, namespace, "kv"), timeout=60)
    first = key_of(await client.get(SECRET, "kv-key", namespace))
    # what an operator stopped right after committing the record leaves behind
    await client.patch(KIND, "kv", {"metadata": {"annotations": {ROTATE: "two"}}}, namespace)
    await client.patch_status(KIND, "kv", {"status": {"rotation": {"request": "two", "phase": "Rotating"}}}, namespace)
    async with operator(client, namespace):

        async def finished() -> Obj | None:
            status = (await client.get(KIND, "kv", namespace)).get("status") or {}
            done = ((status.get("requests") or {}).get("rotate-key") or {}).get("value") == "two"
            return status if done and "rotation" not in status else None

        await eventually(finished, timeout=30)
    secret = await client.get(SECRET, "kv-key", namespace)
    assert secret["metadata"]["annotations"][ROTATED] == "two"
    assert key_of(secret) != first
