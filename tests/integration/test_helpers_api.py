"""Finalizer, ownership and event helpers against the real API server and garbage collector."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from kanri.local.controlplane import Endpoint
from kanri.runtime._client import Client, ClientMetrics
from kanri.runtime._errors import ApiError
from kanri.runtime._events import EventRecorder
from kanri.runtime._finalizers import add_finalizer, finalizer_step, has_finalizer, remove_finalizer
from kanri.runtime._kinds import CONFIG_MAP, EVENT, SERVICE_ACCOUNT
from kanri.runtime._ownership import child_name, is_controlled_by, set_owner
from tests.support import eventually, exists

Obj = dict[str, Any]
OURS = "kanri.dev/cleanup"
THEIRS = "other.example.com/protect"


@pytest.fixture
def metrics() -> ClientMetrics:
    """The client's request counters, on a registry of their own, so a test can count the requests a helper made."""
    return ClientMetrics(CollectorRegistry())


@pytest_asyncio.fixture(loop_scope="session")
async def client(control_plane: Endpoint, metrics: ClientMetrics) -> AsyncIterator[Client]:
    client = await Client.from_kubeconfig(str(control_plane.kubeconfig), metrics=metrics)
    try:
        yield client
    finally:
        await client.close()


def requests_made(metrics: ClientMetrics) -> float:
    return sum(s.value for m in metrics.requests.collect() for s in m.samples if s.name.endswith("_total"))


async def config_map(client: Client, namespace: str, name: str, **meta: Any) -> Obj:
    return await client.create(CONFIG_MAP, {"metadata": {"name": name, "namespace": namespace, **meta}})


async def gone(client: Client, name: str, namespace: str) -> bool:
    return not await exists(client, CONFIG_MAP, name, namespace)


async def test_add_and_remove_finalizer_change_the_object_and_no_ops_make_no_request(
    client: Client, metrics: ClientMetrics, namespace: str
) -> None:
    obj = await config_map(client, namespace, "guarded", finalizers=[THEIRS])
    assert finalizer_step(obj, OURS) == "add"

    obj = await add_finalizer(client, CONFIG_MAP, obj, OURS)
    assert (await client.get(CONFIG_MAP, "guarded", namespace))["metadata"]["finalizers"] == [THEIRS, OURS]
    assert finalizer_step(obj, OURS) == "apply"

    before = requests_made(metrics)
    assert await add_finalizer(client, CONFIG_MAP, obj, OURS) is obj
    assert requests_made(metrics) == before

    obj = await remove_finalizer(client, CONFIG_MAP, obj, OURS)
    assert (await client.get(CONFIG_MAP, "guarded", namespace))["metadata"]["finalizers"] == [THEIRS]
    before = requests_made(metrics)
    await remove_finalizer(client, CONFIG_MAP, obj, OURS)
    assert requests_made(metrics) == before


async def test_add_finalizer_creates_the_list_on_an_object_without_one(client: Client, namespace: str) -> None:
    obj = await config_map(client, namespace, "bare")
    obj = await add_finalizer(client, CONFIG_MAP, obj, OURS)
    assert obj["metadata"]["finalizers"] == [OURS]
    await remove_finalizer(client, CONFIG_MAP, obj, OURS)


async def test_a_stale_removal_is_a_conflict_and_keeps_the_other_controllers_finalizer(
    client: Client, namespace: str
) -> None:
    ours = await config_map(client, namespace, "shared", finalizers=[OURS])
    stale = copy.deepcopy(ours)
    # Another controller adds its finalizer meanwhile.
    theirs = await add_finalizer(client, CONFIG_MAP, ours, THEIRS)

    with pytest.raises(ApiError) as refused:
        await remove_finalizer(client, CONFIG_MAP, stale, OURS)
    assert refused.value.conflict
    assert (await client.get(CONFIG_MAP, "shared", namespace))["metadata"]["finalizers"] == [OURS, THEIRS]

    # A stale add is refused the same way.
    with pytest.raises(ApiError) as refused:
        await add_finalizer(client, CONFIG_MAP, stale, "third.example.com/x")
    assert refused.value.conflict

    # Re-read, then remove: only ours goes.
    fresh = await client.get(CONFIG_MAP, "shared", namespace)
    assert fresh["metadata"]["resourceVersion"] == theirs["metadata"]["resourceVersion"]
    done = await remove_finalizer(client, CONFIG_MAP, fresh, OURS)
    assert done["metadata"]["finalizers"] == [THEIRS]
    await remove_finalizer(client, CONFIG_MAP, done, THEIRS)


