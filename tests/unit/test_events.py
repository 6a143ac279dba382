"""The event recorder aggregates repeats, rate-limits per object, and never gets in the reconciler's way."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from typing import Any, cast

import pytest

from kanri.runtime._client import Client
from kanri.runtime._clock import FakeClock
from kanri.runtime._errors import ApiError
from kanri.runtime._events import EventRecorder
from kanri.runtime._kinds import Kind

Obj = dict[str, Any]


class FakeClient:
    """The two calls the recorder makes, recorded; ``fail`` (an exception) is raised by the next calls."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail_create: BaseException | None = None
        self.fail_patch: BaseException | None = None
        self.hang = False

    async def create(self, kind: Kind, obj: Obj) -> Obj:
        self.calls.append(("create", obj["metadata"]["name"], obj))
        await self._maybe(self.fail_create)
        return obj

    async def patch(
        self, kind: Kind, name: str, patch: Obj, namespace: str | None = None, *, patch_type: str = "merge"
    ) -> Obj:
        self.calls.append(("patch", name, patch))
        await self._maybe(self.fail_patch)
        return patch

    async def _maybe(self, error: BaseException | None) -> None:
        if self.hang:
            await asyncio.Event().wait()
        if error is not None:
            raise error

    def verbs(self) -> list[str]:
        return [verb for verb, _, _ in self.calls]


class WallClock:
    """An injectable wall clock that moves only when told."""

    def __init__(self) -> None:
        self.moment = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.moment


def pod(name: str = "db-1", uid: str = "uid-1", namespace: str | None = "ns") -> Obj:
    meta: Obj = {"name": name, "uid": uid, "resourceVersion": "7"}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta}


@pytest.fixture
def fake() -> FakeClient:
    return FakeClient()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1000.0)


@pytest.fixture
def wall() -> WallClock:
    return WallClock()


def recorder(fake: FakeClient, clock: FakeClock, wall: WallClock, **kwargs: Any) -> EventRecorder:
    return EventRecorder(cast(Client, fake), component="kanri", instance="op-0", clock=clock, now=wall, **kwargs)


