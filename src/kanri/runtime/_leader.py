"""Leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's semantics.

Candidates read the Lease every ``retry_period``. It is free when nobody holds it, when this identity already holds
it, or when its record has not changed for ``leaseDurationSeconds`` *as measured by the local monotonic clock from
the moment this process saw the record change*. The remote ``renewTime`` is never compared with the local clock, so
clock skew between machines cannot make a live lease look expired. Every write is a PUT guarded by
``resourceVersion``: of several candidates that see a free lease, exactly one wins and the others get a 409.

The leader renews every ``retry_period``; when no renewal has succeeded for ``renew_deadline`` (which is shorter
than the lease duration, so nobody else can have taken over yet), or as soon as it reads another holder in the
Lease, it has lost leadership. On a clean stop it releases the Lease (holder cleared) so a successor takes over at
its next poll instead of waiting for the lease to expire.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NoReturn, Protocol

import aiohttp
import structlog
from prometheus_client import CollectorRegistry, Gauge

from kanri.runtime._clock import Clock, SystemClock
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import LEASE, Kind

__all__ = [
    "LeaderElector",
    "LeadershipLost",
    "LeaseApi",
    "LeaseRecord",
    "Observation",
    "claim",
    "default_identity",
    "micro_time",
    "observe",
    "released",
]

Obj = dict[str, Any]

log = structlog.get_logger("kanri.leader")

# client-go's wait.JitterUntil factor: a candidate waits retry_period * (1 + 1.2 * random()) between attempts, so a
# crowd of candidates started together does not poll in lockstep.
_JITTER = 1.2


class LeadershipLost(Exception):
    """This process was leading and no longer is: its leader-only work has been cancelled."""


class LeaseApi(Protocol):
    """The part of :class:`kanri.runtime._client.Client` the elector uses."""

    async def get(self, kind: Kind, name: str, namespace: str | None = None) -> Obj: ...

    async def create(self, kind: Kind, obj: Obj) -> Obj: ...

    async def replace(self, kind: Kind, obj: Obj) -> Obj: ...


def micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 in UTC with microseconds, e.g. ``2026-11-29T20:00:00.000000Z``."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def default_identity() -> str:
    """A candidate identity unique to this process: ``<hostname>_<uuid4>`` (as controller-runtime builds it)."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """The election fields of a Lease's ``spec``."""

    holder: str = ""
    duration: int = 0  # leaseDurationSeconds
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0

    @classmethod
    def from_lease(cls, lease: Obj) -> LeaseRecord:
        spec: Obj = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            duration=int(spec.get("leaseDurationSeconds") or 0),
            acquire_time=spec.get("acquireTime"),
            renew_time=spec.get("renewTime"),
            transitions=int(spec.get("leaseTransitions") or 0),
        )

    def to_spec(self) -> Obj:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration,
            "acquireTime": self.acquire_time,
            "renewTime": self.renew_time,
            "leaseTransitions": self.transitions,
        }


@dataclass(frozen=True, slots=True)
class Observation:
    """A Lease record and the local monotonic time at which this process first saw it (in its current form)."""

    record: LeaseRecord
    at: float

    def expired(self, now: float, fallback_duration: float) -> bool:
        """True when the record has stayed the same for its lease duration on the local clock.

        ``fallback_duration`` stands in when the record states no (positive) duration.
        """
        duration = self.record.duration if self.record.duration > 0 else fallback_duration
        return now >= self.at + duration

    def free_for(self, identity: str, now: float, fallback_duration: float) -> bool:
        """May ``identity`` write itself in as holder now? (Nobody holds it, it holds it already, or it expired.)"""
        holder = self.record.holder
        return not holder or holder == identity or self.expired(now, fallback_duration)


def observe(previous: Observation | None, record: LeaseRecord, now: float) -> Observation:
    """The observation after reading ``record`` at local time ``now``.

    The clock only restarts when the record changed: a holder that stops renewing leaves the record as it was, and
    its lease expires ``duration`` seconds after this process first saw that record.
    """
    if previous is not None and previous.record == record:
        return previous
    return Observation(record, now)


def claim(current: LeaseRecord | None, identity: str, duration: int, stamp: str) -> LeaseRecord:
    """The record ``identity`` writes to acquire (``current`` held by another, or by nobody) or renew the lease.

    A renewal keeps ``acquireTime`` and ``leaseTransitions``; a change of holder counts one more transition.
    """
    if current is not None and current.holder == identity:
        return replace(current, duration=duration, renew_time=stamp)
    transitions = 0 if current is None else current.transitions + 1
    return LeaseRecord(identity, duration, stamp, stamp, transitions)


def released(current: LeaseRecord, stamp: str) -> LeaseRecord:
    """The record a leader writes to step down: no holder, so any candidate may acquire at its next attempt."""
    return LeaseRecord("", 1, stamp, stamp, current.transitions)


def _jittered(period: float) -> float:
    return period * (1 + _JITTER * random.random())


