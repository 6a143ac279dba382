"""The Cache operator's metrics (kanri.kit.metric_name), per cache, set from the status each pass writes and removed
when the cache is gone."""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from kanri import kit
from kanri.cache.rollout.switchover import PLANNED

__all__ = ["CacheMetrics"]

LABELS = ["namespace", "cache"]


def _true(status: dict[str, Any], condition: str) -> bool:
    return any(c.get("type") == condition and c.get("status") == "True" for c in status.get("conditions") or [])


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.primaries = Gauge(kit.metric_name("cache", "cache", "primaries"),
                               "Pods of the cache that report themselves primary (more than one: split brain).",
                               LABELS, registry=registry)  # fmt: skip
        self.linked = Gauge(kit.metric_name("cache", "cache", "linked_replicas"),
                            "Replicas replicating from the primary with their link up.", LABELS,
                            registry=registry)  # fmt: skip
        self.failovers = Gauge(kit.metric_name("cache", "cache", "recorded_failovers"),
                               "Failovers Sentinel made on its own recorded in the cache's status (of its last 20 "
                               "records; planned switchovers of a rollout are not counted).", LABELS,
                               registry=registry)  # fmt: skip
        self.updating = Gauge(kit.metric_name("cache", "cache", "updating"),
                              "1 while pods are being replaced with the current template (the Updating condition).",
                              LABELS, registry=registry)  # fmt: skip
        self.ready = Gauge(kit.metric_name("cache", "cache", "ready"), "1 when the cache is Ready.", LABELS,
                           registry=registry)  # fmt: skip

    def observe(self, obj: dict[str, Any]) -> None:
        meta, status = obj["metadata"], obj.get("status") or {}
        key = (meta.get("namespace") or "", meta["name"])
        self.primaries.labels(*key).set(len(status.get("writablePrimaries") or []))
        self.linked.labels(*key).set(status.get("readyReplicas") or 0)
        records = status.get("failovers") or []
        planned = sum(1 for record in records if str(record.get("reason") or "").startswith(PLANNED))
        self.failovers.labels(*key).set(len(records) - planned)
        self.updating.labels(*key).set(1 if _true(status, "Updating") else 0)
        self.ready.labels(*key).set(1 if _true(status, "Ready") else 0)

    def forget(self, namespace: str, name: str) -> None:
        for gauge in (self.primaries, self.linked, self.failovers, self.ready, self.updating):
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)
