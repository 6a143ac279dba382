"""What the failover step remembers between passes, per cluster: only in memory, by design.

Losing it (an operator restart) only delays a failover, never hastens one: the detection window is measured afresh,
and the old primary's last position comes from the replicas' evidence instead, when that is recent enough
(:mod:`kanri.postgres.ha.position`); otherwise the loss cannot be bounded (``DataLossUnknown``: the step asks). The
reconciler keeps one :class:`FailoverMemory` per cluster uid in a :class:`kanri.kit.ObjectMemory`, so a cluster
deleted and recreated under the same name starts with nothing, and it is dropped when the cluster is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["FailoverMemory"]


@dataclass
class FailoverMemory:
    """One cluster's failover memory."""

    primary_seen: tuple[str, str | None, int | None, float] | None = None
    """The primary last seen healthy, its write LSN and timeline, and when (the operator's clock)."""
    suspect: tuple[str, float] | None = None
    """The primary not healthy, and since when."""
    failover_started: float | None = None
    """When the failover or switchover under way began (its duration is recorded in ``status.lastFailover``)."""
    switchover_refused: tuple[str, str] | None = None
    """The last switchover refused (target, why): the Event is sent once per reason."""
    rejoin_requests: dict[str, float] = field(default_factory=dict)
    """Instance -> when it was last asked to rejoin."""
    maintenance_started: float | None = None
    """When a switchover off a cordoned node last began (:mod:`kanri.postgres.ha.maintenance`)."""
    maintenance_refused: str | None = None
    """The cordoned node no replica could take the primary role off (the Event is sent once per node)."""
