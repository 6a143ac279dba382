"""What the failover step remembers between passes, per cluster: only in memory, by design.

Losing it (an operator restart) only delays a failover, never hastens one: the detection window is measured afresh,
and without the old primary's last position the loss cannot be bounded (``DataLossUnknown``: the step asks). It is
kept per cluster uid, so a cluster deleted and recreated under the same name starts with nothing, and it is dropped
when the cluster is gone (:meth:`HaMemory.forget`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ClusterMemory", "HaMemory"]

Obj = dict[str, Any]


@dataclass
class ClusterMemory:
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


class HaMemory:
    """Every cluster's :class:`ClusterMemory`, by uid."""

    def __init__(self) -> None:
        self._by_uid: dict[str, ClusterMemory] = {}
        self._uid_of: dict[tuple[str, str], str] = {}

    def of(self, cluster: Obj) -> ClusterMemory:
        """The memory of ``cluster``; a cluster recreated under the same name gets a new one."""
        meta = cluster["metadata"]
        key, uid = (meta["namespace"], meta["name"]), meta["uid"]
        previous = self._uid_of.get(key)
        if previous is not None and previous != uid:
            self._by_uid.pop(previous, None)
        self._uid_of[key] = uid
        return self._by_uid.setdefault(uid, ClusterMemory())

    def forget(self, namespace: str, name: str) -> None:
        """The cluster is gone: drop what was remembered of it."""
        uid = self._uid_of.pop((namespace, name), None)
        if uid is not None:
            self._by_uid.pop(uid, None)

    def __len__(self) -> int:
        return len(self._by_uid)
