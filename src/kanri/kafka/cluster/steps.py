"""A KafkaCluster's steps, free functions of the pass context in pass order: what the pods and Kafka report
(brokers, partitions, the controller quorum, the bootstrap address the topic controller uses), then the children
(the StatefulSet keeps its node count while a change of ``replicas`` is refused: :mod:`.scale`)."""

from __future__ import annotations

from typing import Any

from kanri import kit
from kanri import runtime as kr
from kanri.kafka.api import KafkaClusterSpec
from kanri.kafka.cluster import children, health, quorum_wire, scale
from kanri.kafka.cluster.context import ClusterContext, ClusterStep
from kanri.kafka.topics.admin import AdminError
from kanri.kafka.topics.context import Admins
from kanri.runtime.kinds import CONFIG_MAP, POD, SERVICE, STATEFUL_SET

LOOK_AGAIN = 10.0
QUORUM_TIMEOUT = 5.0


def spec_of(ctx: kit.PassContext) -> KafkaClusterSpec:
    return KafkaClusterSpec.model_validate(ctx.obj.get("spec") or {})


def applied_replicas(ctx: kit.PassContext) -> int:
    """The nodes the StatefulSet runs: ``spec.replicas`` until it exists, then its own count (a refused change of
    ``replicas`` never reaches it)."""
    statefulset = ctx.cache.get(STATEFUL_SET, ctx.name, ctx.namespace)
    if statefulset is None:
        return spec_of(ctx).replicas
    return int((statefulset.get("spec") or {}).get("replicas", spec_of(ctx).replicas))


def _scale(ctx: ClusterContext) -> int:
    """The node count the StatefulSet gets now; a refused change adds its Degraded reason (and Warning Event)."""
    statefulset = ctx.cache.get(STATEFUL_SET, ctx.name, ctx.namespace)
    current = None if statefulset is None else applied_replicas(ctx)
    held = None
    if ctx.kafka is not None and current is not None:
        held = health.replicas_on(ctx.kafka.partitions, range(ctx.spec.replicas, current))
    decision = scale.decide(current, ctx.spec.replicas, held)
    if decision.problem is not None:
        ctx.problems.add(decision.problem)
    ctx.ledger.stage("replicas", decision.replicas)
    return decision.replicas


async def write_children(ctx: ClusterContext) -> kr.Result | None:
    """The cluster id (created once, not owned), the broker config, the Services and the StatefulSet."""
    spec = ctx.spec.model_copy(update={"replicas": _scale(ctx)})
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


def quorum_status(quorum: quorum_wire.QuorumState | None) -> dict[str, Any] | None:
    """``status.quorum``: the metadata log's leader and each voter, caught up or how far behind."""
    if quorum is None:
        return None
    voters = health.voters(quorum)
    return {"leaderId": quorum.leader_id, "leaderEpoch": quorum.leader_epoch,
            "highWatermark": quorum.high_watermark, "votersCaughtUp": sum(1 for v in voters if v.caught_up),
            "voters": [{"nodeId": v.node_id, "caughtUp": v.caught_up, "lag": v.lag} for v in voters]}  # fmt: skip


async def read_kafka(admins: Admins, cluster: tuple[str, str], bootstrap: str) -> health.KafkaView:
    """One look: the whole metadata (one request) and the quorum (one DescribeQuorum). A quorum that does not
    answer leaves the view without it (``quorum_error``); metadata that does not answer raises AdminError."""
    brokers, rows = await admins.of(cluster, bootstrap).partition_map()
    partitions = tuple(health.PartitionState(*row) for row in rows)
    try:
        quorum = await quorum_wire.describe(bootstrap, QUORUM_TIMEOUT)
    except AdminError as exc:
        return health.KafkaView(tuple(brokers), partitions, None, str(exc))
    return health.KafkaView(tuple(brokers), partitions, quorum)


def observe(admins: Admins, client_port: int = children.CLIENT_PORT) -> ClusterStep:
    """Brokers from the pods, partitions and the controller quorum from Kafka, and ``Ready`` from them
    (:func:`.health.verdict`). ``client_port``: where brokers listen (tests point it at host brokers)."""

    async def step(ctx: ClusterContext) -> kr.Result | None:
        ctx.requeue(LOOK_AGAIN)
        expected = applied_replicas(ctx)
        brokers = brokers_of(ctx)
        ready = [b for b in brokers if b["ready"]]
        ctx.ledger.stage("brokers", [{k: v for k, v in b.items() if k != "ip"} for b in brokers])
        ctx.ledger.stage("readyBrokers", len(ready))
        if not ready:
            ctx.ledger.stage("phase", "Provisioning")
            ctx.ledger.condition("Ready", False, "Provisioning", f"0 of {expected} brokers ready")
            return None
        bootstrap = ",".join(f"{b['ip']}:{client_port}" for b in ready)
        try:
            view = await read_kafka(admins, (ctx.namespace, ctx.name), bootstrap)
        except AdminError as exc:
            ctx.ledger.stage("phase", "Degraded")
            ctx.ledger.condition("Ready", False, "KafkaUnreachable", str(exc))
            return None
        ctx.kafka = view
        registered = set(view.brokers)
        ctx.ledger.stage("brokers", [{k: v for k, v in b.items() if k != "ip"} | {"registered": b["nodeId"] in
                                      registered} for b in brokers])  # fmt: skip
        ctx.ledger.stage("bootstrap", bootstrap)
        ctx.ledger.stage("underReplicatedPartitions", health.under_replicated(view.partitions))
        ctx.ledger.stage("offlinePartitions", len(health.offline(view.partitions)))
        ctx.ledger.stage("quorum", quorum_status(view.quorum))
        verdict = health.verdict(view, expected, len(ready))
        ctx.ledger.stage("phase", "Ready" if verdict.ready else "Degraded")
        ctx.ledger.condition("Ready", verdict.ready, verdict.reason, verdict.message)
        return None

    return step
