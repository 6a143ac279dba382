"""Kubernetes Events about the objects a controller manages, with client-go's correlation rules.

- **Repeats aggregate.** The same (object, type, reason, message) seen again within ``aggregation_window`` seconds
  PATCHes the existing Event's ``count`` and ``lastTimestamp`` instead of creating another object. If that Event is
  gone (Events expire after an hour by default), a new one is created.
- **Spam filter, per object and reason.** Every write about one object takes a token from the bucket of its
  (object, reason) pair (``burst`` 25, refilled at one token per 5 minutes, as client-go's
  ``EventSourceObjectSpamFilter``) and one from the object's own, larger bucket (``object_burst`` 100, refilled four
  times as fast). client-go keys its filter by the object alone, so 25 routine Events (pods created, a config
  reloaded) silence the one that matters next (a failover, an upgrade's last step); here a chatty reason exhausts
  only itself, while the object's ceiling still bounds the total. Without a token the write is skipped and counted
  in :attr:`EventRecorder.dropped`; a skipped repeat still counts towards the Event's ``count``, which the next
  allowed write carries, so ``count`` stays the number of occurrences.
- **Never in the way.** :meth:`EventRecorder.event` never raises (API errors, timeouts and bad input are logged and
  counted in :attr:`EventRecorder.failed`) and gives up after ``timeout`` seconds.

Why an awaited ``async def`` rather than fire-and-forget: the write then belongs to the caller's task — nothing is
left running when a reconcile is cancelled or the manager stops, there is no unbounded queue to drain or lose, a
slow API server slows the reconcile by at most ``timeout`` rather than piling up tasks, and a test can assert on the
Event right after ``await``. Cancellation of the caller is never swallowed.

The message is recorded verbatim and is readable by anyone who may list Events in the namespace: never put a
password, token, connection string with credentials or Secret data in it.
"""

from __future__ import annotations

import asyncio
import socket
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar

import structlog

from kanri.runtime._client import Client
from kanri.runtime._clock import Clock, SystemClock
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import EVENT
from kanri.runtime._references import object_reference

__all__ = ["EventRecorder", "EventType"]

Obj = dict[str, Any]
EventType = Literal["Normal", "Warning"]

log = structlog.get_logger("kanri.events")

_MAX_NAME = 253  # Event names are DNS subdomains
_MAX_INSTANCE = 128  # reportingInstance limit


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _timestamp(moment: datetime) -> str:
    # core/v1 Event timestamps are metav1.Time: RFC 3339 in UTC, whole seconds.
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Bucket:
    """A token bucket that refuses when empty (no debt): ``rate`` tokens a second, ``burst`` at most; starts full."""

    __slots__ = ("burst", "last", "rate", "tokens")

    def __init__(self, burst: int, rate: float, now: float) -> None:
        self.burst = burst
        self.rate = rate
        self.tokens = float(burst)
        self.last = now

    def has_token(self, now: float) -> bool:
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.last) * self.rate)
        self.last = max(self.last, now)
        return self.tokens >= 1.0

    def take(self) -> None:
        self.tokens -= 1.0


