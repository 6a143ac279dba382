"""The work queue between event handlers and a controller's workers: deduplicating, delaying, fair across namespaces."""

from __future__ import annotations

import asyncio
import enum
import heapq
import itertools
from collections import OrderedDict, deque
from dataclasses import dataclass

from kanri.runtime._clock import Cancellable, Clock, SystemClock
from kanri.runtime._queue_metrics import QueueMetrics, WorkQueueMetrics
from kanri.runtime._ratelimit import RateLimiter, default_rate_limiter

__all__ = ["Priority", "QueueShutDown", "Request", "WorkQueue"]


class QueueShutDown(Exception):
    """Raised by ``WorkQueue.get()`` once the queue is shut down and has nothing left to hand out."""


@dataclass(frozen=True, slots=True, order=True)
class Request:
    """What a reconciler is asked to reconcile: an object's namespace and name, never the event that changed it.

    Cluster-scoped objects use namespace ``""``.
    """

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" if self.namespace else self.name


class Priority(enum.IntEnum):
    """How urgent a key is. Ready keys of a higher priority are always handed out first."""

    #: Keys from the initial list and from periodic resyncs: they wait behind live changes.
    BACKGROUND = 0
    #: Keys from live changes (watch events, requeues).
    LIVE = 1


@dataclass(slots=True)
class _Entry:
    """A pending key: waiting for its time, ready in a FIFO, or due but still being processed (dirty)."""

    priority: Priority
    ready_at: float
    due: bool = False  # its time has come; it sits in a FIFO unless a worker still holds it
    since: float = 0.0  # when it became due, for the queue-duration metric


# One priority level: namespace -> FIFO of its ready keys. The namespace at the front is served next.
_Level = OrderedDict[str, OrderedDict[Request, None]]


