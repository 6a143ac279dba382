"""The cloud operator's metrics (names by kanri.kit.metric_name)."""

from __future__ import annotations

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from kanri import kit

__all__ = ["CloudMetrics"]


class CloudMetrics:
    """API calls by provider/action/outcome, waits for the request budget, and operations in flight."""

    def __init__(self, registry: CollectorRegistry = REGISTRY) -> None:
        self.calls = Counter(kit.metric_name("cloud", "api", "calls", counter=True),
                             "Provider API calls by provider, action and outcome (ok, throttled, retryable, refused).",
                             ["provider", "action", "outcome"], registry=registry)  # fmt: skip
        self.budget_waits = Counter(kit.metric_name("cloud", "budget", "waits", counter=True),
                                    "Calls put off because the request budget of their provider account and region "
                                    "was spent.", ["provider", "budget"], registry=registry)  # fmt: skip
        self.operations = Gauge(kit.metric_name("cloud", "operations", "in_flight"),
                                "Provider operations in flight (recorded in status, not yet ended).",
                                ["provider", "kind"], registry=registry)  # fmt: skip
        self._in_flight: dict[str, tuple[str, str]] = {}

    def operation(self, uid: str, provider: str, kind: str | None) -> None:
        """Record that the object ``uid`` has an operation ``kind`` in flight (None: none)."""
        before = self._in_flight.pop(uid, None)
        if kind is not None:
            self._in_flight[uid] = (provider, kind)
        for labels in {before, self._in_flight.get(uid)} - {None}:
            assert labels is not None
            count = sum(1 for value in self._in_flight.values() if value == labels)
            self.operations.labels(*labels).set(count)
