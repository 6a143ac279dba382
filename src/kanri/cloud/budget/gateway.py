"""Every provider call goes through a Gateway: the request budget is paid first (or the call is put off with the
seconds to wait), throttling answers pause the budget, and each call is counted by outcome."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from kanri.cloud.budget.buckets import Budgets
from kanri.cloud.metrics import CloudMetrics
from kanri.cloud.providers.base import Provider, ProviderError, Retryable, Throttled

__all__ = ["BudgetSpent", "Gateway"]

T = TypeVar("T")
_BUSY_RETRY = 2.0  # seconds until a pass put off by the in-flight limit looks again


class BudgetSpent(Exception):
    """The call was not made: the request budget is spent (or paused after throttling) for ``wait`` seconds."""

    def __init__(self, wait: float, *, throttled: bool, budget: str, busy: bool = False) -> None:
        super().__init__(f"request budget {budget} spent: next call in {wait:.1f}s")
        self.wait, self.throttled, self.budget, self.busy = wait, throttled, budget, busy


class Gateway:
    """One provider with its budget, for one pass: ``await gateway.call("describe", lambda p: p.describe(id))``."""

    def __init__(self, provider: Provider, budgets: Budgets, metrics: CloudMetrics, *, rate: float,
                 burst: int) -> None:  # fmt: skip
        self.provider, self.budgets, self.metrics = provider, budgets, metrics
        self.rate, self.burst = rate, burst
        self.key = provider.budget_key()
        self.calls = 0
        """Calls this gateway (one pass) made: the first is paid from the bucket, a follow-up may borrow."""

    async def call(self, action: str, call: Callable[[Provider], Awaitable[T]]) -> T:
        """Pay the budget and make the call; raises BudgetSpent instead of waiting."""
        budgets = self.budgets
        if budgets.in_flight.get(self.key, 0) >= budgets.max_in_flight:
            # the provider is slow to answer the calls already under way: do not give it another worker
            self.metrics.budget_waits.labels(self.provider.name, self.key).inc()
            raise BudgetSpent(_BUSY_RETRY, throttled=False, budget=self.key, busy=True)
        bucket, now = budgets.bucket(self.key, self.rate, self.burst), budgets.clock.now()
        wait = bucket.take(now, credit=self.calls > 0)
        if wait > 0:
            self.metrics.budget_waits.labels(self.provider.name, self.key).inc()
            raise BudgetSpent(wait, throttled=now < bucket.paused_until, budget=self.key)
        self.calls += 1
        budgets.in_flight[self.key] = budgets.in_flight.get(self.key, 0) + 1
        try:
            result = await call(self.provider)
        except Throttled:
            self.metrics.calls.labels(self.provider.name, action, "throttled").inc()
            pause = self.budgets.penalise(self.key, self.rate, self.burst)
            raise BudgetSpent(pause, throttled=True, budget=self.key) from None
        except Retryable:
            self.metrics.calls.labels(self.provider.name, action, "retryable").inc()
            raise
        except ProviderError:
            self.metrics.calls.labels(self.provider.name, action, "refused").inc()
            raise
        finally:
            budgets.in_flight[self.key] -= 1
        self.budgets.bucket(self.key, self.rate, self.burst).succeeded()
        self.metrics.calls.labels(self.provider.name, action, "ok").inc()
        return result
