"""The KafkaTopic controller: loads the topic, handles deletion (kit.finalize), and runs the steps in one pass.

Apply: ownership -> managed? -> the cluster -> what Kafka says -> create -> settings -> replication factor ->
growth -> Ready (looked at again every 30 s: drift made outside kanri is found and reverted). Cleanup: the deletion
gate (:mod:`.deletion_step`)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from kanri import kit
from kanri import runtime as kr
from kanri.kafka.api import CLUSTER_KIND, TOPIC_FINALIZER, TOPIC_KIND
from kanri.kafka.topics import steps
from kanri.kafka.topics.context import DEFAULT_TIMINGS, Admins, Timings, TopicPass
from kanri.kafka.topics.deletion_step import cleanup
from kanri.kafka.topics.growth_step import grow
from kanri.kafka.topics.metrics import TopicMetrics
from kanri.kafka.topics.ownership import claimants
from kanri.kafka.topics.replicas_step import change as change_replicas

Obj = dict[str, Any]


class TopicReconciler:
    def __init__(
        self,
        manager: kr.Manager,
        *,
        admins: Admins | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        registry: CollectorRegistry | None = None,
        timings: Timings = DEFAULT_TIMINGS,
    ) -> None:
        self.cache, self.client = manager.cache, manager.client
        self.events = kr.EventRecorder(self.client, component="kafka-operator")
        self.admins = admins or Admins()
        self.clock = clock
        self.timings = timings
        self.metrics = TopicMetrics(registry if registry is not None else manager.registry)
        self.apply_steps: list[steps.TopicStep] = [
            steps.ownership,  # a second KafkaTopic naming a topic only reports the conflict
            steps.unmanaged,  # managed: false lets go
            steps.connect(self.admins),
            steps.observe,
            steps.create,
            steps.settings,  # drift reverted and reported
            change_replicas,  # a throttled reassignment, tracked in status.replicasChange
            grow,  # checked steps
            steps.ready,
        ]
        self.cleanup_steps = [cleanup(self.admins)]

    def _pass(self, obj: Obj) -> TopicPass:
        return TopicPass(client=self.client, cache=self.cache, events=self.events, obj=obj, clock=self.clock,
                         timings=self.timings)  # fmt: skip

    async def reconcile(self, request: kr.Request) -> kr.Result | None:
        obj = self.cache.get(TOPIC_KIND, request.name, request.namespace)
        if obj is None:
            self.metrics.forget(request.namespace, request.name)
            return None
        return await kit.finalize(self.client, TOPIC_KIND, obj, TOPIC_FINALIZER, apply=self.apply,
                                  cleanup=self.cleanup)  # fmt: skip

    async def apply(self, obj: Obj) -> kr.Result | None:
        ctx = self._pass(obj)
        result = await ctx.run_topic(self.apply_steps)
        await self.metrics.observe(ctx)
        return result

    async def cleanup(self, obj: Obj) -> kr.Result | None:
        ctx = self._pass(obj)
        result = await ctx.run_topic(self.cleanup_steps)
        await self.metrics.observe(ctx)
        return result


def controller(
    manager: kr.Manager,
    *,
    admins: Admins | None = None,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    registry: CollectorRegistry | None = None,
    timings: Timings = DEFAULT_TIMINGS,
) -> kr.Controller:
    """The KafkaTopic controller: a KafkaCluster's change looks at its topics again, and a KafkaTopic's change looks
    at the others naming the same topic (the younger takes over when the older goes). ``timings``: how often it
    looks (:class:`.context.Timings`; tests shorten them); ``registry``: where the topic metrics go (the manager's,
    served at /metrics, when None — never the process-wide default, which two operators in one process would
    share)."""
    registry = registry if registry is not None else manager.registry
    reconciler = TopicReconciler(manager, admins=admins, clock=clock, registry=registry, timings=timings)
    cache = manager.cache

    def topics_of(cluster: Obj) -> list[kr.Request]:
        namespace, name = cluster["metadata"].get("namespace", ""), cluster["metadata"]["name"]
        return [kr.Request(namespace, t["metadata"]["name"]) for t in cache.list(TOPIC_KIND, namespace)
                if (t.get("spec") or {}).get("cluster") == name]  # fmt: skip

    def rivals(topic: Obj) -> list[kr.Request]:
        namespace = topic["metadata"].get("namespace", "")
        same = claimants(topic, cache.list(TOPIC_KIND, namespace))
        uid = topic["metadata"].get("uid")
        return [kr.Request(namespace, t["metadata"]["name"]) for t in same if t["metadata"].get("uid") != uid]

    options = kr.ControllerOptions(max_concurrent_reconciles=4)
    built = kr.Controller("kafkatopic", reconciler, for_kind=TOPIC_KIND, options=options)
    return built.watches(CLUSTER_KIND, topics_of).watches(TOPIC_KIND, rivals)
