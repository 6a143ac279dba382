"""The kinds (kanri.dev/v1alpha1): ``KafkaCluster`` (KRaft brokers) and ``KafkaTopic`` (a topic on one of them).

What the API server can refuse, it refuses (CEL rules below): a partition count or a volume that shrinks, broker or
topic settings the operator owns or Kafka does not know, a topic moved to another cluster or renamed. What only
Kafka can judge (a replication factor above the brokers there are) is named in status.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from kanri import kit
from kanri.kafka.broker.settings import OWNED_KEYS
from kanri.runtime import CustomResource, KubeModel, PrinterColumn, cel

__all__ = [
    "CLUSTER_KIND",
    "CONTROLLER_LABELS",
    "CUSTOM_RESOURCES",
    "FIELD_MANAGER",
    "LABELS",
    "TOPIC_CONFIG_KEYS",
    "TOPIC_KIND",
    "ControllerQuorum",
    "GrowthRecord",
    "GrowthStep",
    "KafkaCluster",
    "KafkaClusterSpec",
    "KafkaClusterStatus",
    "KafkaTls",
    "KafkaTopic",
    "KafkaTopicSpec",
    "KafkaTopicStatus",
    "PartitionGrowth",
    "Rebalance",
    "ReplicasChange",
    "TlsStatus",
]

MAX_NAME_LENGTH = 40
"""Pods (<name>-N), the Services (<name>-brokers, <name>-bootstrap) and the ConfigMap are named after the cluster."""

#: Topic-level settings of Kafka 4.4 a KafkaTopic may set (tests/integration checks them against a real broker).
TOPIC_CONFIG_KEYS = (
    "cleanup.policy", "compression.type", "compression.gzip.level", "compression.lz4.level", "compression.zstd.level",
    "delete.retention.ms", "file.delete.delay.ms", "flush.messages", "flush.ms", "index.interval.bytes",
    "local.retention.bytes", "local.retention.ms", "max.compaction.lag.ms", "max.message.bytes",
    "message.timestamp.after.max.ms", "message.timestamp.before.max.ms", "message.timestamp.type",
    "min.cleanable.dirty.ratio", "min.compaction.lag.ms", "min.insync.replicas", "preallocate",
    "remote.storage.enable", "remote.log.copy.disable", "remote.log.delete.on.disable", "retention.bytes",
    "retention.ms", "segment.bytes", "segment.index.bytes", "segment.jitter.ms", "segment.ms",
    "unclean.leader.election.enable",
)  # fmt: skip
#: Topic settings the operator keeps for itself: reassignment throttles.
TOPIC_OWNED_KEYS = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")

_NAME_RULE = "self.metadata.name.size() <= {n} && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')"


class Storage(KubeModel):
    """A persistent volume per broker."""

    size: kit.VolumeSize
    """Capacity of each broker's volume (its partitions' logs), e.g. 10Gi. May grow, never shrink."""
    storage_class_name: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    """StorageClass of the claims; the cluster's default when unset."""


_OWNED = sorted(OWNED_KEYS)

# The messages are plain text: a message expression that lists the offending keys (filter + join over map keys of
# unbounded length) is estimated far over the API server's CEL cost budget, and the CRD is refused.
BrokerConfig = Annotated[
    dict[str, Annotated[str, Field(max_length=1024)]],
    Field(max_length=64),
    cel(
        f"!self.exists(k, k in {_OWNED})",
        f"config may not set {', '.join(_OWNED)}: the operator sets these (roles, ids, listeners, quorum, data "
        "directories)",
        reason="FieldValueForbidden",
    ),
    cel(
        "!self.exists(k, k.startsWith('listener.name.') || k.startsWith('ssl.') || k.startsWith('sasl.'))",
        "config may not set listener.name.*, ssl.* or sasl.*: listeners and TLS belong to the operator",
        reason="FieldValueForbidden",
    ),
]


class KafkaTls(KubeModel):
    """TLS between clients and brokers."""

    enabled: bool = False
    """A TLS listener on port 9094 of every broker, advertised by the pod's stable DNS name
    (``<name>-N.<name>-brokers.<namespace>.svc.cluster.local``); its certificate is signed by the cluster's own CA,
    published for clients in the Secret ``<name>-ca`` (``ca.crt``) and renewed from it before it expires."""


