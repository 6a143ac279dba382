"""The request budget: one token bucket per provider account/endpoint and region, shared by every DatabaseInstance
that calls it. Taking never waits: the caller gets how long to wait and requeues, so no worker blocks."""

from __future__ import annotations

from dataclasses import dataclass

from kanri.runtime import Clock, SystemClock

__all__ = ["Budgets", "TokenBucket"]


@dataclass
class TokenBucket:
    """``rate`` tokens per second up to ``burst``; a throttled answer pauses the bucket (``penalise``)."""

    rate: float
    burst: int
    tokens: float
    updated: float
    paused_until: float = 0.0
    penalty: float = 0.0

    def _refill(self, now: float) -> None:
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.updated) * self.rate)
        self.updated = now

    def take(self, now: float, *, credit: bool = False) -> float:
        """0.0 when a token was taken, else the seconds until one will be there.

        ``credit``: a follow-up call of a pass that already paid its first one may borrow one token while the bucket
        is not in debt (it goes down to -1; others wait until it is paid back). Without it, passes that need two
        calls (look, then create) livelock under contention: every token goes to someone's first call."""
        self._refill(now)
        if now < self.paused_until:
            return self.paused_until - now
        if self.tokens >= 1.0 or (credit and self.tokens >= 0.0):
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate

    def penalise(self, now: float) -> float:
        """The provider throttled us: empty the bucket and pause it, doubling the pause (1 s to 60 s) while the
        throttling goes on. Returns the pause."""
        self._refill(now)
        self.penalty = min(60.0, max(1.0, self.penalty * 2))
        self.tokens = 0.0
        self.paused_until = now + self.penalty
        return self.penalty

    def succeeded(self) -> None:
        """An accepted call: the next throttling starts again from a short pause."""
        self.penalty = 0.0


class Budgets:
    """Every bucket of the process, by budget key. The rate and burst follow the class last seen for a key (classes
    sharing an account and region should agree; the last one read wins)."""

    bucket_type: type[TokenBucket] = TokenBucket
    """The buckets' class (a test records grants with a subclass)."""

    def __init__(self, clock: Clock | None = None, *, max_in_flight: int = 2) -> None:
        self.clock = clock or SystemClock()
        self._buckets: dict[str, TokenBucket] = {}
        self.max_in_flight = max_in_flight
        """Calls one key may have under way at once: a provider that hangs holds at most this many workers."""
        self.in_flight: dict[str, int] = {}

    def bucket(self, key: str, rate: float, burst: int) -> TokenBucket:
        now = self.clock.now()
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = self.bucket_type(rate, burst, float(burst), now)
        elif (bucket.rate, bucket.burst) != (rate, burst):
            bucket._refill(now)
            bucket.rate, bucket.burst = rate, burst
            bucket.tokens = min(bucket.tokens, float(burst))
        return bucket

    def take(self, key: str, rate: float, burst: int, *, credit: bool = False) -> float:
        """0.0 when the call may go now, else the seconds to wait (``credit``: see TokenBucket.take)."""
        return self.bucket(key, rate, burst).take(self.clock.now(), credit=credit)

    def penalise(self, key: str, rate: float, burst: int) -> float:
        return self.bucket(key, rate, burst).penalise(self.clock.now())
