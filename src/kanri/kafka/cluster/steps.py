"""A KafkaCluster's steps, free functions of the pass context in pass order: the children, then what the pods and
Kafka report (brokers, under-replicated and offline partitions, the bootstrap address the topic controller uses)."""

from __future__ import annotations

from typing import Any

from kanri import kit
from kanri import runtime as kr
from kanri.kafka.api import KafkaClusterSpec
from kanri.kafka.cluster import children
from kanri.kafka.topics.admin import AdminError
from kanri.kafka.topics.context import Admins
from kanri.runtime.kinds import CONFIG_MAP, POD, SERVICE, STATEFUL_SET

LOOK_AGAIN = 10.0


def spec_of(ctx: kit.PassContext) -> KafkaClusterSpec:
    return KafkaClusterSpec.model_validate(ctx.obj.get("spec") or {})


async def write_children(ctx: kit.PassContext) -> kr.Result | None:
    """The cluster id (created once, not owned), the broker config, the Services and the StatefulSet."""
    spec = spec_of(ctx)
    if await ctx.children.create_once(CONFIG_MAP, children.kraft_config_map(ctx.name), owned=False) == "created":
        await ctx.events.normal(ctx.obj, "ClusterIdCreated", f"KRaft cluster id in {children.kraft_name(ctx.name)}")
    await ctx.children.apply(CONFIG_MAP, children.config_map(ctx.name, spec))
    for service in children.services(ctx.name):
        await ctx.children.apply(SERVICE, service)
    await ctx.children.apply(STATEFUL_SET, children.statefulset(ctx.name, ctx.namespace, spec))
    kraft = ctx.cache.get(CONFIG_MAP, children.kraft_name(ctx.name), ctx.namespace)
    if kraft is not None:
        ctx.ledger.stage("clusterId", (kraft.get("data") or {}).get(children.CLUSTER_ID_KEY))
    return None


def _ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def brokers_of(ctx: kit.PassContext) -> list[dict[str, Any]]:
    """Every pod of the cluster as ``{nodeId, pod, ready}``, with its address (``ip``) when it has one."""
    pods = ctx.cache.list(POD, ctx.namespace, ctx.labels.selector(ctx.name))
    found = []
    for pod in pods:
        name = pod["metadata"]["name"]
        ordinal = name.rpartition("-")[2]
        if not ordinal.isdigit() or pod["metadata"].get("deletionTimestamp"):
            continue
        ip = (pod.get("status") or {}).get("podIP")
        found.append({"nodeId": int(ordinal), "pod": name, "ready": _ready(pod) and bool(ip), "ip": ip})
    return sorted(found, key=lambda b: b["nodeId"])


def observe(admins: Admins, client_port: int = children.CLIENT_PORT) -> kit.Step:
    """Brokers from the pods, partition health from Kafka, and Ready when every broker answers and no partition is
    under-replicated or offline. ``client_port``: where brokers listen (tests point it at host brokers)."""

    async def step(ctx: kit.PassContext) -> kr.Result | None:
        ctx.requeue(LOOK_AGAIN)
        spec = spec_of(ctx)
        brokers = brokers_of(ctx)
        ready = [b for b in brokers if b["ready"]]
        ctx.ledger.stage("brokers", [{k: v for k, v in b.items() if k != "ip"} for b in brokers])
        ctx.ledger.stage("readyBrokers", len(ready))
        if not ready:
            ctx.ledger.stage("phase", "Provisioning")
            ctx.ledger.condition("Ready", False, "Provisioning", f"0 of {spec.replicas} brokers ready")
            return None
        bootstrap = ",".join(f"{b['ip']}:{client_port}" for b in ready)
        try:
            answering, under, offline = await admins.of((ctx.namespace, ctx.name), bootstrap).health()
        except AdminError as exc:
            ctx.ledger.stage("phase", "Degraded")
            ctx.ledger.condition("Ready", False, "KafkaUnreachable", str(exc))
            return None
        ctx.ledger.stage("bootstrap", bootstrap)
        ctx.ledger.stage("underReplicatedPartitions", under)
        ctx.ledger.stage("offlinePartitions", offline)
        healthy = len(ready) == spec.replicas and answering == spec.replicas and under == 0 and offline == 0
        message = f"{len(ready)} of {spec.replicas} brokers ready, {answering} registered; {under} under-replicated " \
            f"and {offline} offline partitions"  # fmt: skip
        ctx.ledger.stage("phase", "Ready" if healthy else "Degraded")
        ctx.ledger.condition("Ready", healthy, "BrokersReady" if healthy else "BrokersDegraded", message)
        return None

    return step
