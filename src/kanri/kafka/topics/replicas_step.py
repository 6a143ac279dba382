"""A replication-factor change carried out: a throttled partition reassignment tracked in
``status.replicasChange`` (kanri.kafka.api.ReplicasChange).

The record (from, to, start, throttle) is committed *before* Kafka is asked to move anything; each pass then reads
where the replicas are and what Kafka is still moving (ListPartitionReassignments), asks it to move only the
partitions that are neither done nor moving (:func:`.replicas.progress`), and records how many are done. An
operator restarted mid-change finds the record and carries on from what Kafka reports. While replicas move, every
replica of the topic is throttled to :data:`THROTTLE_BYTES_PER_SECOND` per broker (catching up does not starve
producers); the throttle is lifted when the change is done.
"""

from __future__ import annotations

from kanri import kit
from kanri.kafka.api import ReplicasChange
from kanri.kafka.topics import reassign_wire, replicas
from kanri.kafka.topics.admin import AdminError
from kanri.kafka.topics.context import TopicContext
from kanri.kafka.topics.steps import not_ready
from kanri.runtime import Result

#: The replication throttle while replicas catch up (bytes per second, per broker, leader and follower side).
THROTTLE_BYTES_PER_SECOND = 20 * 1024 * 1024
#: How soon a change under way is looked at again.
POLL_SECONDS = 2.0
FIELD = "replicasChange"


async def change(ctx: TopicContext) -> Result | None:
    """Start, carry on or finish a replication-factor change; None when the topic has the spec's factor."""
    assert ctx.admin is not None
    assert ctx.observed is not None
    want = ctx.spec.replication_factor
    record = ctx.ledger.record(FIELD, ReplicasChange)
    if record is None and ctx.observed.replication_factor == max(ctx.observed.max_replication_factor, want) == want:
        return None
    brokers = await ctx.admin.broker_ids()
    if (refusal := replicas.too_many(want, len(brokers), ctx.topic, ctx.spec.cluster)) is not None:
        not_ready(ctx, "Blocked", "ReplicationFactorTooLarge", refusal)
        ctx.problems.add(kit.Problem("ReplicationFactorTooLarge", refusal))
        return Result(requeue_after=60)
    assignment = await ctx.admin.assignment(ctx.topic)
    moving = await reassign_wire.ongoing(ctx.admin.bootstrap, ctx.topic, sorted(assignment), ctx.admin.timeout)
    progress = replicas.progress(assignment, set(moving), brokers, want)
    if record is None or record.to_replicas != want:
        record = await _begin(ctx, record, want, brokers, progress)
    if progress.finished:
        await _finish(ctx, record)
        return None
    if progress.to_move:
        refused = await reassign_wire.alter(ctx.admin.bootstrap, ctx.topic, progress.to_move, ctx.admin.timeout)
        if refused:
            await _refused(ctx, refused)
    ctx.admin.written(ctx.topic)
    ctx.ledger.stage(FIELD, record.model_copy(update={"partitions_done": progress.done}))
    message = f"replication factor {record.from_replicas} -> {want}: {progress.done} of {progress.total} " \
        f"partitions done, {progress.moving} moving (throttled to {record.throttle_bytes_per_second} B/s)"  # fmt: skip
    not_ready(ctx, "ChangingReplicas", "ReplicasChanging", message)
    return Result(requeue_after=POLL_SECONDS)


async def _begin(
    ctx: TopicContext, record: ReplicasChange | None, want: int, brokers: list[int], progress: replicas.Progress
) -> ReplicasChange:
    """The change on record before Kafka is asked (a restart finds it), then the throttle, then an Event."""
    assert ctx.admin is not None
    assert ctx.observed is not None
    have = ctx.observed.max_replication_factor if want < ctx.observed.max_replication_factor else \
        ctx.observed.replication_factor  # fmt: skip
    started = ReplicasChange(from_replicas=have, to_replicas=want, started=ctx.now(), partitions_done=progress.done,
                             partitions_total=progress.total,
                             throttle_bytes_per_second=THROTTLE_BYTES_PER_SECOND)  # fmt: skip
    if record is not None:  # the spec changed again mid-change: same record, new target
        started = record.model_copy(update={"to_replicas": want, "partitions_done": progress.done})
    await ctx.ledger.commit(FIELD, started)
    await ctx.admin.throttle(ctx.topic, brokers, started.throttle_bytes_per_second)
    await ctx.events.normal(ctx.obj, "ReplicasChangeStarted", f"topic {ctx.topic}: replication factor "
                            f"{started.from_replicas} -> {want} by reassignment of {progress.total - progress.done} "
                            f"partitions, throttled to {started.throttle_bytes_per_second} B/s per broker")  # fmt: skip
    return started


async def _finish(ctx: TopicContext, record: ReplicasChange) -> None:
    assert ctx.admin is not None
    await ctx.admin.throttle(ctx.topic, [], None)
    ctx.admin.written(ctx.topic)
    ctx.ledger.stage(FIELD, None)
    seconds = (ctx.now() - record.started).total_seconds()
    await ctx.events.normal(ctx.obj, "ReplicasChanged", f"topic {ctx.topic}: replication factor "
                            f"{record.from_replicas} -> {record.to_replicas} on {record.partitions_total} partitions "
                            f"in {seconds:.0f} s; throttle lifted")  # fmt: skip


async def _refused(ctx: TopicContext, refused: dict[int, AdminError]) -> None:
    """Kafka refused some moves: retriable ones are asked again next pass, the others are said."""
    if any(error.retriable or error.code == "REASSIGNMENT_IN_PROGRESS" for error in refused.values()):
        return
    first = next(iter(sorted(refused.items())))
    message = f"topic {ctx.topic}: Kafka refused to move {len(refused)} partitions (partition {first[0]}: " \
        f"{first[1]})"  # fmt: skip
    ctx.problems.add(kit.Problem("ReplicasChangeRefused", message))
    await ctx.events.warning(ctx.obj, "ReplicasChangeRefused", message)