class KafkaClusterSpec(
    KubeModel,
    validations=[
        cel("!has(self.controllers) || self.dedicatedControllers || self.replicas >= self.controllers",
            "replicas may not be fewer than controllers: the first nodes are the KRaft controller voters",
            reason="FieldValueInvalid"),
        cel("!self.dedicatedControllers || self.replicas >= 3",
            "with dedicatedControllers, replicas (the brokers) is at least 3: the internal topics keep 3 replicas",
            reason="FieldValueInvalid"),
        cel("self.dedicatedControllers == oldSelf.dedicatedControllers",
            "dedicatedControllers is fixed: the KRaft voter list is written into the nodes when the cluster is made",
            reason="FieldValueForbidden"),
        cel("has(self.controllers) == has(oldSelf.controllers) && (!has(self.controllers) || "
            "self.controllers == oldSelf.controllers)",
            "controllers is fixed: the KRaft voter list is written into the nodes when the cluster is made",
            reason="FieldValueForbidden"),
    ],
):  # fmt: skip
    """The desired state of a KafkaCluster: the first ``controllers`` nodes are combined KRaft controllers and
    brokers (the quorum's voters), the rest brokers only."""

    replicas: Annotated[int, Field(ge=1, le=9)] = 3
    """Nodes of the cluster (brokers). Grows by broker-only nodes and a throttled rebalance onto them; shrinks only
    by nodes that hold no partition replica (drained first when the drain annotation names them)."""
    controllers: Literal[1, 3, 5] | None = None
    """How many KRaft controller voters the cluster has: the first nodes (ids 0..controllers-1), which are brokers
    too, or with ``dedicatedControllers`` nodes of their own. Fixed once the cluster is made; unset: 3 from three
    nodes on, 1 below (always 3 with dedicated controllers)."""
    dedicated_controllers: bool = False
    """The controller voters run in pods of their own (StatefulSet ``<name>-controller``, node ids 1000+), apart
    from the brokers, which are then all brokers only: a broker's load never slows the quorum, and every broker
    can be scaled away. Fixed once the cluster is made."""
    version: Literal["4.4.0"] = "4.4.0"
    """Kafka version (the jars of the broker image)."""
    storage: Storage
    """Each node's volume."""
    config: BrokerConfig = Field(default_factory=dict)
    """Broker settings (``server.properties`` keys), e.g. ``num.partitions``. The operator's keys are refused."""
    deletion_policy: Literal["Retain", "Delete"] = "Retain"
    """What deleting the cluster does to its volumes: Retain keeps them for a new cluster of the same name."""
    tls: KafkaTls = Field(default_factory=KafkaTls)
    """TLS for clients (the brokers and the operator talk over the pod network's plain listener)."""


class TlsStatus(KubeModel):
    """The cluster's TLS listener as the operator last issued it."""

    bootstrap: str
    """``host:port`` for TLS clients: the bootstrap Service's name (the certificate names it)."""
    ca_secret: str
    """The Secret whose ``ca.crt`` clients trust."""
    ca_expires: datetime | None = None
    server_expires: datetime | None = None
    """The brokers' certificate; reissued from the same CA once a third of its lifetime is left (a rolling restart
    loads it)."""


class BrokerStatus(KubeModel):
    node_id: int
    pod: str
    ready: bool = False
    registered: bool | None = None
    """The cluster's metadata lists the broker (unset: Kafka not read)."""


class QuorumVoter(KubeModel):
    node_id: int
    caught_up: bool
    """It fetched up to the leader's end within the last 5 s (the leader's clock)."""
    lag: int | None = None
    """Records of the metadata log behind the leader's end (unset: unknown)."""


class ControllerQuorum(KubeModel):
    """The KRaft controller quorum as its leader reports it (DescribeQuorum)."""

    leader_id: int
    """-1 while no leader is elected."""
    leader_epoch: int
    high_watermark: int
    voters_caught_up: int
    voters: list[QuorumVoter] = Field(default_factory=list, max_length=9)


