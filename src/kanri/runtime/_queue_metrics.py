"""Prometheus metrics for work queues, under controller-runtime's names so existing dashboards work unchanged."""

from __future__ import annotations

from collections.abc import Hashable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from kanri.runtime._clock import Clock

__all__ = ["QueueMetrics", "WorkQueueMetrics"]

# controller-runtime's buckets: 10 ns to 1000 s, one per power of ten.
_DURATION_BUCKETS = tuple(10.0**exponent for exponent in range(-8, 4))


class WorkQueueMetrics:
    """The work-queue metric families, registered once in ``registry`` and shared by every queue.

    Each queue labels its series with its ``name`` (the controller's name); see ``for_queue``.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.depth = Gauge("workqueue_depth", "Current depth of workqueue", ["name"], registry=registry)
        self.adds = Counter(
            "workqueue_adds_total", "Total number of adds handled by workqueue", ["name"], registry=registry
        )
        self.queue_duration = Histogram(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
            ["name"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.work_duration = Histogram(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
            ["name"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.retries = Counter(
            "workqueue_retries_total", "Total number of retries handled by workqueue", ["name"], registry=registry
        )
        self.unfinished_work = Gauge(
            "workqueue_unfinished_work_seconds",
            "How many seconds of work has been done that is in progress and hasn't been observed by work_duration. "
            "Large values indicate stuck threads.",
            ["name"],
            registry=registry,
        )
        self.longest_running = Gauge(
            "workqueue_longest_running_processor_seconds",
            "How many seconds has the longest running processor for workqueue been running",
            ["name"],
            registry=registry,
        )
        self.namespace_depth = Gauge(
            "kanri_workqueue_namespace_depth",
            'Keys ready to be handed out, per namespace (cluster-scoped keys under namespace "")',
            ["name", "namespace"],
            registry=registry,
        )

    def for_queue(self, name: str, clock: Clock) -> QueueMetrics:
        """The recorder for one queue. Queue names should be unique: a second queue of the same name takes over."""
        return QueueMetrics(self, name, clock)


class QueueMetrics:
    """Records one queue's events into the shared families; the unfinished-work gauges are computed on collect."""

    def __init__(self, families: WorkQueueMetrics, name: str, clock: Clock) -> None:
        self._families = families
        self._name = name
        self._clock = clock
        self._depth = families.depth.labels(name)
        self._adds = families.adds.labels(name)
        self._queue_duration = families.queue_duration.labels(name)
        self._work_duration = families.work_duration.labels(name)
        self._retries = families.retries.labels(name)
        self._started: dict[Hashable, float] = {}
        self._namespaces: set[str] = set()
        families.unfinished_work.labels(name).set_function(self.unfinished_seconds)
        families.longest_running.labels(name).set_function(self.longest_running_seconds)
        self._depth.set(0)

    def added(self) -> None:
        """A key became pending (a deduplicated add is not counted)."""
        self._adds.inc()

    def retried(self) -> None:
        """A key was added through the rate limiter."""
        self._retries.inc()

    def set_depth(self, depth: int) -> None:
        """The number of keys ready to be handed out."""
        self._depth.set(depth)

    def set_namespace_depth(self, namespace: str, depth: int) -> None:
        """Ready keys of one namespace; at 0 the series is removed so old namespaces do not pile up."""
        if depth:
            self._families.namespace_depth.labels(self._name, namespace).set(depth)
            self._namespaces.add(namespace)
        elif namespace in self._namespaces:
            self._families.namespace_depth.remove(self._name, namespace)
            self._namespaces.discard(namespace)

    def started(self, key: Hashable, waited: float) -> None:
        """A worker took ``key`` after it waited ``waited`` seconds ready in the queue."""
        self._queue_duration.observe(max(0.0, waited))
        self._started[key] = self._clock.now()

    def finished(self, key: Hashable) -> None:
        """A worker called ``done`` for ``key``."""
        start = self._started.pop(key, None)
        if start is not None:
            self._work_duration.observe(max(0.0, self._clock.now() - start))

    def unfinished_seconds(self) -> float:
        """Seconds of work in progress, summed over all keys being processed."""
        now = self._clock.now()
        return sum(now - start for start in self._started.values())

    def longest_running_seconds(self) -> float:
        """Seconds the longest-running key has been processed (0 when idle)."""
        now = self._clock.now()
        return max((now - start for start in self._started.values()), default=0.0)
