"""Lease leader election against the real API server: one leader at a time, a fast hand-over on clean stop, loss
reported (and leader-only work cancelled) at once, takeover only after the lease expires, conflicts survived.

Timings are shortened (lease 3 s, renew deadline 2 s, retry 0.5 s) to keep the tests quick.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from kanri.local.controlplane import Endpoint
from kanri.runtime._client import Client
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import LEASE, Kind
from kanri.runtime._leader import LeaderElector, LeadershipLost, LeaseApi
from tests.support import eventually, running_task

LEASE_S, RENEW_S, RETRY_S = 3.0, 2.0, 0.5
NAME = "kanri-operator"
Obj = dict[str, Any]
Connect = Callable[[], Awaitable[Client]]


@pytest_asyncio.fixture
async def connect(control_plane: Endpoint) -> AsyncIterator[Connect]:
    """Makes API clients (one per simulated process); closes them all when the test ends."""
    made: list[Client] = []

    async def make() -> Client:
        client = await Client.from_kubeconfig(str(control_plane.kubeconfig))
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


class FlakyClient:
    """The real client, with a switch that makes every request fail as if the API server were unreachable; keeps a
    log of the API errors the elector saw."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.broken = False
        self.errors: list[int] = []

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj:
        return await self._call(lambda: self.client.get(kind, name, namespace))

    async def create(self, kind: Kind, obj: Obj) -> Obj:
        return await self._call(lambda: self.client.create(kind, obj))

    async def replace(self, kind: Kind, obj: Obj) -> Obj:
        return await self._call(lambda: self.client.replace(kind, obj))

    async def _call(self, request: Callable[[], Awaitable[Obj]]) -> Obj:
        if self.broken:
            self.errors.append(503)
            raise ApiError(503, {"reason": "ConnectionFailed", "message": "simulated partition"})
        try:
            return await request()
        except ApiError as exc:
            self.errors.append(exc.status)
            raise


class Work:
    """A leader-only coroutine that records (on the monotonic clock) when it started and when it was cancelled."""

    def __init__(self) -> None:
        self.started_at: float | None = None
        self.cancelled_at: float | None = None

    async def __call__(self) -> None:
        self.started_at = time.monotonic()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.cancelled_at = time.monotonic()
            raise


def candidate(client: LeaseApi, namespace: str, identity: str, **kwargs: Any) -> LeaderElector:
    return LeaderElector(
        client,
        namespace=namespace,
        name=NAME,
        identity=identity,
        lease_duration=LEASE_S,
        renew_deadline=RENEW_S,
        retry_period=RETRY_S,
        **kwargs,
    )


def running(elector: LeaderElector, work: Work) -> AbstractAsyncContextManager[asyncio.Task[None]]:
    return running_task(elector.run(work))


async def lease_spec(client: Client, namespace: str) -> Obj:
    spec: Obj = (await client.get(LEASE, NAME, namespace)).get("spec") or {}
    return spec


async def until(condition: Callable[[], object], *, timeout: float = 15.0) -> None:
    """Wait (polling every 10 ms, so measured times stay sharp) until ``condition()`` is true."""

    async def check() -> bool:
        return bool(condition())

    await eventually(check, timeout=timeout, interval=0.01)


async def test_two_electors_exactly_one_leads(connect: Connect, namespace: str) -> None:
    reader = await connect()
    a, b = candidate(await connect(), namespace, "a"), candidate(await connect(), namespace, "b")
    work_a, work_b = Work(), Work()
    async with asyncio.timeout(30), running(a, work_a), running(b, work_b):
        await until(lambda: a.is_leader or b.is_leader)
        leader, follower = (a, b) if a.is_leader else (b, a)
        for _ in range(20):  # 4 s: more than a lease duration, many renewals
            assert [a.is_leader, b.is_leader].count(True) == 1
            spec = await lease_spec(reader, namespace)
            assert spec["holderIdentity"] == leader.identity
            assert follower.leader == leader.identity or follower.leader == ""
            await asyncio.sleep(0.2)
        assert spec["leaseDurationSeconds"] == 3
        assert spec["leaseTransitions"] == 0
        assert [work_a.started_at is not None, work_b.started_at is not None].count(True) == 1


async def test_clean_stop_hands_over_well_before_the_lease_expires(connect: Connect, namespace: str) -> None:
    reader = await connect()
    a, b = candidate(await connect(), namespace, "a"), candidate(await connect(), namespace, "b")
    work_b = Work()
    async with asyncio.timeout(30), running(a, Work()) as task_a:
        await until(lambda: a.is_leader)
        async with running(b, work_b):
            await until(lambda: b.leader == "a")
            stopped_at = time.monotonic()
            task_a.cancel()
            await asyncio.wait([task_a])
            await until(lambda: work_b.started_at is not None)
            assert work_b.started_at is not None
            handover = work_b.started_at - stopped_at
            print(f"clean-stop hand-over: {handover:.3f}s (lease {LEASE_S}s, retry period {RETRY_S}s)")
            assert handover < LEASE_S * 2 / 3, (
                f"hand-over took {handover:.3f}s; without release it would be ~{LEASE_S}s"
            )
            spec = await lease_spec(reader, namespace)
            assert spec["holderIdentity"] == "b"
            assert spec["leaseTransitions"] == 1, spec  # a -> b (releasing clears the holder, not a transition)


