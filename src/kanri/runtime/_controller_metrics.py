"""Controller metrics under controller-runtime's names, plus how long deleted objects have waited on finalizers."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kanri.runtime._store import Store

_RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8,
                      0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40,
                      50, 60)  # fmt: skip


class ControllerMetrics:
    """The reconcile metric families, registered once per registry and labelled by controller name."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.reconcile_total = Counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ["controller", "result"],
            registry=registry,
        )
        self.reconcile_errors = Counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            ["controller"],
            registry=registry,
        )
        self.terminal_errors = Counter(
            "controller_runtime_terminal_reconcile_errors_total",
            "Total number of terminal reconciliation errors per controller",
            ["controller"],
            registry=registry,
        )
        self.reconcile_time = Histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            buckets=_RECONCILE_BUCKETS,
            registry=registry,
        )
        self.active_workers = Gauge(
            "controller_runtime_active_workers",
            "Number of currently used workers per controller",
            ["controller"],
            registry=registry,
        )
        self.max_concurrent = Gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ["controller"],
            registry=registry,
        )
        self._deletions = _PendingDeletions()
        registry.register(self._deletions)

    def watch_deletions(self, controller: str, store: Store) -> None:
        """Report, for ``controller``'s primary objects, how long each deleted-but-finalized object has waited."""
        self._deletions.stores[controller] = store


class _PendingDeletions(Collector):
    """``kanri_finalizer_pending_seconds``: seconds since deletionTimestamp for objects still holding finalizers.

    Computed from the cache when scraped, so it costs nothing between scrapes and a stuck finalizer shows up as a
    steadily growing series (alert on it) instead of going unnoticed.
    """

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self.stores: dict[str, Store] = {}
        self._now = now

    def describe(self) -> Iterable[GaugeMetricFamily]:
        return [self._family()]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = self._family()
        now = self._now()
        for controller, store in self.stores.items():
            for obj in store.list():
                meta = obj["metadata"]
                stamp = meta.get("deletionTimestamp")
                if not stamp or not meta.get("finalizers"):
                    continue
                since = datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
                family.add_metric([controller, meta.get("namespace") or "", meta["name"]], max(0.0, now - since))
        yield family

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "kanri_finalizer_pending_seconds",
            "Seconds since deletionTimestamp of objects that still hold finalizers",
            labels=["controller", "namespace", "name"],
        )