async def test_deletion_waits_for_our_cleanup_and_completes_when_the_finalizer_goes(
    client: Client, namespace: str
) -> None:
    await config_map(client, namespace, "doomed", finalizers=[OURS])
    await client.delete(CONFIG_MAP, "doomed", namespace)

    obj = await client.get(CONFIG_MAP, "doomed", namespace)
    assert finalizer_step(obj, OURS) == "cleanup"
    # The API server refuses new finalizers on an object being deleted: a validation error, not a conflict.
    with pytest.raises(ApiError) as refused:
        await add_finalizer(client, CONFIG_MAP, obj, THEIRS)
    assert refused.value.status == 422

    last = await remove_finalizer(client, CONFIG_MAP, obj, OURS)
    assert not has_finalizer(last, OURS)
    assert await eventually(lambda: gone(client, "doomed", namespace), timeout=10)


async def test_the_garbage_collector_deletes_children_of_a_deleted_owner(client: Client, namespace: str) -> None:
    owner = await config_map(client, namespace, "owner")
    child = {"metadata": {"name": child_name("owner", "settings"), "namespace": namespace}}
    set_owner(child, owner)
    created = await client.create(CONFIG_MAP, child)
    assert is_controlled_by(created, owner)

    await client.delete(CONFIG_MAP, "owner", namespace)
    assert await eventually(lambda: gone(client, "owner-settings", namespace), timeout=60)


async def events_about(client: Client, obj: Obj) -> list[Obj]:
    uid = obj["metadata"]["uid"]
    items, _ = await client.list(EVENT, obj["metadata"]["namespace"], field_selector=f"involvedObject.uid={uid}")
    return items


async def test_an_event_recorded_three_times_is_one_event_with_count_three(client: Client, namespace: str) -> None:
    obj = await config_map(client, namespace, "noisy")
    recorder = EventRecorder(client, component="kanri-test")
    for _ in range(3):
        await recorder.warning(obj, "ProbeFailed", "readiness probe failed")

    [event] = await events_about(client, obj)
    assert event["count"] == 3
    assert event["type"] == "Warning"
    assert event["reason"] == "ProbeFailed"
    assert event["message"] == "readiness probe failed"
    assert event["source"]["component"] == "kanri-test"
    assert event["reportingComponent"] == "kanri-test"
    assert event["involvedObject"]["name"] == "noisy"
    assert event["involvedObject"]["kind"] == "ConfigMap"
    assert event["metadata"]["name"].startswith("noisy.")
    assert event["firstTimestamp"] <= event["lastTimestamp"]
    assert (recorder.dropped, recorder.failed) == (0, 0)


async def test_more_than_burst_distinct_events_about_one_object_are_rate_limited(
    client: Client, namespace: str
) -> None:
    obj = await config_map(client, namespace, "chatty")
    recorder = EventRecorder(client, component="kanri-test")  # client-go's defaults: burst 25
    for i in range(30):
        await recorder.normal(obj, "Step", f"step {i}")

    assert len(await events_about(client, obj)) == 25
    assert (recorder.dropped, recorder.failed) == (5, 0)


async def test_create_subresource_posts_to_the_named_subresource(client: Client, namespace: str) -> None:
    await client.create(SERVICE_ACCOUNT, {"metadata": {"name": "robot", "namespace": namespace}})
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 600}}
    token = await client.create_subresource(SERVICE_ACCOUNT, "robot", "token", request, namespace)
    assert token["kind"] == "TokenRequest"
    assert token["status"]["token"].count(".") == 2, "a signed JWT"