async def test_leader_that_cannot_renew_stops_its_work_at_once_and_the_other_takes_over_after_expiry(
    connect: Connect, namespace: str
) -> None:
    flaky = FlakyClient(await connect())
    changes: list[tuple[bool, float]] = []
    registry = CollectorRegistry()
    a = candidate(flaky, namespace, "a", registry=registry, on_change=lambda on: changes.append((on, time.monotonic())))
    b = candidate(await connect(), namespace, "b")
    work_a, work_b = Work(), Work()
    async with asyncio.timeout(30), running(a, work_a) as task_a:
        await until(lambda: a.is_leader)
        assert registry.get_sample_value("leader_election_master_status", {"name": NAME}) == 1
        async with running(b, work_b):
            await until(lambda: b.leader == "a")
            await asyncio.sleep(1.0)  # a few renewals
            broken_at = time.monotonic()
            flaky.broken = True

            await until(lambda: task_a.done())
            with pytest.raises(LeadershipLost, match="no successful renewal"):
                task_a.result()
            assert changes[-1][0] is False
            lost_at = changes[-1][1]
            assert work_a.cancelled_at is not None
            assert work_a.cancelled_at - lost_at < 0.05, "leader-only work must stop as soon as loss is known"
            # The last good renewal was sent at most one retry period before the break.
            assert lost_at - broken_at <= RENEW_S + 0.1, f"loss reported {lost_at - broken_at:.3f}s after the break"
            assert registry.get_sample_value("leader_election_master_status", {"name": NAME}) == 0

            await until(lambda: work_b.started_at is not None)
            assert work_b.started_at is not None
            takeover = work_b.started_at - broken_at
            # b may only take over once a's last renewal has gone unchanged for a whole lease on b's clock.
            assert work_b.started_at > work_a.cancelled_at, "two leaders at once"
            assert LEASE_S - RETRY_S - 0.1 <= takeover <= LEASE_S + 3.0, f"takeover {takeover:.3f}s after the break"


async def test_leader_reports_loss_as_soon_as_another_identity_overwrites_the_lease(
    connect: Connect, namespace: str
) -> None:
    intruder = await connect()
    a, b = candidate(await connect(), namespace, "a"), candidate(await connect(), namespace, "b")
    work_a, work_b = Work(), Work()
    async with asyncio.timeout(30), running(a, work_a) as task_a:
        await until(lambda: a.is_leader)
        async with running(b, work_b):
            await until(lambda: b.leader == "a")
            lease = await intruder.get(LEASE, NAME, namespace)
            lease["spec"]["holderIdentity"] = "intruder"
            forced_at = time.monotonic()
            await intruder.replace(LEASE, lease)

            await until(lambda: task_a.done())
            assert work_a.cancelled_at is not None
            assert work_a.cancelled_at - forced_at < RETRY_S + 0.5, "loss must show at the leader's next renewal"
            with pytest.raises(LeadershipLost, match="taken by intruder"):
                task_a.result()

            # The intruder never renews: b takes over a lease duration after it saw the intruder's record.
            await until(lambda: work_b.started_at is not None)
            assert work_b.started_at is not None
            assert work_b.started_at - forced_at >= LEASE_S
            spec = await lease_spec(intruder, namespace)
            assert spec["holderIdentity"] == "b"
            assert spec["leaseTransitions"] == 1


async def test_conflict_from_a_stale_resource_version_does_not_crash_the_elector(
    connect: Connect, namespace: str
) -> None:
    other = await connect()
    recording = FlakyClient(await connect())
    a = candidate(recording, namespace, "a")
    work = Work()
    async with asyncio.timeout(30), running(a, work) as task:
        await until(lambda: a.is_leader)
        # Someone else touches the Lease (metadata only): the leader's cached resourceVersion goes stale.
        for round_ in range(4):
            await other.patch(LEASE, NAME, {"metadata": {"labels": {"touched": str(round_)}}}, namespace)
            await asyncio.sleep(RETRY_S * 2)
        assert 409 in recording.errors, recording.errors
        assert a.is_leader
        assert not task.done()
        assert work.cancelled_at is None
        lease = await other.get(LEASE, NAME, namespace)
        assert lease["spec"]["holderIdentity"] == "a"
        assert lease["metadata"]["labels"] == {"touched": "3"}
