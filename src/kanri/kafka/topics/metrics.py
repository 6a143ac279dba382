"""The KafkaTopic controller's metrics: one series per topic (labels ``namespace`` and ``topic``, the KafkaTopic's
name), and one per consumer group reading it (``group``). Set after every pass from what the pass saw and staged;
removed when the KafkaTopic goes. The alerts on them are deploy/monitoring/kafka-alerts.yaml."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from kanri import kit
from kanri.kafka.topics.admin import AdminError
from kanri.kafka.topics.context import TopicPass

_LOG = logging.getLogger("kanri.kafka.metrics")

_TOPIC = {
    "partitions": "Partitions Kafka reports.",
    "desired_partitions": "Partitions asked for (spec.partitions).",
    "under_replicated_partitions": "Partitions with fewer in-sync replicas than replicas.",
    "replication_factor": "The smallest replica count of any partition, as Kafka reports it.",
    "desired_replication_factor": "spec.replicationFactor.",
    "ready": "1 when the Ready condition is True.",
    "growth_blocked": "1 while a partition growth step is held by a gate (lag, a rebalance, an approval).",
    "growth_steps_done": "Growth steps done (status.steps, the last 20).",
    "replicas_change_done_partitions": "Partitions with the new replication factor, while a change is under way.",
    "replicas_change_partitions": "Partitions of a replication-factor change under way (0: none).",
    "deletion_blocked": "1 while a Delete-policy topic's deletion waits (consumers, the approval, the cluster).",
}


def _now(ctx: TopicPass, field: str) -> Any:
    """``status.<field>`` as this pass leaves it (staged, else as read)."""
    staged = ctx.ledger.staged
    return staged[field] if field in staged else ctx.ledger.status.get(field)


class TopicMetrics:
    """Per-topic gauges and a per-group lag gauge."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["namespace", "topic"]
        self.gauges = {name: Gauge(kit.metric_name("kafka", "topic", name), text, labels, registry=registry)
                       for name, text in _TOPIC.items()}  # fmt: skip
        self.lag = Gauge(kit.metric_name("kafka", "topic", "consumer_lag"), "Messages a consumer group has not "
                         "consumed of what Kafka keeps, on the topic.", [*labels, "group"],
                         registry=registry)  # fmt: skip
        self._groups: dict[tuple[str, str], set[str]] = {}

    def _set(self, name: str, key: tuple[str, str], value: float) -> None:
        self.gauges[name].labels(*key).set(value)

    async def observe(self, ctx: TopicPass) -> None:
        key = (ctx.namespace, ctx.name)
        spec = ctx.spec
        self._set("desired_partitions", key, spec.partitions)
        self._set("desired_replication_factor", key, spec.replication_factor)
        ready = ctx.ledger.staged_condition("Ready") or ctx.ledger.condition_now("Ready") or {}
        self._set("ready", key, 1 if ready.get("status") in (True, "True") else 0)
        growth = _now(ctx, "growth") or {}
        self._set("growth_blocked", key, 1 if growth.get("blockedBy") and not growth.get("step") and
                  ready.get("reason") != "GrowthPaused" else 0)  # fmt: skip
        self._set("growth_steps_done", key, len(_now(ctx, "steps") or []))
        change = _now(ctx, "replicasChange") or {}
        self._set("replicas_change_done_partitions", key, change.get("partitionsDone", 0))
        self._set("replicas_change_partitions", key, change.get("partitionsTotal", 0))
        self._set("deletion_blocked", key, 1 if _now(ctx, "deletionBlockedBy") else 0)
        if ctx.observed is None:
            return
        self._set("partitions", key, ctx.observed.partitions)
        self._set("under_replicated_partitions", key, ctx.observed.under_replicated)
        self._set("replication_factor", key, ctx.observed.replication_factor)
        if ctx.admin is not None:
            await self._lags(ctx, key)

    async def _lags(self, ctx: TopicPass, key: tuple[str, str]) -> None:
        assert ctx.admin is not None
        assert ctx.observed is not None
        try:
            lags = await ctx.admin.lag_by_group(ctx.topic, ctx.observed.partitions, ctx.timings.group_offsets_age)
        except AdminError as exc:  # a metric is no reason to fail the pass; the next one tries again
            _LOG.info("consumer lag of topic %s not read: %s", ctx.topic, exc)
            return
        for group, lag in lags.items():
            self.lag.labels(*key, group).set(lag)
        for gone in self._groups.get(key, set()) - set(lags):
            with contextlib.suppress(KeyError):
                self.lag.remove(*key, gone)
        self._groups[key] = set(lags)

    def forget(self, namespace: str, name: str) -> None:
        for gauge in self.gauges.values():
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)
        for group in self._groups.pop((namespace, name), set()):
            with contextlib.suppress(KeyError):
                self.lag.remove(namespace, name, group)
