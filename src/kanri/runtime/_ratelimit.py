"""Rate limiters that decide how long a failed key waits before it is retried.

The defaults are controller-runtime's: per key, an exponential backoff from 5 ms doubling up to 1000 s; globally, a
token bucket of 10 retries per second with a burst of 100; the delay used is the larger of the two.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Protocol

from kanri.runtime._clock import Clock, SystemClock

__all__ = ["ExponentialBackoff", "MaxOfRateLimiter", "RateLimiter", "TokenBucket", "default_rate_limiter"]


class RateLimiter(Protocol):
    """Decides how long a key waits before its next retry, and counts its failures."""

    def when(self, key: Hashable) -> float:
        """Count one more failure of ``key`` and return the seconds it must wait before the retry."""
        ...

    def forget(self, key: Hashable) -> None:
        """Stop tracking ``key`` (it succeeded): its next failure starts from the smallest delay again."""

    def failures(self, key: Hashable) -> int:
        """How many failures of ``key`` are counted since it was last forgotten."""
        ...


class ExponentialBackoff:
    """Per-key exponential backoff: the n-th failure since ``forget`` waits ``min(base * 2**(n-1), maximum)``.

    The first failure waits ``base``, the second ``2 * base``, and so on, capped at ``maximum``.
    """

    def __init__(self, base: float = 0.005, maximum: float = 1000.0) -> None:
        if not 0 < base <= maximum:
            raise ValueError(f"need 0 < base <= maximum, got base={base}, maximum={maximum}")
        self.base = base
        self.maximum = maximum
        self._failures: dict[Hashable, int] = {}

    def delay(self, failures: int) -> float:
        """The delay for a key that has already failed ``failures`` times before this failure."""
        try:
            return min(math.ldexp(self.base, failures), self.maximum)
        except OverflowError:  # base * 2**failures is beyond a float: far past the cap
            return self.maximum

    def when(self, key: Hashable) -> float:
        """Count a failure of ``key`` and return its delay."""
        failures = self._failures.get(key, 0)
        self._failures[key] = failures + 1
        return self.delay(failures)

    def forget(self, key: Hashable) -> None:
        """Reset ``key`` to no failures."""
        self._failures.pop(key, None)

    def failures(self, key: Hashable) -> int:
        """Failures of ``key`` counted since it was last forgotten."""
        return self._failures.get(key, 0)


class TokenBucket:
    """A global token bucket: ``rate`` tokens per second, holding at most ``burst``; starts full.

    Like ``golang.org/x/time/rate``'s ``Reserve``, taking a token never fails: when the bucket is empty the caller
    goes into debt and is told how long to wait until its token exists. The bucket ignores keys: as a
    ``RateLimiter`` it limits the retries of all keys together.
    """

    def __init__(self, rate: float = 10.0, burst: int = 100, *, clock: Clock | None = None) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError(f"need rate > 0 and burst >= 1, got rate={rate}, burst={burst}")
        self.rate = rate
        self.burst = burst
        self._clock = clock if clock is not None else SystemClock()
        self._tokens = float(burst)
        self._last = self._clock.now()

    def reserve(self) -> float:
        """Take one token and return how many seconds the caller must wait before using it (0 if available now)."""
        now = self._clock.now()
        elapsed = max(0.0, now - self._last)
        self._last = max(self._last, now)
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate) - 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    def when(self, key: Hashable) -> float:
        """``reserve()``; the key does not matter."""
        return self.reserve()

    def forget(self, key: Hashable) -> None:
        """Nothing to forget: the bucket keeps no per-key state."""

    def failures(self, key: Hashable) -> int:
        """Always 0: the bucket keeps no per-key state."""
        return 0


class MaxOfRateLimiter:
    """Combines limiters: the delay is the largest of theirs, and failures the largest count."""

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one limiter")
        self.limiters = limiters

    def when(self, key: Hashable) -> float:
        """Ask every limiter (each counts the failure) and return the longest delay."""
        return max([limiter.when(key) for limiter in self.limiters])

    def forget(self, key: Hashable) -> None:
        """Forget ``key`` in every limiter."""
        for limiter in self.limiters:
            limiter.forget(key)

    def failures(self, key: Hashable) -> int:
        """The largest failure count any limiter holds for ``key``."""
        return max(limiter.failures(key) for limiter in self.limiters)


def default_rate_limiter(clock: Clock | None = None) -> MaxOfRateLimiter:
    """controller-runtime's default: per-key backoff 5 ms -> 1000 s, and 10 qps / burst 100 for all keys."""
    return MaxOfRateLimiter(ExponentialBackoff(), TokenBucket(clock=clock))
