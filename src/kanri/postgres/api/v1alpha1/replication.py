"""Replication between the instances, and what happens when the primary fails."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kanri.postgres.api.v1alpha1._base import ApiModel
from kanri.runtime import cel

__all__ = [
    "DEFAULT_MAX_DATA_LOSS_BYTES",
    "DEFAULT_MAX_READ_LAG_BYTES",
    "DataDurability",
    "Failover",
    "FailoverPolicy",
    "Replication",
    "ReplicationMode",
]

ReplicationMode = Literal["Async", "Sync"]
FailoverPolicy = Literal["Automatic", "Manual"]
DataDurability = Literal["required", "preferred"]

DEFAULT_MAX_DATA_LOSS_BYTES = 16 * 1024 * 1024
"""One WAL segment: an automatic failover that could lose more than this waits for approval."""

DEFAULT_MAX_READ_LAG_BYTES = 16 * 1024 * 1024
"""One WAL segment: a replica further behind than this in replay serves no reads (CloudNativePG's default too)."""


class Replication(
    ApiModel,
    validations=[
        # Refused rather than ignored, so nobody believes their standbys are synchronous when they are not.
        cel(
            "self.mode == 'Sync' || !has(self.syncStandbys)",
            "syncStandbys applies to mode Sync only: remove it or set mode: Sync",
            field_path=".syncStandbys",
        ),
        cel(
            "self.mode == 'Sync' || !has(self.dataDurability)",
            "dataDurability applies to mode Sync only: remove it or set mode: Sync",
            field_path=".dataDurability",
        ),
    ],
):
    """How replicas follow the primary (streaming replication)."""

    mode: ReplicationMode = "Async"
    """Async (default): a commit returns once the primary has flushed it; replicas follow shortly after, so a
    failover can lose the last transactions (bounded by failover.maxDataLossBytes).

    Sync: a commit also waits until syncStandbys replicas have flushed it, so a failover to one of them loses
    nothing; writes stop while fewer than syncStandbys replicas are connected.

    Changing the mode is applied online (a configuration reload on the primary)."""

    sync_standbys: Annotated[int, Field(ge=1, le=8)] | None = None
    """With mode Sync: how many replicas must confirm each commit (any of them, quorum style). Default 1.
    Must be less than replicas (the primary is not its own standby), unless the cluster is hibernated
    (replicas 0). Only allowed with mode Sync."""

    data_durability: DataDurability | None = None
    """With mode Sync: what a commit does while fewer than syncStandbys replicas are streaming. required (default):
    it waits for them, so an acknowledged commit is always on syncStandbys replicas, and writes stop while too few
    are connected. preferred: the operator lowers the number of synchronous standbys to the replicas streaming now
    (down to none), so writes go on with reduced durability; the Degraded condition and a Warning Event say so
    (reason DurabilityReduced), and the number goes back up as replicas stream again. Only allowed with mode Sync."""

    max_read_lag_bytes: Annotated[int, Field(ge=0)] | None = None
    """How far behind the primary a replica may have replayed, in bytes of WAL, and still serve reads. Default
    16777216 (16 MiB, one WAL segment). A replica further behind, or one the primary no longer lists as streaming
    (its lag is then unknown), leaves the -ro and -r Services until it has caught up; the Degraded condition says
    which (reason ReadsWithheld). Unset: the default."""

    @property
    def durability(self) -> DataDurability:
        """dataDurability, or its default (required)."""
        return self.data_durability or "required"

    @property
    def read_lag_bound(self) -> int:
        """maxReadLagBytes, or its default."""
        return DEFAULT_MAX_READ_LAG_BYTES if self.max_read_lag_bytes is None else self.max_read_lag_bytes


class Failover(ApiModel):
    """What the operator does when the primary fails: fence it, then promote the replica that received the most WAL.

    The old primary is always fenced (no longer routed to, and stopped if reachable) before a replica is promoted,
    so two primaries never accept writes at the same time. The failover is recorded in status.lastFailover,
    including how many bytes of WAL may have been lost. Defaults: policy Automatic, maxDataLossBytes 16 MiB,
    delaySeconds 0. Every field can be changed at any time and applies to the next failover."""

    policy: FailoverPolicy = "Automatic"
    """Automatic (default): the operator promotes a replica by itself, within the maxDataLossBytes guard.

    Manual: the operator fences the failed primary, reports the best candidate and waits for a human's approval
    (a condition and an Event say so) before promoting."""

    max_data_loss_bytes: Annotated[int, Field(ge=0)] = DEFAULT_MAX_DATA_LOSS_BYTES
    """The RPO guard, in bytes of WAL. Default 16777216 (16 MiB, one WAL segment). If the best replica may lack more
    WAL than this compared with the failed primary (or mode Sync has no synchronous standby to promote), an
    automatic failover stops before promoting and waits for approval. 0 allows only failovers that cannot lose data."""

    delay_seconds: Annotated[int, Field(ge=0, le=3600)] = 0
    """How long the primary must stay failed before the failover starts, to ride out short blips. Default 0
    (start as soon as the primary is declared failed); at most 3600."""
