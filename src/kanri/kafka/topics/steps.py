"""The apply pass of a KafkaTopic, one thin step per concern (each a free function of :class:`TopicContext`):
who owns the topic, whether the operator manages it, which cluster it is on, what Kafka says, create, settings,
replication factor; growth is :mod:`.growth_step`. A step returns None to go on or a Result to end the pass."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from kanri import kit
from kanri.kafka.api import CLUSTER_KIND, TOPIC_KIND, TOPIC_OWNED_KEYS
from kanri.kafka.topics.admin import AdminError
from kanri.kafka.topics.context import Admins, TopicContext
from kanri.kafka.topics.drift import config_change
from kanri.kafka.topics.ownership import owner
from kanri.runtime import Result, format_time

TopicStep = Callable[[TopicContext], Awaitable[Result | None]]


def not_ready(ctx: TopicContext, phase: str, reason: str, message: str) -> None:
    ctx.ledger.stage("phase", phase)
    ctx.ledger.condition("Ready", False, reason, message)


async def ownership(ctx: TopicContext) -> Result | None:
    """The older of two KafkaTopics naming one topic owns it; the younger only says so."""
    winner = owner(ctx.obj, ctx.cache.list(TOPIC_KIND, ctx.namespace))
    if winner["metadata"].get("uid") == ctx.obj["metadata"].get("uid"):
        return None
    message = f"topic {ctx.topic} on cluster {ctx.spec.cluster} is managed by KafkaTopic {winner['metadata']['name']}"
    not_ready(ctx, "Conflict", "ResourceConflict", message)
    ctx.problems.add(kit.Problem("ResourceConflict", message))
    return Result()


def cluster_address(cluster: dict[str, Any] | None) -> str | None:
    """Where the topic operator reaches a KafkaCluster: the bootstrap address its status publishes."""
    return ((cluster or {}).get("status") or {}).get("bootstrap")


def connect(admins: Admins) -> TopicStep:
    """The step that finds the topic's cluster and its admin client."""

    async def step(ctx: TopicContext) -> Result | None:
        cluster = ctx.cache.get(CLUSTER_KIND, ctx.spec.cluster, ctx.namespace)
        if cluster is None:
            not_ready(ctx, "Pending", "ClusterNotFound", f"KafkaCluster {ctx.spec.cluster} does not exist")
            return Result(requeue_after=30)
        if (address := cluster_address(cluster)) is None:
            not_ready(ctx, "Pending", "ClusterNotReady", f"KafkaCluster {ctx.spec.cluster} has no bootstrap yet")
            return Result(requeue_after=10)
        ctx.admin = admins.of((ctx.namespace, ctx.spec.cluster), address)
        return None

    return step


async def unmanaged(ctx: TopicContext) -> Result | None:
    """``managed: false``: let go — no change and no deletion, only what Kafka reports."""
    if ctx.spec.managed:
        return None
    ctx.ledger.stage("phase", "NotManaged")
    ctx.ledger.stage("growth", None)
    ctx.ledger.condition("Ready", True, "NotManaged", f"managed is false: kanri leaves topic {ctx.topic} alone")
    return Result(requeue_after=ctx.timings.resync * 4)


async def observe(ctx: TopicContext) -> Result | None:
    """What Kafka reports now; a cluster that does not answer ends the pass (looked at again soon)."""
    assert ctx.admin is not None
    try:
        ctx.observed = await ctx.admin.state(ctx.topic, ctx.timings.snapshot_age)
    except AdminError as exc:
        not_ready(ctx, "Pending", "KafkaUnreachable", f"cluster {ctx.spec.cluster}: {exc}")
        return Result(requeue_after=10)
    if ctx.observed is not None:
        ctx.ledger.stage("topicName", ctx.topic)
        ctx.ledger.stage("partitions", ctx.observed.partitions)
        ctx.ledger.stage("replicationFactor", ctx.observed.replication_factor)
        ctx.ledger.stage("underReplicatedPartitions", ctx.observed.under_replicated)
    return None


async def create(ctx: TopicContext) -> Result | None:
    """Create the topic with its partitions and settings; a replication factor above the brokers is named."""
    if ctx.observed is not None:
        return None
    assert ctx.admin is not None
    spec = ctx.spec
    try:
        brokers = await ctx.admin.brokers()
        if spec.replication_factor > brokers:
            message = f"replicationFactor {spec.replication_factor} is more than the {brokers} brokers of cluster " \
                f"{spec.cluster}: the topic is not created"  # fmt: skip
            not_ready(ctx, "Pending", "ReplicationFactorTooLarge", message)
            ctx.problems.add(kit.Problem("ReplicationFactorTooLarge", message))
            return Result(requeue_after=60)
        await ctx.admin.create(ctx.topic, spec.partitions, spec.replication_factor, spec.config)
        ctx.admin.written(ctx.topic)  # after the write: a snapshot taken before it does not speak for the topic
    except AdminError as exc:
        if exc.code == "TOPIC_ALREADY_EXISTS":  # created by the previous pass; the snapshot or metadata lagged
            ctx.admin.written(ctx.topic)
            return Result(requeue_after=1)
        if exc.retriable:
            raise
        message = f"Kafka refused topic {ctx.topic}: {exc}"
        not_ready(ctx, "Pending", "TopicRefused", message)
        ctx.problems.add(kit.Problem("TopicRefused", message))
        return Result(requeue_after=60)
    await ctx.events.normal(ctx.obj, "TopicCreated", f"topic {ctx.topic}: {spec.partitions} partitions, "
                            f"replication factor {spec.replication_factor}")  # fmt: skip
    ctx.ledger.stage("configGeneration", ctx.obj["metadata"].get("generation"))
    not_ready(ctx, "Creating", "Creating", f"topic {ctx.topic} created; waiting for Kafka to report it")
    return Result(requeue_after=1)


async def settings(ctx: TopicContext) -> Result | None:
    """Make the topic's own settings the spec's: a difference at the generation last applied is drift, reverted
    and reported (status.lastDrift, a Warning Event); at a new generation it is the user's change."""
    assert ctx.admin is not None
    assert ctx.observed is not None
    change = config_change(ctx.spec.config, ctx.observed.config, TOPIC_OWNED_KEYS)
    generation = ctx.obj["metadata"].get("generation")
    if change:
        await ctx.admin.set_config(ctx.topic, change.set, change.remove)
        ctx.admin.written(ctx.topic)
        keys = ", ".join(change.keys())
        if (ctx.ledger.status.get("configGeneration")) == generation:
            ctx.ledger.stage("lastDrift", f"{format_time(ctx.now())}: {keys}")
            message = f"topic {ctx.topic}: settings changed outside kanri were reverted: {keys}"
            await ctx.events.warning(ctx.obj, "ConfigDriftReverted", message)
        else:
            await ctx.events.normal(ctx.obj, "ConfigUpdated", f"topic {ctx.topic}: {keys}")
    ctx.ledger.stage("configGeneration", generation)
    return None


async def ready(ctx: TopicContext) -> Result | None:
    assert ctx.observed is not None
    ctx.ledger.stage("phase", "Ready")
    ctx.ledger.condition("Ready", True, "TopicReady", f"topic {ctx.topic}: {ctx.observed.partitions} partitions")
    return Result(requeue_after=ctx.timings.resync)
