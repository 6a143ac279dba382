"""The KafkaCluster controller's metrics: one series per cluster (labels ``namespace`` and ``cluster``), set after
every pass from what it saw and staged, removed when the KafkaCluster goes. On the operator's registry (the
manager's, served at /metrics). The alerts on them are deploy/monitoring/kafka-alerts.yaml."""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from kanri import kit
from kanri.kafka.cluster import health
from kanri.kafka.cluster.context import REPLICAS_REFUSED, ClusterPass

_CLUSTER = {
    "desired_brokers": "Nodes asked for (spec.replicas).",
    "ready_brokers": "Broker pods ready.",
    "registered_brokers": "Brokers the cluster's metadata lists.",
    "under_replicated_partitions": "Partitions with fewer in-sync replicas than replicas (internal topics included).",
    "offline_partitions": "Partitions without a leader.",
    "quorum_voters": "Controller voters of the metadata log (DescribeQuorum).",
    "quorum_voters_caught_up": "Controller voters caught up with the quorum leader.",
    "ready": "1 when the Ready condition is True.",
    "rolling_restart": "1 while a rolling restart is under way.",
    "rolling_restart_held": "1 while the next broker restart of a rolling restart waits (a broker not ready, "
    "min.insync.replicas).",
    "replicas_change_refused": "1 while a change of spec.replicas is refused (ScaleDownRefused, DrainImpossible, "
    "VoterListFixed).",
    "controllers": "KRaft controller voters (nodes 0..n-1).",
    "rebalance": "1 while partition replicas are moved onto added brokers or off drained ones.",
    "rebalance_partitions_remaining": "Partitions a rebalance still has to move (moving ones included).",
    "rebalance_partitions_moved": "Partitions the rebalance under way has asked Kafka to move so far.",
    "rebalance_held": "1 while a rebalance starts no move (a broker not ready, under-replicated partitions).",
}


def _now(ctx: ClusterPass, field: str) -> Any:
    staged = ctx.ledger.staged
    return staged[field] if field in staged else ctx.ledger.status.get(field)


class ClusterMetrics:
    """Per-cluster gauges."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.gauges = {name: Gauge(kit.metric_name("kafka", "cluster", name), text, ["namespace", "cluster"],
                                   registry=registry) for name, text in _CLUSTER.items()}  # fmt: skip

    def _set(self, name: str, key: tuple[str, str], value: float) -> None:
        self.gauges[name].labels(*key).set(value)

    def observe(self, ctx: ClusterPass) -> None:
        key = (ctx.namespace, ctx.name)
        self._set("desired_brokers", key, ctx.spec.replicas)
        self._set("ready_brokers", key, _now(ctx, "readyBrokers") or 0)
        ready = ctx.ledger.staged_condition("Ready") or ctx.ledger.condition_now("Ready") or {}
        self._set("ready", key, 1 if ready.get("status") in (True, "True") else 0)
        rolling = _now(ctx, "rollingRestart")
        self._set("rolling_restart", key, 1 if rolling else 0)
        self._set("rolling_restart_held", key, 1 if rolling and not str(rolling).startswith("restarted") else 0)
        self._set("replicas_change_refused", key, 1 if set(ctx.problems.reasons()) & set(REPLICAS_REFUSED) else 0)
        self._set("controllers", key, _now(ctx, "controllers") or 0)
        record = _now(ctx, "rebalance") or {}
        self._set("rebalance", key, 1 if record else 0)
        self._set("rebalance_partitions_remaining", key, record.get("remaining") or 0)
        self._set("rebalance_partitions_moved", key, record.get("moved") or 0)
        self._set("rebalance_held", key, 1 if record.get("blockedBy") else 0)
        view = ctx.kafka
        if view is None:  # Kafka not read this pass: its numbers are unknown, not zero
            for name in ("registered_brokers", "under_replicated_partitions", "offline_partitions", "quorum_voters",
                         "quorum_voters_caught_up"):  # fmt: skip
                with contextlib.suppress(KeyError):
                    self.gauges[name].remove(*key)
            return
        self._set("registered_brokers", key, len(view.brokers))
        self._set("under_replicated_partitions", key, health.under_replicated(view.partitions))
        self._set("offline_partitions", key, len(health.offline(view.partitions)))
        if view.quorum is not None:
            voters = health.voters(view.quorum)
            self._set("quorum_voters", key, len(voters))
            self._set("quorum_voters_caught_up", key, sum(1 for v in voters if v.caught_up))

    def forget(self, namespace: str, name: str) -> None:
        for gauge in self.gauges.values():
            with contextlib.suppress(KeyError):
                gauge.remove(namespace, name)
