"""Faults a test injects (throttling, transient 5xx) and the call log it reads afterwards.

Both are touched from two threads: the emulator's event loop answers calls while the test thread arms faults and reads
the log, so every method holds one lock for a few lines and never across I/O.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import asdict, dataclass

from .lifecycle import Clock
from .wire import RdsError

THROTTLED = RdsError("ThrottlingException", "Rate exceeded", 400)
_TRANSIENT = {500: "InternalFailure", 502: "BadGateway", 503: "ServiceUnavailable", 504: "GatewayTimeout"}


@dataclass(frozen=True)
class Call:
    """One RDS call as the emulator saw it: ``outcome`` is ``ok``, or the error code it answered with."""

    action: str
    instance: str
    at: float
    outcome: str
    status: int

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass
class _Budget:
    """A token bucket: ``rate`` calls a second with bursts of ``burst``; a call that finds it empty is throttled."""

    rate: float
    burst: float
    tokens: float
    at: float

    def take(self, now: float) -> bool:
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class Faults:
    """The faults armed now. Each ``next N`` fault catches the next N calls (of one action, if named)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._throttle: list[tuple[str | None, int]] = []
        self._errors: list[tuple[str | None, int, int]] = []
        self._budget: _Budget | None = None

    def throttle(self, times: int, action: str | None = None) -> None:
        """The next ``times`` calls (of ``action``, or any) answer ``ThrottlingException`` (HTTP 400)."""
        with self._lock:
            self._throttle.append((action, times))

    def throttle_above(self, rate: float, burst: float | None = None) -> None:
        """Calls beyond ``rate`` a second (bursts of ``burst``, default ``rate``) are throttled, as AWS's buckets do."""
        size = max(1.0, burst if burst is not None else rate)
        with self._lock:
            self._budget = _Budget(rate, size, size, self._clock())

    def fail(self, times: int, status: int = 500, action: str | None = None) -> None:
        """The next ``times`` calls (of ``action``, or any) answer a transient server error (500, 502, 503, 504)."""
        if status not in _TRANSIENT:
            raise ValueError(f"not a transient status: {status}")
        with self._lock:
            self._errors.append((action, status, times))

    def clear(self) -> None:
        with self._lock:
            self._throttle.clear()
            self._errors.clear()
            self._budget = None

    def check(self, action: str) -> RdsError | None:
        """The fault this call meets, if any (a one-shot fault is spent by it)."""
        with self._lock:
            for i, (wanted, times) in enumerate(self._throttle):
                if wanted in (None, action):
                    self._throttle[i] = (wanted, times - 1)
                    self._throttle = [t for t in self._throttle if t[1] > 0]
                    return THROTTLED
            for i, (wanted, status, times) in enumerate(self._errors):
                if wanted in (None, action):
                    self._errors[i] = (wanted, status, times - 1)
                    self._errors = [e for e in self._errors if e[2] > 0]
                    return RdsError(_TRANSIENT[status], "An internal error has occurred. Please try again.", status)
            if self._budget is not None and not self._budget.take(self._clock()):
                return THROTTLED
        return None


class CallLog:
    """Every call in order, with what it was answered; counts and a rate meter for tests and benchmarks."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._calls: list[Call] = []

    def record(self, action: str, instance: str, outcome: str, status: int) -> None:
        with self._lock:
            self._calls.append(Call(action, instance, self._clock(), outcome, status))

    def calls(self, action: str | None = None, instance: str | None = None) -> list[Call]:
        with self._lock:
            return [
                c
                for c in self._calls
                if (action is None or c.action == action) and (instance is None or c.instance == instance)
            ]

    def count(self, action: str | None = None, instance: str | None = None, outcome: str | None = None) -> int:
        """How many calls (of ``action``, on ``instance``, answered ``outcome``: each only if given) were made."""
        return sum(1 for c in self.calls(action, instance) if outcome is None or c.outcome == outcome)

    def by_action(self) -> Counter[str]:
        return Counter(c.action for c in self.calls())

    def rate(self, window: float = 1.0) -> float:
        """Calls a second over the last ``window`` seconds."""
        now = self._clock()
        return sum(1 for c in self.calls() if now - c.at <= window) / window

    def peak_rate(self, window: float = 1.0) -> float:
        """The most calls seen in any ``window`` seconds, per second (the number a request budget must bound)."""
        times = [c.at for c in self.calls()]
        best, start = 0, 0
        for end, at in enumerate(times):
            while at - times[start] > window:
                start += 1
            best = max(best, end - start + 1)
        return best / window

    def clear(self) -> None:
        with self._lock:
            self._calls.clear()
