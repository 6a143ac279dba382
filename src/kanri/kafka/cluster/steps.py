"""A KafkaCluster's steps, free functions of the pass context in pass order: what the pods and Kafka report
(brokers, partitions, the controller quorum, the bootstrap address the topic controller uses), then the children
(the StatefulSet keeps its node count while a change of ``replicas`` is refused or waits for a drain: :mod:`.scale`);
the rebalance onto new brokers or off drained ones is :mod:`.rebalance_step`."""

from __future__ import annotations

from typing import Any

from kanri import kit
from kanri import runtime as kr
from kanri.kafka.api import DRAIN_BROKERS, KafkaClusterSpec
from kanri.kafka.cluster import children, health, quorum_wire, rebalance_step, scale
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


def voters_of(ctx: kit.PassContext) -> tuple[int, bool]:
    """The controller voters on record — how many, and whether they are dedicated controllers: the
    ``<name>-kraft`` ConfigMap's, else (a cluster made before the record) the StatefulSet's voter list, else what a
    new cluster gets."""
    kraft = ctx.cache.get(CONFIG_MAP, children.kraft_name(ctx.name), ctx.namespace)
    data = (kraft or {}).get("data") or {}
    value = str(data.get(children.CONTROLLERS_KEY, ""))
    if value.isdigit():
        return int(value), data.get(children.DEDICATED_KEY) == "true"
    statefulset = ctx.cache.get(STATEFUL_SET, ctx.name, ctx.namespace)
    for container in (((statefulset or {}).get("spec") or {}).get("template") or {}).get("spec", {}).get(
            "containers") or []:  # fmt: skip
        for env in container.get("env") or []:
            if env.get("name") == "KAFKA_VOTERS" and env.get("value"):
                return children.voter_count(env["value"]), False
    spec = spec_of(ctx)
    return children.default_controllers(spec), spec.dedicated_controllers


def _current(ctx: kit.PassContext) -> int | None:
    """The StatefulSet's replicas (None: not created yet)."""
    statefulset = ctx.cache.get(STATEFUL_SET, ctx.name, ctx.namespace)
    return None if statefulset is None else applied_replicas(ctx)


def _scale(ctx: ClusterContext, current: int | None, controllers: int, dedicated: bool) -> scale.ScaleDecision:
    """The node count the StatefulSet gets now; a refused change adds its Degraded reason (and Warning Event), and
    so does a spec that asks for other voters than the cluster was made with."""
    held = None
    if ctx.kafka is not None and current is not None:
        held = health.replicas_on(ctx.kafka.partitions, range(ctx.spec.replicas, current))
    drain = scale.parse_drain((ctx.obj["metadata"].get("annotations") or {}).get(DRAIN_BROKERS))
    # with dedicated controllers no broker is a voter: every one may go
    decision = scale.decide(current, ctx.spec.replicas, held, 0 if dedicated else controllers, drain)
    if decision.problem is not None:
        ctx.problems.add(decision.problem)
    made = f"(ConfigMap {children.kraft_name(ctx.name)}), and the voter list cannot change"
    if ctx.spec.dedicated_controllers != dedicated:
        asked = str(ctx.spec.dedicated_controllers).lower()
        message = f"spec.dedicatedControllers {asked} is not applied: the cluster was made " \
            f"{'with' if dedicated else 'without'} dedicated controllers {made}"  # fmt: skip
        ctx.problems.add(kit.Problem(scale.VOTER_LIST_FIXED, message))
    if ctx.spec.controllers is not None and ctx.spec.controllers != controllers:
        message = f"spec.controllers {ctx.spec.controllers} is not applied: the cluster was made with " \
            f"{controllers} controller voters {made}"  # fmt: skip
        ctx.problems.add(kit.Problem(scale.VOTER_LIST_FIXED, message))
    ctx.scale = decision
    ctx.ledger.stage("replicas", decision.replicas)
    return decision


async def write_children(ctx: ClusterContext) -> kr.Result | None:
    """The cluster id and voter count (created once, not owned), the broker config, the Services and the
    StatefulSet; a scale-up or a drain on record (``status.rebalance``) before the StatefulSet changes."""
    (controllers, dedicated), current = voters_of(ctx), _current(ctx)
    ctx.ledger.stage("controllers", controllers)
    ctx.ledger.stage("dedicatedControllers", dedicated)
    decision = _scale(ctx, current, controllers, dedicated)
    spec = ctx.spec.model_copy(update={"replicas": decision.replicas})
    kraft = children.kraft_config_map(ctx.name, controllers, dedicated)
    if await ctx.children.create_once(CONFIG_MAP, kraft, owned=False) == "created":
        await ctx.events.normal(ctx.obj, "ClusterIdCreated", f"KRaft cluster id in {children.kraft_name(ctx.name)}, "
                                f"{controllers} controller voters{' (dedicated)' if dedicated else ''}")  # fmt: skip
    found = ctx.cache.get(CONFIG_MAP, children.kraft_name(ctx.name), ctx.namespace)
    if found is not None and children.DEDICATED_KEY not in (found.get("data") or {}):
        # a cluster made before the voters were recorded: record what its StatefulSet runs
        patch = {"data": {children.CONTROLLERS_KEY: str(controllers), children.DEDICATED_KEY: str(dedicated).lower()}}
        await ctx.client.patch(CONFIG_MAP, children.kraft_name(ctx.name), patch, ctx.namespace)
    await rebalance_step.record_start(ctx, current, decision)
    await ctx.children.apply(CONFIG_MAP, children.config_map(ctx.name, spec))
    for service in children.services(ctx.name, ctx.spec.tls.enabled):
        await ctx.children.apply(SERVICE, service)
    if ctx.spec.tls.enabled and ctx.tls_hash is None:
        return None  # no certificate to mount yet (the CA Secret is unusable: Degraded says why)
    if dedicated:
        await ctx.children.apply(SERVICE, children.controllers_service(ctx.name))
        made = ctx.cache.get(STATEFUL_SET, children.controller_set_name(ctx.name), ctx.namespace)
        body = children.controller_statefulset(ctx.name, ctx.namespace, ctx.spec, controllers,
                                               kit.claim_template_size(made))  # fmt: skip
        await ctx.children.apply(STATEFUL_SET, body)
    made = ctx.cache.get(STATEFUL_SET, ctx.name, ctx.namespace)
    body = children.statefulset(ctx.name, ctx.namespace, spec, controllers, ctx.tls_hash, dedicated,
                                kit.claim_template_size(made))  # fmt: skip
    await ctx.children.apply(STATEFUL_SET, body)
    if found is not None:
        ctx.ledger.stage("clusterId", (found.get("data") or {}).get(children.CLUSTER_ID_KEY))
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
