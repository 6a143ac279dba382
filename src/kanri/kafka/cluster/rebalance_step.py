"""A rebalance carried out: partition replicas moved onto the brokers a scale-up added, or off the brokers a
scale-down removes (a drain), as a throttled reassignment tracked in ``status.rebalance``
(:class:`kanri.kafka.api.Rebalance`).

The record is committed *before* anything changes — a scale-up's before the StatefulSet grows, a drain's before
Kafka is asked to move a replica — so an operator restarted mid-way finds it and carries on. Each pass then reads
where every replica is and what Kafka is still moving (one ListPartitionReassignments for the cluster), and asks
for at most :data:`MAX_MOVING` partitions moving at once (:func:`.rebalance.progress`). New moves wait while a
broker is not ready or not registered, a rolling restart is under way, or a partition not being moved is
under-replicated: a move adds load to a cluster that is already short of a copy. The moving replicas, and only
those, are throttled to :data:`THROTTLE_BYTES_PER_SECOND` per broker; the throttle is lifted from every topic the
rebalance touched when it is done. The phase is ``Rebalancing`` while the record exists; Events say when it
starts, what holds it, and when it is done.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

from kanri import kit
from kanri import runtime as kr
from kanri.kafka.api import Rebalance
from kanri.kafka.cluster import rebalance
from kanri.kafka.cluster.context import DRAIN_IMPOSSIBLE, ClusterContext, ClusterStep
from kanri.kafka.cluster.scale import ScaleDecision
from kanri.kafka.topics import reassign_wire
from kanri.kafka.topics.admin import AdminError, TopicAdmin
from kanri.kafka.topics.context import Admins

FIELD = "rebalance"
#: The replication throttle on moving replicas (bytes per second, per broker, leader and follower side).
THROTTLE_BYTES_PER_SECOND = 20 * 1024 * 1024
#: Partitions Kafka moves at once.
MAX_MOVING = 8
POLL_SECONDS = 2.0
_IN_PROGRESS = "REASSIGNMENT_IN_PROGRESS"


def _now() -> datetime:
    return datetime.now(UTC)


async def record_start(ctx: ClusterContext, current: int | None, decision: ScaleDecision) -> None:
    """Put a scale-up or a drain on record before the StatefulSet (or Kafka) is changed for it; a drain no longer
    asked for (the spec or the annotation changed) becomes a plain rebalance of what is left."""
    record = ctx.ledger.record(FIELD, Rebalance)
    if decision.draining:
        if record is not None and record.reason == "Drain" and tuple(record.draining) == decision.draining:
            return
        started = Rebalance(reason="Drain", brokers=list(range(current or decision.replicas)),
                            draining=list(decision.draining), started=_now(),
                            throttle_bytes_per_second=THROTTLE_BYTES_PER_SECOND,
                            topics=record.topics if record is not None else [])  # fmt: skip
        await ctx.ledger.commit(FIELD, started)
        named = ", ".join(map(str, decision.draining))
        await ctx.events.normal(ctx.obj, "DrainStarted", f"moving every partition replica off broker {named} before "
                                f"replicas {current} -> {ctx.spec.replicas}, throttled to "
                                f"{THROTTLE_BYTES_PER_SECOND} B/s per broker")  # fmt: skip
        return
    if current is not None and decision.replicas > current:
        started = Rebalance(reason="ScaleUp", brokers=list(range(decision.replicas)), started=_now(),
                            throttle_bytes_per_second=THROTTLE_BYTES_PER_SECOND,
                            topics=record.topics if record is not None else [])  # fmt: skip
        await ctx.ledger.commit(FIELD, started)
        added = ", ".join(map(str, range(current, decision.replicas)))
        await ctx.events.normal(ctx.obj, "ScaleUp", f"replicas {current} -> {decision.replicas}: broker {added} "
                                f"added (broker only); partition replicas will be moved onto it, throttled to "
                                f"{THROTTLE_BYTES_PER_SECOND} B/s per broker")  # fmt: skip
        return
    if record is None:
        return
    brokers = list(range(decision.replicas))
    if record.reason == "Drain":  # the drain is no longer asked for
        await ctx.ledger.commit(FIELD, record.model_copy(update={"reason": "ScaleUp", "draining": [],
                                                                 "brokers": brokers}))  # fmt: skip
        await ctx.events.normal(ctx.obj, "DrainStopped", "the scale-down that asked for the drain is gone; the "
                                "replicas are spread over every broker again")  # fmt: skip
    elif record.brokers != brokers:  # scaled down (nodes holding nothing) while spreading onto them
        await ctx.ledger.commit(FIELD, record.model_copy(update={"brokers": brokers}))


def _blocked(ctx: ClusterContext, record: Rebalance) -> str | None:
    """Why no move may start now."""
    assert ctx.kafka is not None
    nodes = range(max(record.brokers, default=-1) + 1)
    brokers = {b["nodeId"]: b for b in ctx.ledger.staged.get("brokers") or []}
    if waiting := [n for n in nodes if not brokers.get(n, {}).get("ready")]:
        return f"broker {', '.join(map(str, waiting))} not ready"
    if missing := sorted(set(nodes) - set(ctx.kafka.brokers)):
        return f"broker {', '.join(map(str, missing))} not registered with the cluster"
    if ctx.ledger.staged.get("rollingRestart"):
        return "a rolling restart is under way"
    return None


def step(admins: Admins) -> ClusterStep:
    """The step (after the rolling restart's)."""

    async def run(ctx: ClusterContext) -> kr.Result | None:
        record = ctx.ledger.record(FIELD, Rebalance)
        if record is None:
            return None
        ctx.ledger.stage("phase", "Rebalancing")
        ctx.requeue(POLL_SECONDS)
        bootstrap = ctx.ledger.staged.get("bootstrap")
        if ctx.kafka is None or not bootstrap:
            ctx.ledger.stage(FIELD, record.model_copy(update={"blocked_by": "Kafka not read this pass"}))
            return None
        admin = admins.of((ctx.namespace, ctx.name), bootstrap)
        try:
            await _carry_on(ctx, admin, record, bootstrap)
        except AdminError as exc:
            ctx.ledger.stage(FIELD, record.model_copy(update={"blocked_by": f"Kafka: {exc}"}))
        return None

    return run


async def _carry_on(ctx: ClusterContext, admin: TopicAdmin, record: Rebalance, bootstrap: str) -> None:
    assert ctx.kafka is not None
    assignment = {(p.topic, p.partition): p.replicas for p in ctx.kafka.partitions}
    found = await reassign_wire.ongoing_all(bootstrap, admin.timeout)
    moving = {key: rebalance.Moving(o.replicas, o.adding, o.removing) for key, o in found.items() if key in
              assignment}  # fmt: skip
    progress = rebalance.progress(assignment, moving, record.brokers, record.draining)
    if progress.finished and not progress.unplaceable:
        await _finish(ctx, admin, record)
        return
    blocked = _blocked(ctx, record)
    if blocked is None:
        short = [p for p in ctx.kafka.partitions if len(p.isr) < len(p.replicas) and (p.topic, p.partition)
                 not in moving]  # fmt: skip
        if short:
            blocked = f"{len(short)} partitions not being moved are under-replicated"
    if progress.unplaceable:
        topic, partition = progress.unplaceable[0]
        message = f"{len(progress.unplaceable)} partitions on broker {', '.join(map(str, record.draining))} cannot " \
            f"move: the other brokers cannot hold their replication factor (first: {topic}-{partition}); lower " \
            f"the topic's replicationFactor or keep the broker"  # fmt: skip
        ctx.problems.add(kit.Problem(DRAIN_IMPOSSIBLE, message))
    batch = progress.batch(MAX_MOVING) if blocked is None else {}
    moved = record.moved
    topics = sorted(set(record.topics) | {topic for topic, _ in batch})
    if batch:
        if topics != record.topics:  # on record before any replica is throttled (a restart lifts them)
            record = record.model_copy(update={"topics": topics})
            await ctx.ledger.commit(FIELD, record)
        brokers = sorted(set(record.brokers) | set(ctx.kafka.brokers))
        await admin.replication_rate(brokers, record.throttle_bytes_per_second)
        for topic, (leaders, followers) in rebalance.throttled(batch, assignment, moving).items():
            await admin.throttle_replicas(topic, leaders, followers)
        by_topic: dict[str, dict[int, list[int]]] = defaultdict(dict)
        for (topic, partition), target in batch.items():
            by_topic[topic][partition] = target
        for topic, targets in sorted(by_topic.items()):
            refused = await reassign_wire.alter(bootstrap, topic, targets, admin.timeout)
            moved += len(targets) - len(refused)
            if fatal := {p: e for p, e in refused.items() if not e.retriable and e.code != _IN_PROGRESS}:
                first = min(fatal)
                message = f"Kafka refused to move {len(fatal)} partitions of {topic} (partition {first}: " \
                    f"{fatal[first]})"  # fmt: skip
                ctx.problems.add(kit.Problem("RebalanceRefused", message))
    update = {"moved": moved, "moving": len(moving) + len(batch), "blocked_by": blocked,
              "remaining": len(progress.to_move) + len(moving)}  # fmt: skip
    if blocked is not None and blocked != record.blocked_by:
        await ctx.events.normal(ctx.obj, "RebalanceHeld", f"no partition move starts while {blocked}")
    ctx.ledger.stage(FIELD, record.model_copy(update=update))


async def _finish(ctx: ClusterContext, admin: TopicAdmin, record: Rebalance) -> None:
    """Every replica where it belongs: the throttles lifted, the record cleared (a drain's scale-down is applied
    by the next pass, which finds the brokers empty)."""
    for topic in record.topics:
        try:
            await admin.throttle_replicas(topic, "", "")
        except AdminError as exc:
            if exc.code != "UNKNOWN_TOPIC_OR_PART":  # a topic deleted meanwhile has nothing to lift
                raise
    await ctx.ledger.commit(FIELD, None)
    ctx.ledger.stage(FIELD, None)
    seconds = (_now() - record.started).total_seconds()
    what = f"broker {', '.join(map(str, record.draining))} drained" if record.draining else \
        f"replicas spread over brokers {', '.join(map(str, record.brokers))}"  # fmt: skip
    await ctx.events.normal(ctx.obj, "RebalanceDone", f"{what}: {record.moved} partitions moved in {seconds:.0f} s; "
                            "throttle lifted")  # fmt: skip
    ctx.requeue(0.5)
