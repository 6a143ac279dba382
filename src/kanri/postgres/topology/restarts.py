"""Restarting instances whose configuration changed in a way only a restart applies (``pendingRestart``).

One at a time, and only while every instance is ready: a restart never takes a second instance down. The order
follows PostgreSQL's rule that a hot standby needs ``max_connections`` (and the other limits the instances report in
``pendingRestartLowers``) at least as high as its primary's: raising them restarts the replicas first and the
primary last; lowering them restarts the primary first — a replica restarted first with a lower value than its
running primary's refuses to start ("recovery aborted because of insufficient parameter settings"), measured on
PostgreSQL 15. Everything else goes replicas first, so the primary restarts once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from kanri.postgres.cluster.instances import InstanceReport

__all__ = ["RestartMemory", "next_restart"]


@dataclass
class RestartMemory:
    """What the restart step remembers of one cluster between passes (in memory: losing it costs one more request
    after an operator restart, which the instance answers harmlessly, and one more settling period)."""

    pending: tuple[frozenset[str], float] | None = None
    """Which instances report a pending restart, and since when (the operator's clock)."""
    requested: dict[str, float] = field(default_factory=dict)
    """Instance -> when a restart was last requested."""


def next_restart(instances: Sequence[str], primary: str | None, reports: Mapping[str, InstanceReport]) -> str | None:
    """The instance to restart now, or None (nothing pending, or someone is not ready yet)."""
    pending = [name for name in instances if (r := reports.get(name)) is not None and r.pending_restart]
    if not pending:
        return None
    if any((r := reports.get(name)) is None or not r.ready for name in instances):
        return None  # one at a time: wait until the previous restart (or anything else) has settled
    if primary in pending and reports[primary].pending_lowers:
        return primary
    replicas = [name for name in pending if name != primary]
    return replicas[0] if replicas else pending[0]
