"""The cleanup pass of a KafkaTopic being deleted: what its policy and the deletion gate (:mod:`.deletion`) say.

None means done (the finalizer goes); a Result means look again (the finalizer stays, status and one Warning Event
per new reason say what blocks)."""

from __future__ import annotations

from kanri import kit
from kanri.kafka.api import APPROVE_DELETION, CLUSTER_KIND, RELEASE, TOPIC_KIND
from kanri.kafka.topics import deletion
from kanri.kafka.topics.admin import AdminError, GroupLag, TopicState
from kanri.kafka.topics.context import Admins, TopicContext
from kanri.kafka.topics.ownership import owner
from kanri.kafka.topics.steps import TopicStep, cluster_address, not_ready
from kanri.runtime import Result, parse_time


def _annotation(ctx: TopicContext, key: str) -> str:
    return str(((ctx.obj.get("metadata") or {}).get("annotations") or {}).get(key) or "").strip()


async def let_go(ctx: TopicContext) -> bool:
    """The cases where the topic stays and the finalizer goes at once; True when one applies."""
    if owner(ctx.obj, ctx.cache.list(TOPIC_KIND, ctx.namespace))["metadata"].get("uid") != ctx.obj["metadata"].get(
        "uid"
    ):
        return True  # the topic was never this object's
    kept = None
    if not ctx.spec.managed:
        kept = "managed is false"
    elif ctx.spec.deletion_policy == "Retain":
        kept = "deletionPolicy is Retain"
    elif _annotation(ctx, RELEASE) == ctx.topic:
        kept = f"released by the annotation {RELEASE}"
    if kept is None:
        return False
    await ctx.events.normal(ctx.obj, "TopicRetained", f"topic {ctx.topic} and its messages are kept: {kept}")
    return True


async def _observe(ctx: TopicContext, admins: Admins) -> tuple[TopicState | None, list[GroupLag] | None, str | None]:
    """The topic and its groups, or why Kafka could not be asked."""
    cluster = ctx.cache.get(CLUSTER_KIND, ctx.spec.cluster, ctx.namespace)
    address = cluster_address(cluster)
    if address is None:
        return None, None, f"KafkaCluster {ctx.spec.cluster} is gone or has no bootstrap"
    ctx.admin = admins.of((ctx.namespace, ctx.spec.cluster), address)
    try:
        state = await ctx.admin.describe(ctx.topic)
        groups = [] if state is None else await ctx.admin.groups_on(ctx.topic, state.partitions)
    except AdminError as exc:
        return None, None, str(exc)
    return state, groups, None


def cleanup(admins: Admins) -> TopicStep:
    """The cleanup pass's one step (run by ``ObjectPass.run``, so status and Events are written once)."""

    async def step(ctx: TopicContext) -> Result | None:
        if await let_go(ctx):
            return None
        state, groups, unreachable = await _observe(ctx, admins)
        if state is None and unreachable is None:
            return None  # deleted already (by us before a restart, or by someone else)
        newest = None
        if state is not None and ctx.admin is not None and groups and any(g.lag for g in groups):
            newest = await ctx.admin.newest_timestamp(ctx.topic, state.partitions)
        since = parse_time(ctx.obj["metadata"]["deletionTimestamp"])
        verdict = deletion.decide(
            topic=ctx.topic, groups=groups, retention_ms=state.retention_ms if state else None, newest_ms=newest,
            approval=_annotation(ctx, APPROVE_DELETION), deleting_since=since,
            timeout_seconds=ctx.spec.deletion_timeout_seconds, now=ctx.now(), unreachable=unreachable,
        )  # fmt: skip
        if isinstance(verdict, deletion.GiveUp):
            await ctx.events.warning(ctx.obj, "DeletionAbandoned", verdict.message)
            return None
        if isinstance(verdict, deletion.Blocked):
            ctx.ledger.stage("deletionBlockedBy", verdict.message)
            not_ready(ctx, "Deleting", "DeletionBlocked", verdict.message)
            ctx.problems.add(kit.Problem("DeletionBlocked", "; ".join(verdict.summary)))
            return Result(requeue_after=10)
        assert ctx.admin is not None
        await ctx.admin.delete(ctx.topic)
        await ctx.events.normal(
            ctx.obj, "TopicDeleted", f"topic {ctx.topic} deleted (no unconsumed messages, approved)"
        )
        return None

    return step