class WorkQueue:
    """A work queue of ``Request`` keys, with client-go's semantics plus priorities and per-namespace fairness.

    Contract:

    - **Deduplicated.** A key is pending at most once. Adding a pending key again never makes a second copy: its
      priority becomes the higher of the two (never lower) and its ready time the earlier of the two.
    - **One worker per key.** A key handed out by ``get()`` is not handed out again until ``done()`` is called for
      it. Added meanwhile, it is marked dirty and becomes ready when ``done()`` is called (or at its delay, if later).
    - **Delays.** ``add_after`` and ``add_rate_limited`` keys become ready at their time on the injected clock.
    - **Priorities.** ``get()`` always takes from the highest priority level that has ready keys; ``LIVE`` keys go
      before ``BACKGROUND`` ones, so the initial list and resyncs do not delay live changes. A waiting
      ``BACKGROUND`` key added again as ``LIVE`` is promoted (to the back of its namespace's ``LIVE`` line).
    - **Per-namespace fairness.** Within a level, namespaces take turns (round-robin) and each namespace's keys come
      out first in, first out. A namespace joins the back of the rotation when its first key becomes ready and
      leaves it when it has none left.

    Fairness bound: a key that becomes ready at level P as the k-th ready key of its namespace at P is handed out
    after at most k-1 keys of its own namespace and at most k keys of each other namespace from level P (plus any
    keys of a higher level, which always go first). In particular, a key of a namespace with nothing else ready is
    handed out within one round: before it come at most one key from each other namespace that has ready keys at its
    level, however many each holds. A tenant with 10,000 ready keys delays another tenant's key by one key.

    Shutdown: ``shutdown()`` stops the queue taking work: later adds are ignored, delayed keys and dirty keys are
    dropped, and ``get()`` keeps handing out the keys that were ready, then raises ``QueueShutDown``.
    ``shutdown(drain=False)`` drops the ready keys too, so ``get()`` raises at once. Blocked ``get()`` calls wake.

    Not thread-safe: use it from one event loop.
    """

    def __init__(
        self,
        name: str = "",
        *,
        clock: Clock | None = None,
        rate_limiter: RateLimiter | None = None,
        metrics: WorkQueueMetrics | None = None,
    ) -> None:
        """Create a queue; ``name`` labels its metrics (the controller's name). The default rate limiter is
        controller-runtime's (5 ms -> 1000 s per key, 10 qps / burst 100 overall) on ``clock``."""
        self.name = name
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._rate_limiter = rate_limiter if rate_limiter is not None else default_rate_limiter(self._clock)
        self._metrics: QueueMetrics | None = metrics.for_queue(name, self._clock) if metrics is not None else None
        self._entries: dict[Request, _Entry] = {}
        self._processing: set[Request] = set()
        # Highest priority first, so iteration order is service order.
        self._levels: dict[Priority, _Level] = {p: OrderedDict() for p in sorted(Priority, reverse=True)}
        self._ready = 0
        self._ready_by_namespace: dict[str, int] = {}
        # Delayed keys: (ready_at, sequence, key). Superseded entries stay and are skipped (see _is_stale).
        self._waiting: list[tuple[float, int, Request]] = []
        self._sequence = itertools.count()
        self._timer: Cancellable | None = None
        self._timer_at: float | None = None
        self._getters: deque[asyncio.Future[None]] = deque()
        self._shut_down = False

    # --- adding -------------------------------------------------------------------------------------------------

    def add(self, req: Request, priority: Priority = Priority.LIVE) -> None:
        """Make ``req`` ready now (or as soon as a worker holding it calls ``done()``)."""
        self._push(req, self._clock.now(), priority)

    def add_after(self, req: Request, delay: float, priority: Priority = Priority.LIVE) -> None:
        """Make ``req`` ready after ``delay`` seconds, unless it is already due to be ready earlier."""
        self._push(req, self._clock.now() + max(0.0, delay), priority)

    def add_rate_limited(self, req: Request, priority: Priority = Priority.LIVE) -> None:
        """Retry ``req`` after the rate limiter's delay (which counts a failure). See ``forget``."""
        if self._shut_down:
            return
        if self._metrics is not None:
            self._metrics.retried()
        self.add_after(req, self._rate_limiter.when(req), priority)

    def forget(self, req: Request) -> None:
        """Reset ``req``'s backoff (after a success); it stays pending if it is."""
        self._rate_limiter.forget(req)

    def num_requeues(self, req: Request) -> int:
        """How many rate-limited adds of ``req`` the rate limiter counts since it was last forgotten."""
        return self._rate_limiter.failures(req)

    # --- taking -------------------------------------------------------------------------------------------------

    async def get(self) -> Request:
        """Wait for a ready key and hand it out; the caller must call ``done(req)`` when finished with it.

        Raises ``QueueShutDown`` once the queue is shut down and no ready key is left.
        """
        while True:
            self._promote_due()
            req = self._pop_ready()
            if req is not None:
                return req
            if self._shut_down:
                raise QueueShutDown(f"work queue {self.name!r} is shut down")
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._getters.append(waiter)
            try:
                await waiter
            except asyncio.CancelledError:
                if waiter in self._getters:
                    self._getters.remove(waiter)
                elif self._ready:
                    self._wake_one()  # we were woken for a key we will not take: pass the wake-up on
                raise

    def done(self, req: Request) -> None:
        """Finish processing ``req``. If it was added meanwhile, it becomes ready now. Unknown keys are ignored."""
        if req not in self._processing:
            return
        self._processing.discard(req)
        if self._metrics is not None:
            self._metrics.finished(req)
        entry = self._entries.get(req)
        if entry is not None and entry.due:
            self._enqueue(req, entry.priority)

    def shutdown(self, drain: bool = True) -> None:
        """Stop the queue (see the class docstring); ``drain=False`` also drops the keys already ready."""
        self._shut_down = True
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_at = None
        self._waiting.clear()
        # Nothing new becomes ready after shutdown: drop delayed keys and keys waiting for a worker's done().
        for req, entry in list(self._entries.items()):
            if not entry.due or req in self._processing:
                del self._entries[req]
        if not drain:
            for namespace, count in list(self._ready_by_namespace.items()):
                self._count(namespace, -count)
            for level in self._levels.values():
                level.clear()
            self._entries.clear()  # what was left were the ready keys
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)

    # --- looking ------------------------------------------------------------------------------------------------

    @property
    def shutting_down(self) -> bool:
        """True once ``shutdown()`` was called."""
        return self._shut_down

    def __len__(self) -> int:
        """The number of keys ready to be handed out (not delayed ones, not ones being processed)."""
        self._promote_due()
        return self._ready

    def pending_by_namespace(self) -> dict[str, int]:
        """Ready keys per namespace (namespaces with none are absent); the values add up to ``len()``."""
        self._promote_due()
        return dict(self._ready_by_namespace)

    # --- internals ----------------------------------------------------------------------------------------------

    def _push(self, req: Request, ready_at: float, priority: Priority) -> None:
        if self._shut_down:
            return
        entry = self._entries.get(req)
        if entry is None:
            entry = self._entries[req] = _Entry(priority, ready_at=float("inf"))
            if self._metrics is not None:
                self._metrics.added()
        elif priority > entry.priority:
            if entry.due and req not in self._processing:
                self._fifo_remove(req, entry.priority)
                self._fifo_append(req, priority)
            entry.priority = priority
        if entry.due or ready_at >= entry.ready_at:
            return  # already due earlier: keep the earlier time
        was_waiting = entry.ready_at != float("inf")
        entry.ready_at = ready_at
        now = self._clock.now()
        if ready_at <= now:
            self._make_due(req, entry, now)
            if was_waiting:
                self._arm_timer()  # its old deadline may be the one the timer is armed for
        else:
            heapq.heappush(self._waiting, (ready_at, next(self._sequence), req))
            self._arm_timer()

    def _make_due(self, req: Request, entry: _Entry, since: float) -> None:
        entry.due = True
        entry.since = since
        if req not in self._processing:
            self._enqueue(req, entry.priority)

    def _enqueue(self, req: Request, priority: Priority) -> None:
        self._fifo_append(req, priority)
        self._count(req.namespace, 1)
        self._wake_one()

    def _fifo_append(self, req: Request, priority: Priority) -> None:
        level = self._levels[priority]
        fifo = level.get(req.namespace)
        if fifo is None:
            fifo = level[req.namespace] = OrderedDict()  # a namespace new to the rotation joins at the back
        fifo[req] = None

    def _fifo_remove(self, req: Request, priority: Priority) -> None:
        level = self._levels[priority]
        fifo = level[req.namespace]
        del fifo[req]
        if not fifo:
            del level[req.namespace]

    def _pop_ready(self) -> Request | None:
        for level in self._levels.values():
            if not level:
                continue
            namespace, fifo = next(iter(level.items()))
            req, _ = fifo.popitem(last=False)
            if fifo:
                level.move_to_end(namespace)  # its turn is over: to the back of the rotation
            else:
                del level[namespace]
            self._count(namespace, -1)
            entry = self._entries.pop(req)
            self._processing.add(req)
            if self._metrics is not None:
                self._metrics.started(req, self._clock.now() - entry.since)
            return req
        return None

    def _count(self, namespace: str, delta: int) -> None:
        count = self._ready_by_namespace.get(namespace, 0) + delta
        if count:
            self._ready_by_namespace[namespace] = count
        else:
            self._ready_by_namespace.pop(namespace, None)
        self._ready += delta
        if self._metrics is not None:
            self._metrics.set_depth(self._ready)
            self._metrics.set_namespace_depth(namespace, count)

    def _wake_one(self) -> None:
        while self._getters:
            waiter = self._getters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return

    def _is_stale(self, ready_at: float, req: Request) -> bool:
        entry = self._entries.get(req)
        return entry is None or entry.due or entry.ready_at != ready_at

    def _promote_due(self) -> None:
        """Make every delayed key whose time has come ready (the timer does this too; this keeps reads exact)."""
        now = self._clock.now()
        while self._waiting and self._waiting[0][0] <= now:
            ready_at, _, req = heapq.heappop(self._waiting)
            if not self._is_stale(ready_at, req):
                self._make_due(req, self._entries[req], ready_at)

    def _arm_timer(self) -> None:
        """Keep one clock timer armed for the earliest delayed key."""
        while self._waiting and self._is_stale(self._waiting[0][0], self._waiting[0][2]):
            heapq.heappop(self._waiting)
        at = self._waiting[0][0] if self._waiting else None
        if at == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = None, at
        if at is not None:
            self._timer = self._clock.call_later(at - self._clock.now(), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = self._timer_at = None
        self._promote_due()
        self._arm_timer()