def _with_record(lease: Obj, record: LeaseRecord) -> Obj:
    # Merge into the existing spec so fields this elector does not manage (e.g. ``strategy``) survive the PUT.
    return {**lease, "spec": {**(lease.get("spec") or {}), **record.to_spec()}}


@contextlib.asynccontextmanager
async def _deadline(clock: Clock, seconds: float) -> AsyncIterator[None]:
    """Like ``asyncio.timeout(seconds)``, but measured on ``clock`` (so a fake clock drives it in tests)."""
    loop = asyncio.get_running_loop()
    async with asyncio.timeout(None) as scope:
        timer = clock.call_later(seconds, lambda: scope.reschedule(loop.time()))
        try:
            yield
        finally:
            timer.cancel()


class LeaderElector:
    """Campaigns for a Lease and runs leader-only work while it holds it.

    ``run(lead)`` is the whole contract: it waits until this process leads, runs ``lead()`` while it does, cancels
    ``lead()`` at once if leadership is lost (then raises :class:`LeadershipLost`), and releases the Lease when
    ``lead()`` ends or ``run`` is cancelled. ``identity`` must be unique per process (see :func:`default_identity`).

    Defaults are controller-runtime's: 15 s lease, 10 s renew deadline, 2 s retry period.
    """

    def __init__(
        self,
        client: LeaseApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        retry_period: float = 2.0,
        clock: Clock | None = None,
        on_change: Callable[[bool], object] | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if not identity:
            raise ValueError("leader election needs a non-empty identity")
        if not 0 < retry_period * _JITTER < renew_deadline < lease_duration:
            # A leader must give up (renew_deadline) before anyone else may take over (lease_duration), and must get
            # a few renew attempts in before its deadline.
            raise ValueError(
                "need 0 < 1.2 * retry_period < renew_deadline < lease_duration, got "
                f"{retry_period=}, {renew_deadline=}, {lease_duration=}"
            )
        self._client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self._lease_seconds = max(1, math.ceil(lease_duration))
        self._lease_duration = lease_duration
        self._renew_deadline = renew_deadline
        self._retry_period = retry_period
        self._clock: Clock = clock or SystemClock()
        self._on_change = on_change
        self._gauge: Gauge | None = None
        if registry is not None:
            self._gauge = Gauge(
                "leader_election_master_status",
                "Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates "
                "master. 'name' is the string used to identify the lease.",
                ["name"],
                registry=registry,
            )
            self._gauge.labels(name).set(0)
        self._lease: Obj | None = None  # the last Lease read or written, for resourceVersion-guarded writes
        self._observation: Observation | None = None
        self._leading = False
        self._renewed_at = 0.0  # local time at which the last successful acquire/renew request was sent
        self._running = False

    @property
    def is_leader(self) -> bool:
        """True between acquiring the lease and losing or releasing it."""
        return self._leading

    @property
    def leader(self) -> str:
        """The holder identity last seen in the Lease ("" when none); informational, may be stale."""
        return self._observation.record.holder if self._observation else ""

    async def run(self, lead: Callable[[], Awaitable[object]]) -> None:
        """Wait until leader, run ``lead()`` while leading, then step down.

        - Blocks, polling every ``retry_period`` (jittered), until the lease is acquired.
        - Runs ``lead()`` in the calling task while the lease is renewed alongside it.
        - Leadership lost: ``lead()`` is cancelled immediately and :class:`LeadershipLost` is raised (the lease is
          not released: this process is no longer sure it holds it; it expires by itself).
        - ``lead()`` returns or raises, or ``run`` is cancelled: the lease is released, then the result, exception
          or cancellation propagates.
        """
        if self._running:
            raise RuntimeError(f"leader elector for lease {self.namespace}/{self.name} is already running")
        self._running = True
        try:
            await self._acquire()
            try:
                async with asyncio.TaskGroup() as group:
                    renewing = group.create_task(self._keep_renewing(), name=f"renew lease {self.name}")
                    try:
                        await lead()
                    finally:
                        renewing.cancel()
            except BaseExceptionGroup as errors:
                # The group only ever holds LeadershipLost or the exception of lead(): hand it on unwrapped.
                if len(errors.exceptions) == 1:
                    raise errors.exceptions[0] from None
                raise
            finally:
                if self._leading:
                    await self._release()
        finally:
            self._running = False

    # --- the loops -------------------------------------------------------------------------------------------------

    async def _acquire(self) -> None:
        log.info("waiting to acquire leader lease", lease=self._describe(), identity=self.identity)
        while True:
            started = self._clock.now()
            if await self._attempt(self._renew_deadline):
                self._renewed_at = started
                self._set_leading(True)
                log.info(
                    "leader lease acquired",
                    lease=self._describe(),
                    identity=self.identity,
                    transitions=self._observation.record.transitions if self._observation else 0,
                )
                return
            await self._clock.sleep(_jittered(self._retry_period))

    async def _keep_renewing(self) -> NoReturn:
        while True:
            deadline = self._renewed_at + self._renew_deadline
            await self._clock.sleep(min(self._retry_period, deadline - self._clock.now()))
            started = self._clock.now()
            if await self._attempt(deadline - started):
                # Measured from when the request was sent: others saw the renewal no earlier than that.
                self._renewed_at = started
                continue
            holder = self._observation.record.holder if self._observation else ""
            if holder not in ("", self.identity):
                self._lose(f"lease taken by {holder}")
            if self._clock.now() >= deadline:
                self._lose(f"no successful renewal for {self._renew_deadline}s")

    async def _attempt(self, limit: float) -> bool:
        """One acquire-or-renew, bounded by ``limit`` seconds; failures are logged and count as "not acquired"."""
        try:
            async with _deadline(self._clock, limit):
                return await self._try_acquire_or_renew()
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            if isinstance(exc, ApiError) and exc.conflict:
                # Someone else wrote the Lease between our read and our write: they won this round.
                log.debug("leader lease write conflicted", lease=self._describe(), identity=self.identity)
            else:
                log.warning(
                    "leader lease request failed",
                    lease=self._describe(),
                    identity=self.identity,
                    leading=self._leading,
                    error=str(exc) or type(exc).__name__,
                )
            return False

    async def _try_acquire_or_renew(self) -> bool:
        stamp = micro_time(datetime.now(UTC))
        if self._leading and self._lease is not None and self._observation is not None:
            # Fast path: a leader writes over the copy it last wrote, without reading first (as client-go does).
            # A 409 means something changed the Lease meanwhile: read it and decide below.
            record = claim(self._observation.record, self.identity, self._lease_seconds, stamp)
            try:
                self._remember(await self._client.replace(LEASE, _with_record(self._lease, record)), record)
                return True
            except ApiError as exc:
                if not exc.conflict:
                    raise
        try:
            lease = await self._client.get(LEASE, self.name, self.namespace)
        except ApiError as exc:
            if not exc.not_found:
                raise
            record = claim(None, self.identity, self._lease_seconds, stamp)
            body = {
                "apiVersion": LEASE.api_version,
                "kind": LEASE.kind,
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": record.to_spec(),
            }
            self._remember(await self._client.create(LEASE, body), record)
            return True
        current = LeaseRecord.from_lease(lease)
        self._lease = lease
        self._see(current)
        assert self._observation is not None
        if not self._observation.free_for(self.identity, self._clock.now(), self._lease_duration):
            return False
        record = claim(current, self.identity, self._lease_seconds, stamp)
        self._remember(await self._client.replace(LEASE, _with_record(lease, record)), record)
        return True

    async def _release(self) -> None:
        """Clear the holder, guarded by resourceVersion: only a Lease this elector still holds is released."""
        self._set_leading(False)
        if self._lease is None or self._observation is None or self._observation.record.holder != self.identity:
            return
        stamp = micro_time(datetime.now(UTC))
        lease, record = self._lease, released(self._observation.record, stamp)
        try:
            async with _deadline(self._clock, self._renew_deadline):
                try:
                    updated = await self._client.replace(LEASE, _with_record(lease, record))
                except ApiError as exc:
                    if not exc.conflict:
                        raise
                    # A renewal cancelled mid-flight may have landed unseen: read, and release if still ours.
                    lease = await self._client.get(LEASE, self.name, self.namespace)
                    current = LeaseRecord.from_lease(lease)
                    if current.holder != self.identity:
                        self._see(current)
                        return
                    record = released(current, stamp)
                    updated = await self._client.replace(LEASE, _with_record(lease, record))
        except (ApiError, aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "could not release leader lease; successors wait for it to expire",
                lease=self._describe(),
                identity=self.identity,
                error=str(exc) or type(exc).__name__,
            )
            return
        self._remember(updated, record)
        log.info("leader lease released", lease=self._describe(), identity=self.identity)

    # --- state -----------------------------------------------------------------------------------------------------

    def _remember(self, lease: Obj, record: LeaseRecord) -> None:
        """After a successful write: keep the server's copy (new resourceVersion) and observe what we wrote."""
        self._lease = lease
        self._see(record)

    def _see(self, record: LeaseRecord) -> None:
        previous = self._observation
        self._observation = observe(previous, record, self._clock.now())
        if (
            record.holder
            and record.holder != self.identity
            and (previous is None or previous.record.holder != record.holder)
        ):
            log.info("new leader observed", lease=self._describe(), identity=self.identity, leader=record.holder)

    def _lose(self, reason: str) -> NoReturn:
        self._set_leading(False)
        log.warning("leader lease lost", lease=self._describe(), identity=self.identity, reason=reason)
        raise LeadershipLost(f"lost leader lease {self._describe()}: {reason}")

    def _set_leading(self, leading: bool) -> None:
        if leading == self._leading:
            return
        self._leading = leading
        if self._gauge is not None:
            self._gauge.labels(self.name).set(1 if leading else 0)
        if self._on_change is not None:
            try:
                self._on_change(leading)
            except Exception:
                # A faulty callback must not stop the elector from releasing or reporting loss.
                log.exception("leader election on_change callback failed", lease=self._describe())

    def _describe(self) -> str:
        return f"{self.namespace}/{self.name}"
