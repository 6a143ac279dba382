"""Partition growth carried out: a state machine in ``status.growth`` (kanri.kafka.api.GrowthRecord).

A step is committed to status (its from, to and checks) *before* Kafka is asked for the partitions, so an operator
restarted between the two finds the step and finishes it; asking Kafka again for a count it already has is answered
INVALID_PARTITIONS and counts as done once Kafka reports the count. The step is cleared, and appended to
``status.steps``, only when Kafka reports its partitions (metadata lags a change: the next pass looks again).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kanri.kafka.api import APPROVE_GROWTH, GrowthRecord, GrowthStep
from kanri.kafka.topics import growth
from kanri.kafka.topics.admin import AdminError
from kanri.kafka.topics.context import TopicContext
from kanri.kafka.topics.steps import not_ready
from kanri.runtime import Result

MAX_STEPS = 20
"""Growth steps kept in status.steps (newest last)."""


def _plain(record: GrowthRecord | None) -> Any:
    return None if record is None else record.model_dump(mode="json", by_alias=True, exclude_none=True)


async def grow(ctx: TopicContext) -> Result | None:
    """Finish the step under way, or decide the next one, or say what blocks it."""
    assert ctx.admin is not None
    assert ctx.observed is not None
    record = ctx.ledger.record("growth", GrowthRecord)
    current, desired = ctx.observed.partitions, ctx.spec.partitions
    if record is not None and record.step is not None:
        return await _carry_on(ctx, record, record.step)
    if current >= desired:
        if record is not None:
            ctx.ledger.stage("growth", None)
        return None
    groups = await ctx.admin.groups_on(ctx.topic, current)
    decision = growth.decide(
        topic=ctx.topic, current=current, desired=desired, growth=ctx.spec.partition_growth, groups=groups,
        key_ordered=ctx.spec.key_ordered, approval=_approval(ctx),
        last_step_time=record.last_step_time if record else _last_step_time(ctx), now=ctx.now(),
    )  # fmt: skip
    record = record or GrowthRecord(target=desired)
    record = record.model_copy(update={"target": desired})
    if isinstance(decision, growth.Wait):
        ctx.ledger.stage("growth", _plain(record.model_copy(update={"blocked_by": decision.message})))
        phase = "Growing" if decision.reason == "GrowthPaused" else "Blocked"
        not_ready(ctx, phase, decision.reason, decision.message)
        return Result(requeue_after=decision.retry_after)
    assert isinstance(decision, growth.Grow)
    step = GrowthStep(from_partitions=current, to_partitions=decision.to, time=ctx.now(), checks=decision.checks)
    # the intent on record before Kafka is asked: a restart finds it and finishes this very step
    await ctx.ledger.commit("growth", record.model_copy(update={"step": step, "blocked_by": None}))
    await ctx.events.normal(ctx.obj, "GrowthStep", f"topic {ctx.topic}: {current} -> {decision.to} partitions "
                            f"(checked: {decision.checks})")  # fmt: skip
    return await _carry_on(ctx, ctx.ledger.record("growth", GrowthRecord) or record, step)


async def _carry_on(ctx: TopicContext, record: GrowthRecord, step: GrowthStep) -> Result | None:
    assert ctx.admin is not None
    assert ctx.observed is not None
    if ctx.observed.partitions >= step.to_partitions:
        done = step.model_copy(update={"time": ctx.now()})
        steps = [*(ctx.ledger.status.get("steps") or []), done.model_dump(mode="json", by_alias=True)]
        ctx.ledger.stage("steps", steps[-MAX_STEPS:])
        if ctx.spec.partitions <= step.to_partitions:
            ctx.ledger.stage("growth", None)  # the growth is done; status.steps keeps its record
            return None
        ctx.ledger.stage("growth", _plain(record.model_copy(update={"step": None, "last_step_time": ctx.now()})))
        not_ready(ctx, "Growing", "StepDone", f"step {step.from_partitions}->{step.to_partitions} done")
        return Result(requeue_after=0.5)
    try:
        await ctx.admin.grow(ctx.topic, step.to_partitions)
    except AdminError as exc:
        if exc.code != "INVALID_PARTITIONS":  # INVALID_PARTITIONS: Kafka already has them (a repeated request)
            raise
    ctx.admin.written(ctx.topic)
    message = f"step {step.from_partitions}->{step.to_partitions} asked; waiting for Kafka to report it"
    not_ready(ctx, "Growing", "Growing", message)
    return Result(requeue_after=1)


def _last_step_time(ctx: TopicContext) -> datetime | None:
    """When the last growth step was done: a new growth pauses after it too."""
    steps = ctx.ledger.status.get("steps") or []
    return GrowthStep.model_validate(steps[-1]).time if steps else None


def _approval(ctx: TopicContext) -> str:
    return str(((ctx.obj.get("metadata") or {}).get("annotations") or {}).get(APPROVE_GROWTH) or "").strip()
