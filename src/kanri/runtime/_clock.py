"""An injectable clock, so that queues, backoff and leader election can be tested with exact, instant time."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from typing import Protocol

__all__ = ["Cancellable", "Clock", "FakeClock", "SystemClock"]


class Cancellable(Protocol):
    """A scheduled callback that can be called off (``asyncio.TimerHandle`` is one)."""

    def cancel(self) -> None:
        """Make sure the callback does not run; harmless if it already ran or was cancelled."""


class Clock(Protocol):
    """Monotonic time in seconds, plus the two ways to wait for it.

    ``now()`` has no fixed origin: only differences between two readings mean anything.
    """

    def now(self) -> float:
        """The current monotonic time in seconds."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock (at once, after one yield, when ``seconds <= 0``)."""

    def call_later(self, delay: float, callback: Callable[[], object]) -> Cancellable:
        """Run ``callback`` on the event loop once ``delay`` seconds have passed on this clock."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic()`` and the running event loop's timers."""

    def now(self) -> float:
        """``time.monotonic()``, the same time base as asyncio's default event loop."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """``asyncio.sleep``; a negative duration is treated as zero."""
        await asyncio.sleep(max(0.0, seconds))

    def call_later(self, delay: float, callback: Callable[[], object]) -> Cancellable:
        """``loop.call_later`` on the running loop; a negative delay is treated as zero."""
        return asyncio.get_running_loop().call_later(max(0.0, delay), callback)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():  # a cancelled sleeper's future is already done
        future.set_result(None)


class _FakeTimer:
    __slots__ = ("callback", "cancelled")

    def __init__(self, callback: Callable[[], object]) -> None:
        self.callback = callback
        self.cancelled = False

    def cancel(self) -> None:
        # Lazy deletion: the heap entry stays and is skipped when its deadline comes.
        self.cancelled = True


class FakeClock:
    """A clock for tests: time stands still until ``advance()`` moves it.

    ``advance(seconds)`` fires every timer whose deadline falls within the step, in deadline order (ties in the order
    they were scheduled). Time steps through each deadline, so a callback sees ``now()`` equal to its own deadline and
    a timer it schedules inside the step fires in the same ``advance()``. Callbacks run synchronously inside
    ``advance()``; tasks blocked in ``sleep()`` are woken in deadline order and resume at the caller's next ``await``,
    seeing ``now()`` at the end of the step. An exception raised by a callback propagates out of ``advance()``.

    A zero or negative delay does not wait for ``advance()``: ``call_later`` uses ``loop.call_soon`` and ``sleep``
    yields once, as asyncio does.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._timers: list[tuple[float, int, _FakeTimer]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        """The fake time in seconds; changes only through ``advance()``."""
        return self._now

    async def sleep(self, seconds: float) -> None:
        """Block until ``advance()`` has moved time ``seconds`` past the current time."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        timer = self.call_later(seconds, lambda: _resolve(woken))
        try:
            await woken
        finally:
            timer.cancel()

    def call_later(self, delay: float, callback: Callable[[], object]) -> Cancellable:
        """Run ``callback`` when ``advance()`` reaches ``now() + delay`` (soon, on the loop, if ``delay <= 0``)."""
        if delay <= 0:
            return asyncio.get_running_loop().call_soon(callback)
        timer = _FakeTimer(callback)
        heapq.heappush(self._timers, (self._now + delay, next(self._seq), timer))
        return timer

    def next_deadline(self) -> float | None:
        """The time of the earliest pending timer or sleeper, or None when nothing waits on this clock."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (>= 0), firing due timers in deadline order."""
        if seconds < 0:
            raise ValueError(f"a clock cannot go backwards (advance({seconds}))")
        target = self._now + seconds
        while self._timers and self._timers[0][0] <= target:
            deadline, _, timer = heapq.heappop(self._timers)
            if timer.cancelled:
                continue
            self._now = max(self._now, deadline)
            timer.callback()
        self._now = target
