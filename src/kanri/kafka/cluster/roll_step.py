"""A KafkaCluster's rolling restart carried out: the StatefulSet is ``OnDelete``, so a new revision (a config
change) restarts no broker by itself; this step deletes one outdated pod at a time, when :mod:`.rolling` says the
broker may stop — every broker ready, and no partition taken under ``min.insync.replicas`` — read from Kafka's
in-sync replicas at each pass. ``status.rollingRestart`` says what was restarted or what the next restart waits
for; an Event is sent per restart and per new reason to wait."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kanri import kit
from kanri import runtime as kr
from kanri.kafka.cluster import rolling
from kanri.kafka.topics.admin import AdminError
from kanri.kafka.topics.context import Admins
from kanri.runtime import format_time
from kanri.runtime.kinds import POD, STATEFUL_SET

REVISION = "controller-revision-hash"
FIELD = "rollingRestart"
#: How soon a rolling restart under way is looked at again.
POLL_SECONDS = 2.0


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return ready and not pod["metadata"].get("deletionTimestamp")


def broker_pods(ctx: kit.PassContext, revision: str, replicas: int) -> list[rolling.BrokerPod]:
    """One entry per node id: a missing or terminating pod counts as not ready (it is being restarted)."""
    pods = {pod["metadata"]["name"]: pod for pod in ctx.cache.list(POD, ctx.namespace, ctx.labels.selector(ctx.name))}
    found = []
    for node in range(replicas):
        name = f"{ctx.name}-{node}"
        pod = pods.get(name)
        if pod is None:
            found.append(rolling.BrokerPod(name, node, ready=False, current=True))
            continue
        current = (pod["metadata"].get("labels") or {}).get(REVISION) == revision
        found.append(rolling.BrokerPod(name, node, ready=_ready(pod), current=current))
    return found


def roll(admins: Admins, replicas_of: Callable[[kit.PassContext], int]) -> kit.Step:
    """The step; ``replicas_of(ctx)`` is the cluster's node count (its spec)."""

    async def step(ctx: kit.PassContext) -> kr.Result | None:
        statefulset = ctx.cache.get(STATEFUL_SET, ctx.name, ctx.namespace) or {}
        revision = (statefulset.get("status") or {}).get("updateRevision")
        if not revision:
            return None
        pods = broker_pods(ctx, revision, replicas_of(ctx))
        if all(pod.current for pod in pods):
            if ctx.ledger.status.get(FIELD):
                ctx.ledger.stage(FIELD, None)
                await ctx.events.normal(ctx.obj, "RollingRestartDone", "every broker runs the current revision")
            return None
        decision = await _decide(ctx, admins, pods)
        ctx.ledger.stage("phase", "Restarting")
        ctx.requeue(POLL_SECONDS)
        if isinstance(decision, rolling.Hold):
            message = f"{decision.reason}: {decision.message}"
            if ctx.ledger.status.get(FIELD) != message:
                await ctx.events.normal(ctx.obj, "RestartHeld", message)
            ctx.ledger.stage(FIELD, message)
            return None
        assert isinstance(decision, rolling.Restart)
        await ctx.client.delete(POD, decision.pod, ctx.namespace)
        message = f"restarted {decision.pod} (broker {decision.node_id}) at {format_time(datetime.now(UTC))}"
        ctx.ledger.stage(FIELD, message)
        await ctx.events.normal(ctx.obj, "BrokerRestarted", f"{decision.pod} restarted for revision {revision}: no "
                                "partition falls under min.insync.replicas while it is down")  # fmt: skip
        return None

    return step


async def _decide(
    ctx: kit.PassContext, admins: Admins, pods: list[rolling.BrokerPod]
) -> rolling.Restart | rolling.Hold:
    bootstrap = ctx.ledger.staged.get("bootstrap") or ctx.ledger.status.get("bootstrap")
    if not bootstrap:
        return rolling.Hold("KafkaUnreachable", "no broker answers: the in-sync replicas cannot be read")
    try:
        rows = await admins.of((ctx.namespace, ctx.name), bootstrap).in_sync()
    except AdminError as exc:
        return rolling.Hold("KafkaUnreachable", f"the in-sync replicas cannot be read: {exc}")
    decision = rolling.next_restart(pods, [rolling.PartitionIsr(*row) for row in rows])
    assert decision is not None  # some pod is outdated
    return decision
