"""What the failover step works with for one cluster in one pass, and the writes every phase makes.

:class:`FailoverContext` holds the pass's view (the cluster, its spec, the instances' reports as routed and as
answered, their pods and claims, the API token) and the operator's clients through :class:`Operator`, a Protocol
the reconciler satisfies without being imported. Every phase of a failover or switchover is written to
``status.failover`` (:meth:`FailoverContext.set_progress`) before its actions, so an operator killed at any point
resumes where it stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from kanri.kit import ObjectMemory
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.cluster.instances import InstanceClient, InstanceReport, api_token
from kanri.postgres.cluster.problems import Problem
from kanri.postgres.ha.memory import FailoverMemory
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import ROLE
from kanri.postgres.metrics import PostgresMetrics
from kanri.runtime import ApiError, Cache, Client, EventRecorder, parse_time
from kanri.runtime.kinds import POD, PVC

__all__ = ["FailoverContext", "Operator", "iso", "lsn_text", "now", "parse_time", "status_progress"]

Obj = dict[str, Any]
log = structlog.get_logger("kanri.postgres.ha.failover")


class Operator(Protocol):
    """What the step uses of the operator (the PostgresClusterReconciler, which it never imports)."""

    @property
    def cache(self) -> Cache: ...

    @property
    def client(self) -> Client: ...

    @property
    def instances(self) -> InstanceClient: ...

    @property
    def events(self) -> EventRecorder: ...

    @property
    def metrics(self) -> PostgresMetrics | None: ...

    @property
    def ha(self) -> ObjectMemory[FailoverMemory]:
        """Per-cluster memory between passes (see :mod:`kanri.postgres.ha.memory`)."""
        ...

    @property
    def node_monitor_grace(self) -> float:
        """The node lifecycle controller's grace before it marks a silent node (``kanri run --node-monitor-grace``)."""
        ...

    @property
    def background(self) -> set[asyncio.Task[None]]:
        """Requests that must not hold a pass up; the operator cancels what is left at shutdown."""
        ...

    def clock(self) -> float: ...


def now() -> datetime:
    return datetime.now(UTC)


def iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def lsn_text(position: int) -> str:
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


def status_progress(progress: Obj) -> Obj:
    """``status.failover`` holds only the schema's fields (and no nulls)."""
    allowed = ("phase", "from", "reason", "started", "primaryLSN", "primaryTimeline", "target", "checkpointLSN",
               "candidates", "lsnGapBytes", "dataLossPossible", "approvedBy", "blockedReason", "message",
               "primaryLSNSource", "primaryLSNEvidence")  # fmt: skip
    return {k: v for k, v in progress.items() if k in allowed and v is not None}


class FailoverContext:
    """One pass's view of one cluster for the failover step, and the writes its phases share."""

    def __init__(
        self,
        reconciler: Operator,
        cluster: Obj,
        spec: PostgresClusterSpec,
        *,
        primary: str | None,
        instances: list[str],
        reports: Mapping[str, InstanceReport],
        raw: Mapping[str, InstanceReport],
        pods: dict[str, Obj],
        claims: Mapping[str, Obj],
    ) -> None:
        self.r = reconciler
        self.cluster = cluster
        self.spec = spec
        self.primary = primary
        self.instances = instances
        self.reports = reports
        """As routed: a fenced or rejoining instance reads as role ``fenced``."""
        self.raw = raw
        """As the instances answered."""
        self.pods = pods
        self.claims = claims
        meta = cluster["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.memory = reconciler.ha.of(cluster)
        self.status: Obj = cluster.get("status") or {}
        self.annotations: dict[str, str] = dict(meta.get("annotations") or {})
        self.token = api_token(reconciler.cache, self.namespace, self.name)
        self.problems: list[Problem] = []
        self.promoted = False

    def address(self, instance: str) -> str | None:
        """The instance's pod IP, None while it has none or its pod is being deleted."""
        pod = self.pods.get(instance)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        ip = (pod.get("status") or {}).get("podIP")
        return str(ip) if ip else None

    async def write_status(self, patch: Obj) -> None:
        """Write status fields at once (the phase must survive this process)."""
        updated = await self.r.client.patch_status(POSTGRES_CLUSTER, self.name, {"status": patch}, self.namespace)
        self.status = updated.get("status") or {}
        self.cluster = {**self.cluster, "metadata": updated.get("metadata", self.cluster["metadata"]),
                        "status": self.status}  # fmt: skip

    async def set_progress(self, progress: Obj | None) -> None:
        """Record the phase (``status.failover``; None when done) before acting on it."""
        began = self.memory.failover_started
        elapsed = round(self.r.clock() - began, 3) if began is not None else None
        log.info("failover phase", cluster=self.name, namespace=self.namespace,
                 phase=(progress or {}).get("phase"), elapsed=elapsed)  # fmt: skip
        await self.write_status({"failover": progress})

    async def label(self, instance: str, role: str) -> None:
        """Route by ``role`` to the instance's pod (``kanri.dev/role``); a refusal is logged, not raised."""
        pod = self.pods.get(instance)
        if pod is None:
            return
        labels = pod["metadata"].get("labels") or {}
        if labels.get(ROLE) == role:
            return
        try:
            await self.r.client.patch(POD, pod["metadata"]["name"], {"metadata": {"labels": {ROLE: role}}},
                                      self.namespace)  # fmt: skip
        except ApiError as exc:
            if not exc.not_found:
                log.warning("relabelling refused", instance=instance, status=exc.status, error=exc.message)
            return
        self.pods[instance] = {**pod, "metadata": {**pod["metadata"], "labels": {**labels, ROLE: role}}}

    async def annotate_claim(self, instance: str, annotations: dict[str, str | None]) -> None:
        """Record facts on the instance's claim (the data outlives the pod and the operator's memory)."""
        try:
            await self.r.client.patch(PVC, instance, {"metadata": {"annotations": annotations}}, self.namespace)
        except ApiError as exc:
            if not exc.not_found:
                raise

    async def drop_annotation(self, key: str) -> None:
        """Remove a request annotation from the cluster once it was acted on."""
        if key in self.annotations:
            await self.r.client.patch(POSTGRES_CLUSTER, self.name, {"metadata": {"annotations": {key: None}}},
                                      self.namespace)  # fmt: skip
            self.annotations.pop(key, None)
