"""Leader election: the pure decisions (is the lease free? what to write?) and, on an in-memory Lease API with a fake
clock, the loops' exact timing. The real API server is exercised in tests/integration/test_leader_election.py."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kanri.runtime import _leader
from kanri.runtime._clock import FakeClock
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import Kind
from kanri.runtime._leader import (
    LeaderElector,
    LeadershipLost,
    LeaseRecord,
    Observation,
    claim,
    micro_time,
    observe,
    released,
)
from tests.support import running_task

Obj = dict[str, Any]

# --- pure decisions --------------------------------------------------------------------------------------------------

OTHER = LeaseRecord("other", 15, "2026-11-29T20:00:00.000000Z", "2026-11-29T20:00:05.000000Z", 3)


def test_micro_time_is_rfc3339_utc_with_microseconds() -> None:
    moment = datetime(2026, 11, 29, 21, 0, 0, 1234, tzinfo=timezone(timedelta(hours=1)))
    assert micro_time(moment) == "2026-11-29T20:00:00.001234Z"


def test_lease_record_reads_a_lease_spec_and_writes_it_back() -> None:
    lease = {"spec": OTHER.to_spec()}
    assert LeaseRecord.from_lease(lease) == OTHER
    assert LeaseRecord.from_lease({}) == LeaseRecord()
    assert LeaseRecord.from_lease({"spec": {"holderIdentity": None}}).holder == ""


def test_observation_clock_keeps_running_while_the_record_is_unchanged() -> None:
    first = observe(None, OTHER, 100.0)
    assert observe(first, OTHER, 107.0) == Observation(OTHER, 100.0)


def test_observation_clock_restarts_when_the_record_changes() -> None:
    first = observe(None, OTHER, 100.0)
    renewed = replace_renew(OTHER, "2026-11-29T20:00:07.000000Z")
    assert observe(first, renewed, 107.0) == Observation(renewed, 107.0)


def test_lease_held_by_another_is_free_exactly_lease_duration_after_it_was_last_seen_changing() -> None:
    seen = Observation(OTHER, 100.0)
    assert not seen.free_for("me", 114.999, fallback_duration=99)
    assert seen.free_for("me", 115.0, fallback_duration=99)


def test_remote_renew_time_is_never_compared_with_the_local_clock() -> None:
    # renewTime is years old by this machine's wall clock (skew), but the record only just changed here: still held.
    ancient = replace_renew(OTHER, "2001-01-01T00:00:00.000000Z")
    seen = observe(None, ancient, 500.0)
    assert not seen.free_for("me", 514.0, fallback_duration=15)
    assert seen.free_for("me", 515.0, fallback_duration=15)


def test_lease_without_holder_is_free_at_once() -> None:
    assert Observation(LeaseRecord("", 15), 100.0).free_for("me", 100.0, fallback_duration=15)


def test_own_lease_is_always_free_for_its_holder() -> None:
    assert Observation(replace_holder(OTHER, "me"), 100.0).free_for("me", 100.0, fallback_duration=15)


def test_record_without_duration_expires_after_the_fallback_duration() -> None:
    seen = Observation(LeaseRecord("other", 0), 100.0)
    assert not seen.free_for("me", 109.9, fallback_duration=10)
    assert seen.free_for("me", 110.0, fallback_duration=10)


def test_claiming_a_missing_lease_starts_with_zero_transitions() -> None:
    assert claim(None, "me", 15, "T1") == LeaseRecord("me", 15, "T1", "T1", 0)


def test_claiming_from_another_holder_counts_a_transition_and_restarts_acquire_time() -> None:
    assert claim(OTHER, "me", 10, "T1") == LeaseRecord("me", 10, "T1", "T1", OTHER.transitions + 1)


def test_claiming_a_released_lease_counts_a_transition() -> None:
    assert claim(LeaseRecord("", 1, "T0", "T0", 4), "me", 15, "T1").transitions == 5


def test_renewing_keeps_acquire_time_and_transitions() -> None:
    mine = replace_holder(OTHER, "me")
    assert claim(mine, "me", 15, "T9") == LeaseRecord("me", 15, OTHER.acquire_time, "T9", OTHER.transitions)


def test_released_record_has_no_holder_a_one_second_duration_and_keeps_transitions() -> None:
    assert released(replace_holder(OTHER, "me"), "T9") == LeaseRecord("", 1, "T9", "T9", OTHER.transitions)


def test_timings_that_could_let_two_leaders_overlap_are_refused() -> None:
    with pytest.raises(ValueError, match="renew_deadline < lease_duration"):
        LeaderElector(FakeLeaseApi(), namespace="ns", name="n", identity="a", lease_duration=10, renew_deadline=10)
    with pytest.raises(ValueError, match="retry_period"):
        LeaderElector(FakeLeaseApi(), namespace="ns", name="n", identity="a", renew_deadline=2, retry_period=2)
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(FakeLeaseApi(), namespace="ns", name="n", identity="")


def replace_renew(record: LeaseRecord, renew_time: str) -> LeaseRecord:
    return LeaseRecord(record.holder, record.duration, record.acquire_time, renew_time, record.transitions)


def replace_holder(record: LeaseRecord, holder: str) -> LeaseRecord:
    return LeaseRecord(holder, record.duration, record.acquire_time, record.renew_time, record.transitions)


# --- the loops, on an in-memory Lease API and a fake clock -----------------------------------------------------------


class FakeLeaseApi:
    """One Lease with the API server's optimistic concurrency: every write bumps resourceVersion; stale PUTs get 409.

    ``hang = True`` makes every request block forever (an API server that stopped answering).
    """

    def __init__(self) -> None:
        self.lease: Obj | None = None
        self.version = 0
        self.hang = False
        self.requests: list[str] = []

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        await self._arrive("GET")
        if self.lease is None:
            raise ApiError(404, {"reason": "NotFound"})
        return copy.deepcopy(self.lease)

    async def create(self, kind: Kind, obj: Obj) -> Obj:
        await self._arrive("POST")
        if self.lease is not None:
            raise ApiError(409, {"reason": "AlreadyExists"})
        return self._store(obj)

    async def replace(self, kind: Kind, obj: Obj) -> Obj:
        await self._arrive("PUT")
        if self.lease is None:
            raise ApiError(404, {"reason": "NotFound"})
        if obj["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise ApiError(409, {"reason": "Conflict", "message": "the object has been modified"})
        return self._store(obj)

    def seed(self, record: LeaseRecord) -> None:
        """The Lease exists before any candidate starts."""
        self._store({"metadata": {"name": "op", "namespace": "ns"}, "spec": record.to_spec()})

    def force(self, **spec: Any) -> None:
        """Another writer changes the Lease (bumping its resourceVersion)."""
        assert self.lease is not None
        self._store({**self.lease, "spec": {**self.lease["spec"], **spec}})

    @property
    def record(self) -> LeaseRecord:
        assert self.lease is not None
        return LeaseRecord.from_lease(self.lease)

    async def _arrive(self, method: str) -> None:
        self.requests.append(method)
        if self.hang:
            await asyncio.Event().wait()

    def _store(self, obj: Obj) -> Obj:
        self.version += 1
        self.lease = copy.deepcopy(obj)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


async def settle() -> None:
    """Let every task that can run, run (the fake API answers without real waiting)."""
    for _ in range(50):
        await asyncio.sleep(0)


async def advance(clock: FakeClock, seconds: float) -> None:
    """Move fake time forward deadline by deadline, letting woken tasks run at each step."""
    target = clock.now() + seconds
    await settle()
    while (deadline := clock.next_deadline()) is not None and deadline <= target:
        clock.advance(deadline - clock.now())
        await settle()
    clock.advance(target - clock.now())
    await settle()


class Leader:
    """A leader-only coroutine that records when it started and when it was cancelled."""

    def __init__(self, clock: FakeClock, result: Callable[[], Awaitable[None]] | None = None) -> None:
        self.clock = clock
        self.started: float | None = None
        self.cancelled: float | None = None
        self.result = result

    async def __call__(self) -> None:
        self.started = self.clock.now()
        try:
            if self.result is not None:
                await self.result()
                return
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled = self.clock.now()
            raise


@pytest.fixture(autouse=True)
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    # Candidates retry exactly every retry_period, so acquisition times are exact.
    monkeypatch.setattr(_leader, "_jittered", lambda period: period)


def elector(api: FakeLeaseApi, clock: FakeClock, identity: str = "a", **kwargs: Any) -> LeaderElector:
    return LeaderElector(api, namespace="ns", name="op", identity=identity, clock=clock, **kwargs)


def running(
    candidate: LeaderElector, lead: Callable[[], Awaitable[None]]
) -> AbstractAsyncContextManager[asyncio.Task[None]]:
    return running_task(candidate.run(lead))


async def test_first_candidate_creates_the_lease_and_leads_at_once() -> None:
    async with asyncio.timeout(5):
        api, clock, registry, changes = FakeLeaseApi(), FakeClock(), CollectorRegistry(), list[bool]()
        a = elector(api, clock, registry=registry, on_change=changes.append)
        lead = Leader(clock)
        async with running(a, lead):
            await settle()
            assert lead.started == 0.0
            assert a.is_leader
            assert a.leader == "a"
            assert api.record.holder == "a"
            assert api.record.duration == 15
            assert api.record.transitions == 0
            assert api.record.acquire_time == api.record.renew_time
            assert registry.get_sample_value("leader_election_master_status", {"name": "op"}) == 1
            assert changes == [True]


async def test_leader_renews_every_retry_period_keeping_acquire_time() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()
        async with running(elector(api, clock), Leader(clock)):
            await settle()
            acquired = api.record
            api.requests.clear()
            await advance(clock, 6.0)
            # The fast path: one PUT per renewal, no reads.
            assert api.requests == ["PUT", "PUT", "PUT"]
            assert api.record.acquire_time == acquired.acquire_time
            assert api.record.transitions == acquired.transitions
            assert api.record.holder == "a"


async def test_candidate_acquires_a_silent_lease_lease_duration_after_it_first_saw_it() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()
        api.seed(OTHER)
        b = elector(api, clock, identity="b")
        lead = Leader(clock)
        async with running(b, lead):
            await advance(clock, 14.0)
            assert lead.started is None
            assert not b.is_leader
            assert b.leader == "other"
            await advance(clock, 1.0)
            # Seen at 0; free at 15; this candidate polls every 2 s, so it takes over at its attempt at 16.
            assert lead.started is None
            await advance(clock, 1.0)
            assert lead.started == 16.0
            assert api.record.holder == "b"
            assert api.record.transitions == OTHER.transitions + 1


async def test_candidate_restarts_its_wait_whenever_the_holder_renews() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()
        api.seed(OTHER)
        lead = Leader(clock)
        async with running(elector(api, clock, identity="b"), lead):
            await advance(clock, 9.0)
            api.force(renewTime="2026-11-29T20:00:14.000000Z")  # the holder renews at t=9; seen at t=10
            await advance(clock, 16.0)  # t=25: 15 s after it was seen changing, but not polled yet
            assert lead.started is None
            await advance(clock, 1.0)
            assert lead.started == 26.0


async def test_two_candidates_exactly_one_leads() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()
        a, b = elector(api, clock, identity="a"), elector(api, clock, identity="b")
        async with running(a, Leader(clock)), running(b, Leader(clock)):
            for _ in range(10):
                await advance(clock, 1.0)
                assert [a.is_leader, b.is_leader].count(True) == 1
                assert api.record.holder == ("a" if a.is_leader else "b")


async def test_leader_that_cannot_renew_reports_loss_at_its_renew_deadline_and_cancels_its_work() -> None:
    async with asyncio.timeout(5):
        api, clock, registry, changes = FakeLeaseApi(), FakeClock(), CollectorRegistry(), list[bool]()
        a = elector(api, clock, registry=registry, on_change=changes.append)
        lead = Leader(clock)
        async with running(a, lead) as task:
            await advance(clock, 3.0)  # renewed at t=2
            api.hang = True  # the renewal sent at t=4 never returns
            await advance(clock, 8.0)
            assert a.is_leader
            assert lead.cancelled is None
            await advance(clock, 1.0)
            # The deadline runs from when the last successful renewal was sent (t=2): 2 + 10 = 12.
            assert lead.cancelled == 12.0
            assert not a.is_leader
            assert changes == [True, False]
            assert registry.get_sample_value("leader_election_master_status", {"name": "op"}) == 0
            assert task.done()
            with pytest.raises(LeadershipLost, match="no successful renewal"):
                task.result()
            # No release was attempted: the elector no longer knows whether it holds the lease.
            assert api.record.holder == "a"


async def test_leader_reports_loss_as_soon_as_it_reads_another_holder() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()
        a = elector(api, clock)
        lead = Leader(clock)
        async with running(a, lead) as task:
            await advance(clock, 3.0)
            api.force(holderIdentity="intruder")
            await advance(clock, 1.0)
            assert lead.cancelled == 4.0
            with pytest.raises(LeadershipLost, match="taken by intruder"):
                task.result()


async def test_conflict_from_a_stale_resource_version_is_retried_not_fatal() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()
        a = elector(api, clock)
        lead = Leader(clock)
        async with running(a, lead):
            await advance(clock, 3.0)
            assert api.lease is not None
            api.lease["metadata"]["labels"] = {"touched": "yes"}
            api.force()  # same spec, new resourceVersion: the leader's cached copy is stale
            api.requests.clear()
            await advance(clock, 1.0)
            assert api.requests == ["PUT", "GET", "PUT"]  # fast path 409, read, renew
            await advance(clock, 20.0)
            assert a.is_leader
            assert lead.cancelled is None
            assert api.lease["metadata"]["labels"] == {"touched": "yes"}


async def test_clean_stop_releases_the_lease_and_a_waiting_candidate_takes_over_at_its_next_poll() -> None:
    async with asyncio.timeout(5):
        api, clock, changes = FakeLeaseApi(), FakeClock(), list[bool]()
        a = elector(api, clock, on_change=changes.append)
        b = elector(api, clock, identity="b")
        lead_b = Leader(clock)
        async with running(a, Leader(clock)) as task_a, running(b, lead_b):
            await advance(clock, 5.0)
            task_a.cancel()
            await settle()
            assert task_a.cancelled()
            assert changes == [True, False]
            assert api.record.holder in ("", "b")
            await advance(clock, 1.0)  # b polls at 0, 2, 4, 6
            assert lead_b.started == 6.0
            assert api.record.holder == "b"
            assert api.record.transitions == 1


async def test_released_lease_has_no_holder_and_a_one_second_duration() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()
        async with running(elector(api, clock), Leader(clock)) as task:
            await advance(clock, 3.0)
            task.cancel()
            await settle()
        assert api.record.holder == ""
        assert api.record.duration == 1
        assert api.record.transitions == 0


async def test_release_rereads_a_lease_changed_since_the_last_renewal() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()
        async with running(elector(api, clock), Leader(clock)) as task:
            await advance(clock, 3.0)
            api.force()  # new resourceVersion, still held by "a": the leader's cached copy is stale
            api.requests.clear()
            task.cancel()
            await settle()
        assert api.requests == ["PUT", "GET", "PUT"]
        assert api.record.holder == ""


async def test_release_leaves_a_lease_taken_by_another_alone() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()
        async with running(elector(api, clock), Leader(clock)) as task:
            await advance(clock, 3.0)
            api.force(holderIdentity="intruder")
            task.cancel()
            await settle()
        assert api.record.holder == "intruder"


async def test_lead_returning_releases_the_lease_and_returns() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()
        a = elector(api, clock)

        async def finish_soon() -> None:
            await clock.sleep(3.0)

        lead = Leader(clock, finish_soon)
        task = asyncio.create_task(a.run(lead))
        await advance(clock, 3.0)
        assert task.done()
        assert task.result() is None
        assert not a.is_leader
        assert api.record.holder == ""


async def test_lead_error_propagates_unwrapped_after_release() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()

        async def fail() -> None:
            raise RuntimeError("controller crashed")

        with pytest.raises(RuntimeError, match="controller crashed"):
            await elector(api, clock).run(Leader(clock, fail))
        assert api.record.holder == ""


async def test_renew_time_is_the_wall_clock_in_micro_time() -> None:
    async with asyncio.timeout(5):
        api, clock = FakeLeaseApi(), FakeClock()
        before = datetime.now(UTC)
        async with running(elector(api, clock), Leader(clock)):
            await settle()
            assert api.record.renew_time is not None
            renewed = datetime.strptime(api.record.renew_time, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
            assert before <= renewed <= datetime.now(UTC)