class Rebalance(KubeModel):
    """A throttled partition reassignment across the cluster's brokers, on record before Kafka is asked (a
    restarted operator resumes it from what Kafka reports as still moving)."""

    reason: Literal["ScaleUp", "Drain"]
    brokers: list[int] = Field(max_length=9)
    """The brokers the replicas are spread over."""
    draining: list[int] = Field(default_factory=list, max_length=9)
    """Brokers every replica is moved off (a scale-down waits for them to hold none)."""
    started: datetime
    moved: int = 0
    """Partitions moved so far."""
    remaining: int | None = None
    """Partitions still to move or moving (unset: not computed yet)."""
    moving: int = 0
    """Partitions Kafka is moving now (at most a few at a time)."""
    throttle_bytes_per_second: int = 0
    """The replication throttle on the moving replicas, per broker."""
    blocked_by: str | None = None
    """Why no move is started now (a broker not ready or not registered, under-replicated partitions)."""
    topics: list[str] = Field(default_factory=list, max_length=10000)
    """Topics whose replicas were throttled (the throttle is lifted on each when the rebalance is done)."""


class KafkaClusterStatus(kit.KitStatus):
    """The observed state of a KafkaCluster, written only by the operator."""

    phase: Literal["Pending", "Provisioning", "Ready", "Degraded", "Restarting", "Rebalancing", "Deleting"] | None = (
        None
    )
    cluster_id: str | None = None
    """The KRaft cluster id every node was formatted with (kept: a node formatted with another never joins)."""
    bootstrap: str | None = None
    """``host:port`` clients and the topic operator connect to."""
    brokers: list[BrokerStatus] = Field(default_factory=list, max_length=9)
    ready_brokers: int | None = None
    under_replicated_partitions: int | None = None
    """Partitions whose in-sync replicas are fewer than their replicas, at the last look."""
    offline_partitions: int | None = None
    """Partitions without a leader at the last look."""
    rolling_restart: str | None = None
    """A rolling restart under way: the broker last restarted, or what the next restart waits for."""
    quorum: ControllerQuorum | None = None
    """The controller quorum at the last look (unset: not read; the Ready message says why)."""
    replicas: int | None = None
    """Nodes the StatefulSet runs: ``spec.replicas`` unless a change is refused or waits for a drain (the Degraded
    condition says why)."""
    controllers: int | None = None
    """The KRaft controller voters: nodes 0..controllers-1, or dedicated controllers (fixed when the cluster was
    made)."""
    dedicated_controllers: bool | None = None
    """The voters run in pods of their own (``<name>-controller-N``, node ids 1000+)."""
    tls: TlsStatus | None = None
    """The TLS listener (unset: TLS off)."""
    resizing_volumes: list[str] | None = Field(default=None, max_length=20)
    """Claims whose volume is still being grown to ``spec.storage.size`` (capacity below the request)."""
    rebalance: Rebalance | None = None
    """Partition replicas being moved between brokers: onto new brokers after a scale-up, off the brokers a
    scale-down removes (a drain). Cleared when done."""


class KafkaCluster(
    CustomResource,
    group="kanri.dev",
    version="v1alpha1",
    kind="KafkaCluster",
    plural="kafkaclusters",
    short_names=("kc",),
    categories=("kanri",),
    printer_columns=(
        PrinterColumn("Replicas", ".spec.replicas", type="integer", description="KRaft nodes"),
        PrinterColumn("Ready", ".status.readyBrokers", type="integer", description="Brokers answering"),
        PrinterColumn("URP", ".status.underReplicatedPartitions", type="integer", description="Under-replicated"),
        PrinterColumn("Phase", ".status.phase", description="Lifecycle phase"),
    ),
    validations=[
        cel(
            _NAME_RULE.format(n=MAX_NAME_LENGTH),
            f"name must start with a letter, hold only lower case letters, digits and '-', and have at most "
            f"{MAX_NAME_LENGTH} characters: pods and Services are named after the cluster",
        ),
    ],
):
    """A Kafka cluster managed by kanri: KRaft nodes in a StatefulSet, a headless Service giving each a stable
    name (<name>-brokers) and a bootstrap Service (<name>-bootstrap)."""

    spec: KafkaClusterSpec
    status: KafkaClusterStatus | None = None