async def test_the_event_describes_the_object_and_its_source(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    await recorder(fake, clock, wall).warning(pod(), "BackOff", "restarting failed container")

    [(verb, name, body)] = fake.calls
    assert verb == "create"
    assert re.fullmatch(r"db-1\.[0-9a-f]{16}", name)
    assert body["metadata"] == {"name": name, "namespace": "ns"}
    assert body["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "db-1",
        "namespace": "ns",
        "uid": "uid-1",
        "resourceVersion": "7",
    }
    assert body["type"] == "Warning"
    assert body["reason"] == "BackOff"
    assert body["message"] == "restarting failed container"
    assert body["source"] == {"component": "kanri"}
    assert body["reportingComponent"] == "kanri"
    assert body["reportingInstance"] == "op-0"
    assert body["firstTimestamp"] == body["lastTimestamp"] == "2026-03-01T12:00:00Z"
    assert body["count"] == 1


async def test_events_about_cluster_scoped_objects_go_to_the_default_namespace(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    await recorder(fake, clock, wall).normal(pod(namespace=None), "Ready", "node is ready")
    assert fake.calls[0][2]["metadata"]["namespace"] == "default"
    assert "namespace" not in fake.calls[0][2]["involvedObject"]


async def test_repeats_patch_the_count_and_last_timestamp_of_one_event(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    events = recorder(fake, clock, wall)
    for _ in range(3):
        await events.normal(pod(), "Scaled", "replicas 1 -> 3")
        clock.advance(10)
        wall.moment += timedelta(seconds=10)

    assert fake.verbs() == ["create", "patch", "patch"]
    name = fake.calls[0][1]
    assert [call[1] for call in fake.calls] == [name, name, name]
    assert fake.calls[1][2] == {"count": 2, "lastTimestamp": "2026-03-01T12:00:10Z"}
    assert fake.calls[2][2] == {"count": 3, "lastTimestamp": "2026-03-01T12:00:20Z"}


@pytest.mark.parametrize(
    "other",
    [
        (pod(), "Warning", "Scaled", "replicas 1 -> 3"),  # type
        (pod(), "Normal", "Resized", "replicas 1 -> 3"),  # reason
        (pod(), "Normal", "Scaled", "replicas 3 -> 1"),  # message
        (pod(uid="uid-2"), "Normal", "Scaled", "replicas 1 -> 3"),  # a recreated object of the same name
        (pod(name="db-2"), "Normal", "Scaled", "replicas 1 -> 3"),  # another object
    ],
)
async def test_anything_but_an_exact_repeat_is_a_new_event(
    fake: FakeClient, clock: FakeClock, wall: WallClock, other: tuple[Obj, Any, str, str]
) -> None:
    events = recorder(fake, clock, wall)
    await events.event(pod(), "Normal", "Scaled", "replicas 1 -> 3")
    await events.event(*other)
    assert fake.verbs() == ["create", "create"]
    assert fake.calls[0][1] != fake.calls[1][1]


async def test_a_repeat_ignores_the_objects_resource_version(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    events = recorder(fake, clock, wall)
    later = pod()
    later["metadata"]["resourceVersion"] = "8"
    await events.normal(pod(), "Scaled", "replicas 1 -> 3")
    await events.normal(later, "Scaled", "replicas 1 -> 3")
    assert fake.verbs() == ["create", "patch"]


async def test_a_repeat_after_the_window_starts_a_new_event(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    events = recorder(fake, clock, wall, aggregation_window=600)
    await events.normal(pod(), "Scaled", "replicas 1 -> 3")
    clock.advance(600)
    await events.normal(pod(), "Scaled", "replicas 1 -> 3")
    clock.advance(601)
    await events.normal(pod(), "Scaled", "replicas 1 -> 3")
    assert fake.verbs() == ["create", "patch", "create"]
    assert fake.calls[2][2]["count"] == 1


async def test_more_than_burst_events_about_one_object_are_dropped_and_counted(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    events = recorder(fake, clock, wall)  # client-go's defaults: burst 25, one token per 300 s
    for i in range(30):
        await events.normal(pod(), "Step", f"step {i}")
    assert len(fake.calls) == 25
    assert events.dropped == 5

    # Other objects have buckets of their own.
    await events.normal(pod(name="db-2"), "Step", "step 0")
    assert len(fake.calls) == 26

    # One token comes back every 300 s.
    clock.advance(299)
    await events.normal(pod(), "Step", "late")
    assert (len(fake.calls), events.dropped) == (26, 6)
    clock.advance(1)
    await events.normal(pod(), "Step", "late")
    await events.normal(pod(), "Step", "later")
    assert (len(fake.calls), events.dropped) == (27, 7)


async def test_a_dropped_repeat_still_counts_towards_the_events_count(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    events = recorder(fake, clock, wall, burst=1, refill_per_second=1 / 60)
    for _ in range(3):
        await events.warning(pod(), "Unhealthy", "probe failed")
    assert (fake.verbs(), events.dropped) == (["create"], 2)
    clock.advance(60)
    await events.warning(pod(), "Unhealthy", "probe failed")
    assert fake.verbs() == ["create", "patch"]
    assert fake.calls[1][2]["count"] == 4


async def test_api_errors_are_logged_and_swallowed(fake: FakeClient, clock: FakeClock, wall: WallClock) -> None:
    events = recorder(fake, clock, wall)
    fake.fail_create = ApiError(403, {"reason": "Forbidden"})
    await events.normal(pod(), "Created", "created")
    assert events.failed == 1

    # The next occurrence tries again to create the Event that never made it.
    fake.fail_create = None
    await events.normal(pod(), "Created", "created")
    assert fake.verbs() == ["create", "create"]
    assert fake.calls[1][2]["count"] == 2


async def test_bad_input_is_swallowed_too(fake: FakeClient, clock: FakeClock, wall: WallClock) -> None:
    events = recorder(fake, clock, wall)
    await events.normal({"metadata": {}}, "Created", "created")
    await events.normal(cast(Obj, None), "Created", "created")
    assert (events.failed, fake.calls) == (2, [])


async def test_a_slow_api_server_costs_at_most_the_timeout(fake: FakeClient, clock: FakeClock, wall: WallClock) -> None:
    events = recorder(fake, clock, wall, timeout=0.05)
    fake.hang = True
    async with asyncio.timeout(5):
        await events.normal(pod(), "Created", "created")
    assert events.failed == 1


async def test_the_callers_cancellation_is_not_swallowed(fake: FakeClient, clock: FakeClock, wall: WallClock) -> None:
    events = recorder(fake, clock, wall)
    fake.hang = True
    task = asyncio.create_task(events.normal(pod(), "Created", "created"))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_an_expired_event_is_created_anew(fake: FakeClient, clock: FakeClock, wall: WallClock) -> None:
    events = recorder(fake, clock, wall)
    await events.normal(pod(), "Scaled", "replicas 1 -> 3")
    fake.fail_patch = ApiError(404, {"reason": "NotFound"})
    wall.moment += timedelta(seconds=1)
    await events.normal(pod(), "Scaled", "replicas 1 -> 3")
    assert fake.verbs() == ["create", "patch", "create"]
    assert fake.calls[2][1] != fake.calls[0][1]
    assert fake.calls[2][2]["count"] == 1
    assert events.failed == 0


async def test_a_create_whose_answer_was_lost_becomes_a_patch(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    events = recorder(fake, clock, wall)
    fake.fail_create = ApiError(409, {"reason": "AlreadyExists"})
    await events.normal(pod(), "Scaled", "replicas 1 -> 3")
    assert fake.verbs() == ["create", "patch"]
    assert events.failed == 0


async def test_event_names_are_unique_even_within_one_microsecond(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    events = recorder(fake, clock, wall)
    for i in range(3):
        await events.normal(pod(), "Step", f"step {i}")
    names = [name for _, name, _ in fake.calls]
    assert len(set(names)) == 3


async def test_long_object_names_still_give_valid_event_names(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    await recorder(fake, clock, wall).normal(pod(name="a" * 250), "Created", "created")
    name = fake.calls[0][1]
    assert len(name) <= 253
    assert re.fullmatch(r"a+\.[0-9a-f]{16}", name)


async def test_a_chatty_reason_does_not_silence_another_reason_about_the_same_object(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    events = recorder(fake, clock, wall)
    for i in range(30):
        await events.normal(pod(), "PodCreated", f"pod {i}")
    assert (len(fake.calls), events.dropped) == (25, 5)

    await events.normal(pod(), "UpgradeSucceeded", "14 -> 15")
    assert len(fake.calls) == 26
    assert fake.calls[-1][2]["reason"] == "UpgradeSucceeded"


async def test_the_objects_own_ceiling_bounds_all_its_reasons_together(
    fake: FakeClient, clock: FakeClock, wall: WallClock
) -> None:
    events = recorder(fake, clock, wall, burst=3, object_burst=5, refill_per_second=1 / 60)
    for reason in ("A", "B", "C"):
        for i in range(3):
            await events.normal(pod(), reason, f"{reason} {i}")
    written = [call[2]["reason"] for call in fake.calls]
    assert written == ["A", "A", "A", "B", "B"]
    assert events.dropped == 4

    # A refused write spent no token of the other bucket: "C" still has all three of its own. The object's bucket
    # refills object_burst/burst times as fast as a reason's: one token after 36 s (60 s * 3/5).
    clock.advance(35)
    await events.normal(pod(), "C", "C early")
    assert (len(fake.calls), events.dropped) == (5, 5)
    clock.advance(1)
    await events.normal(pod(), "C", "C late")
    assert [call[2]["reason"] for call in fake.calls][-1] == "C"


def test_an_object_ceiling_below_the_per_reason_burst_is_refused(fake: FakeClient) -> None:
    with pytest.raises(ValueError, match="object_burst"):
        EventRecorder(cast(Any, fake), component="c", burst=10, object_burst=5)
