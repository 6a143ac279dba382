"""The KafkaCluster controller: loads the cluster, handles deletion (kit.finalize: the volumes and the cluster id
kept or deleted per ``deletionPolicy``), and runs the steps in one pass: what Kafka reports, the children, the
rolling restart; then the cluster's metrics."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from kanri import kit
from kanri import runtime as kr
from kanri.kafka.api import CLUSTER_FINALIZER, CLUSTER_KIND, CONTROLLER_LABELS, FIELD_MANAGER, LABELS
from kanri.kafka.cluster import rebalance_step, steps, storage_step, tls_step
from kanri.kafka.cluster.children import CLIENT_PORT
from kanri.kafka.cluster.context import ClusterPass, ClusterStep
from kanri.kafka.cluster.metrics import ClusterMetrics
from kanri.kafka.cluster.roll_step import roll
from kanri.kafka.topics.context import Admins
from kanri.runtime.kinds import CONFIG_MAP, POD, PVC, SECRET, SERVICE, STATEFUL_SET


class ClusterReconciler:
    def __init__(
        self,
        manager: kr.Manager,
        *,
        admins: Admins | None = None,
        client_port: int = CLIENT_PORT,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.cache, self.client = manager.cache, manager.client
        self.events = kr.EventRecorder(self.client, component=FIELD_MANAGER)
        self.admins = admins or Admins()
        self.metrics = ClusterMetrics(registry if registry is not None else manager.registry)
        self.steps: list[ClusterStep] = [
            steps.observe(self.admins, client_port),  # first: a change of replicas is decided from what Kafka holds
            tls_step.step,  # the CA and the brokers' certificate, whose hash the StatefulSet carries
            steps.write_children,
            storage_step.grow,  # the claims themselves: a StatefulSet's claim template cannot change
            roll(self.admins, steps.applied_replicas),  # one broker at a time, min.isr gated
            rebalance_step.step(self.admins),  # replicas onto added brokers, off drained ones: throttled
        ]

    async def reconcile(self, request: kr.Request) -> kr.Result | None:
        obj = self.cache.get(CLUSTER_KIND, request.name, request.namespace)
        if obj is None:
            self.admins.forget((request.namespace, request.name))  # its admin client's threads and connections
            self.metrics.forget(request.namespace, request.name)
            return None
        return await kit.finalize(self.client, CLUSTER_KIND, obj, CLUSTER_FINALIZER, apply=self.apply,
                                  cleanup=self.cleanup)  # fmt: skip

    async def apply(self, obj: dict[str, Any]) -> kr.Result | None:
        ctx = ClusterPass(client=self.client, cache=self.cache, events=self.events, obj=obj)
        result = await ctx.run_cluster(self.steps)
        self.metrics.observe(ctx)
        return result

    async def cleanup(self, obj: dict[str, Any]) -> kr.Result | None:
        data = kit.data_of(self.cache, [PVC, CONFIG_MAP], LABELS, obj)
        kept = [(kind, found) for kind, found in data if not _owned_by(found, obj)]
        await kit.carry_out(kit.deletion_policy(obj), self.client, self.events, obj, kept)
        return None


def _owned_by(child: dict[str, Any], owner: dict[str, Any]) -> bool:
    refs = child["metadata"].get("ownerReferences") or []
    return any(ref.get("uid") == owner["metadata"].get("uid") and ref.get("controller") for ref in refs)


def controller(
    manager: kr.Manager,
    *,
    admins: Admins | None = None,
    client_port: int = CLIENT_PORT,
    registry: CollectorRegistry | None = None,
) -> kr.Controller:
    """Owns the StatefulSet, Services and the config ConfigMap; pods and claims are mapped back by label.
    ``client_port``: where the brokers listen (tests point the controller at host brokers); ``registry``: where the
    cluster metrics go (the manager's, served at /metrics, when None)."""
    reconciler = ClusterReconciler(manager, admins=admins, client_port=client_port, registry=registry)
    built = kr.Controller("kafkacluster", reconciler, for_kind=CLUSTER_KIND)
    built = built.owns(STATEFUL_SET).owns(SERVICE).owns(CONFIG_MAP).owns(SECRET)
    return built.watches(POD, _pod_owner).watches(PVC, LABELS.owner_requests)


def _pod_owner(obj: dict[str, Any]) -> list[kr.Request]:
    """A broker's or a dedicated controller's pod -> its KafkaCluster."""
    return LABELS.owner_requests(obj) + CONTROLLER_LABELS.owner_requests(obj)