class PartitionGrowth(KubeModel):
    """How partitions are added: in steps, each after checking the topic's consumer groups."""

    step_size: Annotated[int, Field(ge=1, le=1000)] = 2
    """Partitions added per step."""
    pause_seconds: Annotated[int, Field(ge=0, le=86400)] = 30
    """Time between two steps (consumers rebalance and settle)."""
    max_lag: Annotated[int, Field(ge=0)] = 1000
    """A step waits while an active consumer group (one with members) lags more messages than this on the topic."""


TopicConfig = Annotated[
    dict[str, Annotated[str, Field(max_length=256)]],
    Field(max_length=40),
    cel(
        f"!self.exists(k, k in {list(TOPIC_OWNED_KEYS)})",
        "config may not set leader/follower.replication.throttled.replicas: the operator sets them while it "
        "moves replicas",
        reason="FieldValueForbidden",
    ),
    cel(
        f"self.all(k, k in {list(TOPIC_CONFIG_KEYS + TOPIC_OWNED_KEYS)})",
        "config has a key Kafka topics do not have; topic settings are " + ", ".join(TOPIC_CONFIG_KEYS),
    ),
]


class KafkaTopicSpec(
    KubeModel,
    validations=[
        cel("self.cluster == oldSelf.cluster", "cluster is fixed: a topic cannot move to another KafkaCluster",
            reason="FieldValueForbidden"),
        cel("has(self.topicName) == has(oldSelf.topicName) && (!has(self.topicName) || "
            "self.topicName == oldSelf.topicName)", "topicName is fixed: Kafka cannot rename a topic",
            reason="FieldValueForbidden"),
    ],
):  # fmt: skip
    """The desired state of a KafkaTopic."""

    cluster: Annotated[str, Field(min_length=1, max_length=63)]
    """The KafkaCluster (same namespace) the topic lives on."""
    topic_name: Annotated[str, Field(min_length=1, max_length=249, pattern=r"^[a-zA-Z0-9._-]+$")] | None = None
    """The topic's name in Kafka; the KafkaTopic's name when unset. Fixed."""
    partitions: Annotated[
        int,
        Field(ge=1, le=10000),
        cel(
            "self >= oldSelf",
            message_expression="'partitions may not decrease (from %d to %d): Kafka cannot remove partitions; "
            "create a new topic and move its consumers'.format([oldSelf, self])",
            reason="FieldValueForbidden",
        ),
    ]
    """Required: how many partitions the topic has. Grown in steps (partitionGrowth); never decreased."""
    replication_factor: Annotated[int, Field(ge=1, le=9)] = 3
    """Copies of each partition; at most the brokers of the cluster (more is named in status and not created)."""
    config: TopicConfig = Field(default_factory=dict)
    """Topic settings (retention.ms, cleanup.policy, …). Anything else set on the topic outside kanri is reverted."""
    partition_growth: PartitionGrowth = Field(default_factory=PartitionGrowth)
    key_ordered: bool = False
    """The producers rely on a key always landing on the same partition. Adding partitions moves keys, so each
    growth step then waits for an approval naming it (the Ready condition says which)."""
    deletion_policy: Literal["Retain", "Delete"] = "Retain"
    """What deleting the KafkaTopic does to the topic: Retain keeps it and its messages; Delete deletes it once no
    consumer group has unconsumed messages (or the retention window has passed) and an approval names it."""
    managed: bool = True
    """false: the operator lets go of the topic (no change, no deletion), reporting only."""
    deletion_timeout_seconds: Annotated[int, Field(ge=60, le=2592000)] = 3600
    """How long a deletion may wait (for consumers, the approval, or a cluster that is gone) before the operator
    gives up: the topic is kept and the KafkaTopic goes (a Warning Event says so)."""


class GrowthStep(KubeModel):
    """One growth step done (or the one under way)."""

    from_partitions: int
    to_partitions: int
    time: datetime
    """When it was decided (under way) or seen done."""
    checks: str = ""
    """What was checked before it: the groups and their lag."""


class GrowthRecord(KubeModel):
    """Partition growth under way, on record before each step acts (a restarted operator resumes it)."""

    target: int
    step: GrowthStep | None = None
    """The step being carried out: committed before Kafka is asked, cleared when Kafka reports its partitions."""
    last_step_time: datetime | None = None
    blocked_by: str | None = None
    """Why no step is taken now (lag, a rebalance, an approval, the pause)."""