@dataclass
class _Series:
    """What we know of one Event in the API: the occurrences of one (object, type, reason, message)."""

    name: str
    count: int
    first_timestamp: str
    last_seen: float  # clock time of the latest occurrence, for the aggregation window
    written: bool = False  # whether the Event exists in the API (a create succeeded)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one write at a time per series, in order


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class _Lru(Generic[K, V]):
    """A dict bounded to ``size`` entries, evicting the least recently used (memory stays flat however many
    objects a long-lived controller has seen)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._items: OrderedDict[K, V] = OrderedDict()

    def get(self, key: K) -> V | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self._size:
            self._items.popitem(last=False)


class EventRecorder:
    """Records core/v1 Events about objects on behalf of ``component`` (the controller's name).

    ``clock`` (monotonic) drives the rate limiter and the aggregation window; ``now`` gives the wall-clock time
    written into the Events. ``instance`` identifies this replica (``reportingInstance``; the host name by default).
    """

    def __init__(
        self,
        client: Client,
        *,
        component: str,
        instance: str | None = None,
        clock: Clock | None = None,
        now: Callable[[], datetime] = _utc_now,
        burst: int = 25,
        refill_per_second: float = 1 / 300,
        object_burst: int = 100,
        aggregation_window: float = 3600.0,
        timeout: float = 2.0,
        cache_size: int = 4096,
    ) -> None:
        if burst < 1 or object_burst < burst or refill_per_second < 0:
            raise ValueError(
                f"need 1 <= burst <= object_burst and refill_per_second >= 0, got {burst}, {object_burst}, "
                f"{refill_per_second}"
            )
        self._client = client
        self.component = component
        self.instance = (instance or socket.gethostname())[:_MAX_INSTANCE]
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._now = now
        self._burst = burst
        self._rate = refill_per_second
        self._object_burst = object_burst
        self._object_rate = refill_per_second * object_burst / burst
        self._window = aggregation_window
        self._timeout = timeout
        self._buckets: _Lru[tuple[str, ...], _Bucket] = _Lru(cache_size)
        self._object_buckets: _Lru[tuple[str, ...], _Bucket] = _Lru(cache_size)
        self._series: _Lru[tuple[str, ...], _Series] = _Lru(cache_size)
        self._last_stamp = 0
        self.dropped = 0
        """Writes skipped by the per-object rate limit."""
        self.failed = 0
        """Writes that failed (API error, timeout, bad input); logged and swallowed."""

    async def normal(self, obj: Obj, reason: str, message: str) -> None:
        """Record a ``Normal`` Event: something expected happened (created, scaled, backup finished)."""
        await self.event(obj, "Normal", reason, message)

    async def warning(self, obj: Obj, reason: str, message: str) -> None:
        """Record a ``Warning`` Event: something a human may need to look at."""
        await self.event(obj, "Warning", reason, message)

    async def event(self, obj: Obj, event_type: EventType, reason: str, message: str) -> None:
        """Record that ``reason``/``message`` happened to ``obj`` (an object read from the API, with its uid).

        ``reason`` is a short CamelCase word (``"Created"``, ``"FailoverStarted"``); ``message`` a sentence for
        humans, recorded verbatim — never put secrets in it. Never raises (except the caller's own cancellation);
        returns within about ``timeout`` seconds.
        """
        try:
            involved = object_reference(obj)
            key = (*_object_key(involved), event_type, reason, message)
            if not self._take_token(_object_key(involved), reason):
                self.dropped += 1
                self._count_dropped_repeat(key)
                return
            series = self._observe(key, involved)
            async with asyncio.timeout(self._timeout), series.lock:
                await self._write(series, involved, event_type, reason, message)
        except Exception as exc:  # never into the reconciler: an Event is not worth failing a reconcile for
            self.failed += 1
            log.warning(
                "event not recorded",
                reason=reason,
                object=_describe(obj),
                error=str(exc) or type(exc).__name__,
            )

    # --- correlation -----------------------------------------------------------------------------------------------

    def _take_token(self, object_key: tuple[str, ...], reason: str) -> bool:
        now = self._clock.now()
        per_reason = self._bucket(self._buckets, (*object_key, reason), self._burst, self._rate, now)
        per_object = self._bucket(self._object_buckets, object_key, self._object_burst, self._object_rate, now)
        # Both or neither: a write refused by one bucket must not spend the other's token.
        if per_reason.has_token(now) and per_object.has_token(now):
            per_reason.take()
            per_object.take()
            return True
        return False

    @staticmethod
    def _bucket(
        buckets: _Lru[tuple[str, ...], _Bucket], key: tuple[str, ...], burst: int, rate: float, now: float
    ) -> _Bucket:
        bucket = buckets.get(key)
        if bucket is None:
            bucket = _Bucket(burst, rate, now)
            buckets.put(key, bucket)
        return bucket

    def _count_dropped_repeat(self, key: tuple[str, ...]) -> None:
        # An occurrence not written still happened: count it, so the next allowed write reports the true total.
        series = self._series.get(key)
        if series is not None and self._clock.now() - series.last_seen <= self._window:
            series.count += 1
            series.last_seen = self._clock.now()

    def _observe(self, key: tuple[str, ...], involved: Obj) -> _Series:
        """Count one occurrence: into the live series for ``key``, or a new series (a new Event) when there is none
        or its last occurrence is older than the window."""
        now = self._clock.now()
        series = self._series.get(key)
        if series is not None and now - series.last_seen <= self._window:
            series.count += 1
            series.last_seen = now
            return series
        series = _Series(
            name=self._event_name(involved["name"]),
            count=1,
            first_timestamp=_timestamp(self._now()),
            last_seen=now,
        )
        self._series.put(key, series)
        return series

    def _event_name(self, object_name: str) -> str:
        """``<object name>.<16 hex digits of the time in ns>`` like client-go; strictly increasing per recorder so
        two Events in the same microsecond do not collide."""
        stamp = int(self._now().timestamp() * 1_000_000) * 1000
        stamp = max(stamp, self._last_stamp + 1)
        self._last_stamp = stamp
        suffix = f".{stamp:016x}"
        # A long object name still needs to leave room for the suffix; trailing '-'/'.' would make it invalid.
        return object_name[: _MAX_NAME - len(suffix)].rstrip("-.") + suffix

    # --- API writes ------------------------------------------------------------------------------------------------

    async def _write(self, series: _Series, involved: Obj, event_type: EventType, reason: str, message: str) -> None:
        namespace = involved.get("namespace") or "default"  # Events about cluster-scoped objects go to "default"
        last = _timestamp(self._now())
        if series.written:
            try:
                await self._bump(series, namespace, last)
                return
            except ApiError as exc:
                if not exc.not_found:
                    raise
            # The Event expired or was deleted: start a new one rather than resurrect a name with a lost history.
            series.name = self._event_name(involved["name"])
            series.count = 1
            series.first_timestamp = last
            series.written = False
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": series.name, "namespace": namespace},
            "involvedObject": involved,
            "type": event_type,
            "reason": reason,
            "message": message,
            "source": {"component": self.component},
            "firstTimestamp": series.first_timestamp,
            "lastTimestamp": last,
            "count": series.count,
            "reportingComponent": self.component,
            "reportingInstance": self.instance,
        }
        try:
            await self._client.create(EVENT, body)
        except ApiError as exc:
            if not exc.conflict:
                raise
            # Already there: an earlier create went through although its answer was lost (say, to our timeout).
            await self._bump(series, namespace, last)
        series.written = True

    async def _bump(self, series: _Series, namespace: str, last: str) -> None:
        # A merge patch with the absolute count: retrying it, or racing an earlier one, cannot over-count.
        patch = {"count": series.count, "lastTimestamp": last}
        await self._client.patch(EVENT, series.name, patch, namespace, patch_type="merge")


def _object_key(involved: Obj) -> tuple[str, ...]:
    # Not the resourceVersion: it changes with every write, and the same object must share one bucket and series.
    return tuple(str(involved.get(k, "")) for k in ("apiVersion", "kind", "namespace", "name", "uid"))


def _describe(obj: object) -> str:
    # Must not fail whatever the caller passed: it runs in the handler that keeps errors out of the reconciler.
    if not isinstance(obj, dict):
        return type(obj).__name__
    meta = obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    return f"{obj.get('kind')} {meta.get('namespace') or '-'}/{meta.get('name')}"
