"""What a KafkaCluster step may use: the kit's pass context plus the cluster's spec and what Kafka reported this
pass. Steps depend on :class:`ClusterContext`, never on the reconciler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from kanri import kit
from kanri.kafka.api import CLUSTER_KIND, FIELD_MANAGER, LABELS, KafkaClusterSpec
from kanri.kafka.cluster.health import KafkaView
from kanri.kafka.cluster.scale import SCALE_DOWN_REFUSED, VOTER_LIST_FIXED, ScaleDecision
from kanri.runtime import Cache, Client, EventRecorder, Result

DRAIN_IMPOSSIBLE = "DrainImpossible"
#: Problem reasons, most serious first (the Degraded condition names the first).
SEVERITY = (SCALE_DOWN_REFUSED, DRAIN_IMPOSSIBLE, "InvalidCASecret", kit.EXPANSION_REFUSED, VOTER_LIST_FIXED)
#: The reasons a change of ``replicas`` is not applied (the replicas_change_refused metric).
REPLICAS_REFUSED = (SCALE_DOWN_REFUSED, DRAIN_IMPOSSIBLE, VOTER_LIST_FIXED)


class ClusterContext(kit.PassContext, Protocol):
    @property
    def spec(self) -> KafkaClusterSpec: ...

    kafka: KafkaView | None
    """What Kafka reported this pass (None: no broker ready, or Kafka did not answer)."""
    scale: ScaleDecision | None
    """This pass's decision on ``replicas`` (None until the children step made it)."""
    tls_hash: str | None
    """A hash of the brokers' certificate (None: TLS off, or not issued this pass)."""


ClusterStep = Callable[[ClusterContext], Awaitable[Result | None]]


class ClusterPass(kit.ObjectPass):
    """One pass over one KafkaCluster (implements :class:`ClusterContext`)."""

    def __init__(self, *, client: Client, cache: Cache, events: EventRecorder, obj: dict[str, Any]) -> None:
        super().__init__(client=client, cache=cache, events=events, kind=CLUSTER_KIND, obj=obj, labels=LABELS,
                         field_manager=FIELD_MANAGER, severity=SEVERITY)  # fmt: skip
        self._spec = KafkaClusterSpec.model_validate(self.obj.get("spec") or {})
        self.kafka: KafkaView | None = None
        self.scale: ScaleDecision | None = None
        self.tls_hash: str | None = None

    @property
    def spec(self) -> KafkaClusterSpec:
        return self._spec

    async def run_cluster(self, steps: Iterable[ClusterStep]) -> Result | None:
        """:meth:`kanri.kit.ObjectPass.run` for cluster steps: in order until one returns a Result, then one status
        write."""
        for step in steps:
            ended = await step(self)
            if ended is not None:
                if ended.requeue_after is not None:
                    self.requeue(ended.requeue_after)
                break
        return await self.finish()