class ReplicasChange(KubeModel):
    """A replication-factor change under way: partitions are moved by a throttled reassignment. On record before
    Kafka is asked; an operator restarted meanwhile resumes from what Kafka reports as still moving."""

    from_replicas: int
    to_replicas: int
    started: datetime
    partitions_done: int = 0
    """Partitions that have exactly ``toReplicas`` replicas and are not being moved."""
    partitions_total: int = 0
    throttle_bytes_per_second: int = 0
    """The replication throttle set on every broker while the replicas catch up (0: none)."""


class KafkaTopicStatus(kit.KitStatus):
    """The observed state of a KafkaTopic, written only by the operator."""

    phase: (
        Literal[
            "Pending",
            "Creating",
            "Ready",
            "Growing",
            "ChangingReplicas",
            "Blocked",
            "Conflict",
            "NotManaged",
            "Deleting",
        ]
        | None
    ) = None
    topic_name: str | None = None
    partitions: int | None = None
    """What Kafka reports now."""
    replication_factor: int | None = None
    """What Kafka reports now (the smallest replica count of any partition)."""
    under_replicated_partitions: int | None = None
    growth: GrowthRecord | None = None
    replicas_change: ReplicasChange | None = None
    """A replication-factor change under way (cleared when every partition has the new count)."""
    steps: list[GrowthStep] = Field(default_factory=list, max_length=20)
    """The most recent growth steps done, newest last (at most 20)."""
    config_generation: int | None = None
    """The generation whose config was last applied: a difference seen later at that generation is drift."""
    last_drift: str | None = None
    """The last config drift reverted: when and which keys."""
    deletion_blocked_by: str | None = None
    """What keeps a Delete-policy topic from being deleted now."""


class KafkaTopic(
    CustomResource,
    group="kanri.dev",
    version="v1alpha1",
    kind="KafkaTopic",
    plural="kafkatopics",
    short_names=("kt",),
    categories=("kanri",),
    printer_columns=(
        PrinterColumn("Cluster", ".spec.cluster", description="The KafkaCluster"),
        PrinterColumn("Partitions", ".status.partitions", type="integer", description="Partitions in Kafka now"),
        PrinterColumn("Desired", ".spec.partitions", type="integer", description="Partitions asked for"),
        PrinterColumn("Phase", ".status.phase", description="Lifecycle phase"),
    ),
):
    """A Kafka topic managed by kanri: created with its settings, grown in checked steps, its settings kept, and
    deleted only by policy, after its consumers are done and with an approval."""

    spec: KafkaTopicSpec
    status: KafkaTopicStatus | None = None


CUSTOM_RESOURCES: tuple[tuple[type[CustomResource], ...], ...] = ((KafkaCluster,), (KafkaTopic,))
CLUSTER_KIND = KafkaCluster.resource.api_kind
TOPIC_KIND = KafkaTopic.resource.api_kind
LABELS = kit.LabelSet("kafka.kanri.dev", "kafka", owner_key="cluster")
CONTROLLER_LABELS = kit.LabelSet("kafka.kanri.dev", "kafka-controller", owner_key="cluster")
"""The dedicated controllers' pods: another ``app.kubernetes.io/name``, so the brokers' selectors (the bootstrap
Service, the broker pods the operator reads) never match them."""
FIELD_MANAGER = "kafka-operator"
TOPIC_FINALIZER = LABELS.key("topic")
CLUSTER_FINALIZER = LABELS.key("cleanup")
APPROVE_GROWTH = LABELS.key("approve-growth")
"""On a key-ordered KafkaTopic: ``<topic> <from>-><to>``, the step the Ready condition names."""
APPROVE_DELETION = LABELS.key("approve-deletion")
"""On a Delete-policy KafkaTopic being deleted: the topic's name in Kafka."""
DRAIN_BROKERS = LABELS.key("drain-brokers")
"""On a KafkaCluster whose ``replicas`` went down: the ids of the brokers the scale-down removes (``3,4``); the
operator then moves their partition replicas off before it removes them."""
RELEASE = LABELS.key("release")
"""The manual escape: ``<topic>`` on a KafkaTopic being deleted drops its finalizer and keeps the topic."""
