"""``replication.dataDurability``: how many synchronous standbys a commit waits for right now.

With ``required`` (the default) the number in ``synchronous_standby_names`` is the spec's ``syncStandbys``, whatever
happens: a commit waits until that many replicas flushed it, so writes stop while fewer are connected.

With ``preferred`` (CloudNativePG's name for the same choice) the operator writes ``min(syncStandbys, streaming)``,
where ``streaming`` counts the other instances the primary's ``pg_stat_replication`` lists in state ``streaming``
(PostgreSQL takes only those as synchronous standbys; one in ``catchup`` does not count). Writes then go on while
replicas are gone, with fewer copies per commit (none, once no replica streams), and the number goes back up as soon
as the primary lists them streaming again. Reduced durability is a ``DurabilityReduced`` problem (the ``Degraded``
condition and a Warning Event), so nobody believes a commit is on more replicas than it is.

Without the primary's report (it does not answer, or reports no primary role) nothing new is known: the number in
force (the instances' ConfigMap) stays, never above the spec's. The failover guard counts the lower of the spec's
number and the one in force, so it never believes a commit waited for more standbys than it did.

Known limits: a replica cut off without its connection closing (a partition, a frozen node) stays listed as
streaming until the primary's ``wal_sender_timeout`` (60 s) ends its WAL sender, so under ``preferred`` writes wait up
to that long; and after the number is raised, the primary applies it a config reload later (seconds), a window in
which a failover guard reads the raised number.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kanri.contract.instance_config import ClusterConfig
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children.config import CONFIG_KEY, synchronous_standbys
from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.cluster.problems import Problem

__all__ = [
    "REASON",
    "Durability",
    "decide",
    "guarded_standbys",
    "in_force",
    "problem",
    "streaming_standbys",
]

REASON = "DurabilityReduced"


@dataclass(frozen=True)
class Durability:
    """How many synchronous standbys the spec asks for, and how many a commit waits for now."""

    required: int
    """``syncStandbys`` with mode Sync (default 1), 0 with mode Async."""
    count: int
    """The number written for ``synchronous_standby_names``: ``required``, or fewer under ``preferred``."""
    streaming: tuple[str, ...] | None = None
    """The replicas the primary lists as streaming (None: no report of the primary)."""

    @property
    def reduced(self) -> bool:
        """Commits wait for fewer standbys than the spec asks for."""
        return self.count < self.required


def streaming_standbys(report: InstanceReport | None, primary: str, instances: Sequence[str]) -> tuple[str, ...] | None:
    """The other instances ``report`` (the primary's) lists in state ``streaming``; None when it is no primary's
    report (no answer, or the instance does not say it is primary)."""
    if report is None or report.role != "primary":
        return None
    others = set(instances) - {primary}
    return tuple(sorted({r.name for r in report.replicas or () if r.name in others and r.state == "streaming"}))


def decide(spec: PostgresClusterSpec, streaming: tuple[str, ...] | None, in_force: int | None) -> Durability:
    """The number of synchronous standbys to write: the spec's under ``required``; under ``preferred`` the spec's
    capped at the replicas ``streaming`` now, or at ``in_force`` (the ConfigMap's number) when the primary's report
    is missing."""
    required = synchronous_standbys(spec)
    if spec.replication.durability == "required" or required == 0:
        return Durability(required, required, streaming)
    if streaming is None:
        return Durability(required, required if in_force is None else min(required, in_force), None)
    return Durability(required, min(required, len(streaming)), streaming)


def problem(durability: Durability) -> Problem | None:
    """``DurabilityReduced`` while commits wait for fewer standbys than ``syncStandbys``; the message names no
    changing figure but the counts, so it changes (and posts an Event) only when they do."""
    if not durability.reduced:
        return None
    which = ", ".join(durability.streaming) if durability.streaming else "none"
    return Problem(
        REASON,
        f"dataDurability preferred: commits wait for {durability.count} synchronous standby(s), not the "
        f"{durability.required} of replication.syncStandbys (replicas streaming: {which}); a failover now may lose "
        f"acknowledged commits. The number goes back up as replicas stream again",
    )


def guarded_standbys(required: int, in_force: int | None) -> int:
    """What the failover guard may count on: the lower of the spec's number and the one in force."""
    return required if in_force is None else min(required, in_force)


def in_force(config_map: dict[str, Any] | None) -> int | None:
    """The number of synchronous standbys the instances' ConfigMap holds now; None without a readable one."""
    document = ((config_map or {}).get("data") or {}).get(CONFIG_KEY)
    if not isinstance(document, str):
        return None
    try:
        return ClusterConfig.parse(document.encode()).synchronous_standbys
    except ValueError:
        return None
