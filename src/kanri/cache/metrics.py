"""The Cache operator's metrics (kanri.kit.metric_name), per cache, set from the status each pass writes and removed
when the cache is gone."""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from kanri import kit

__all__ = ["CacheMetrics"]

LABELS = ["namespace", "cache"]


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.primaries = Gauge(kit.metric_name("cache", "cache", "primaries"),
                               "Pods of the cache that report themselves primary (more than one: split brain).",
                               LABELS, registry=registry)  # fmt: skip
        self.linked = Gauge(kit.metric_name("cache", "cache", "linked_replicas"),
                            "Replicas replicating from the primary with their link up.", LABELS,
                            registry=registry)  # fmt: skip
        self.failovers = Gauge(kit.metric_name("cache", "cache", "recorded_failovers"),
                               "Failovers recorded in the cache's status (at most the last 20).", LABELS,
                               registry=registry)  # fmt: skip
        self.ready = Gauge(kit.metric_name("cache", "cache", "ready"), "1 when the cache is Ready.", LABELS,
                           registry=registry)  # fmt: skip

    def observe(self, obj: dict[str, Any]) -> None:
        meta, status = obj["metadata"], obj.get("status") or {}
        key = (meta.get("namespace") or "", meta["name"])
        self.primaries.labels(*key).set(len(status.get("writablePrimaries") or []))
        self.linked.labels(*key).set(status.get("readyReplicas") or 0)
        self.failovers.labels(*key).set(len(status.get("failovers") or []))
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        self.ready.labels(*key).set(1 if ready else 0)

    def forget(self, namespace: str, name: str) -> None:
        for gauge in (self.primaries, self.linked, self.failovers, self.ready):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)
