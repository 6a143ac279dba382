"""Lag-aware reads: which replicas ``-ro`` and ``-r`` route to, and how far behind each one is.

A replica's own report knows only what it received and replayed; a replica whose WAL receiver froze has replayed
everything it received and reads as 0 bytes behind while the primary moves on. The primary's ``pg_stat_replication``
(``replicas[]`` of its report, one row per streaming standby, by ``application_name`` = the instance name) is the
truth: its ``lagBytes`` is the primary's current position minus the standby's replay position. A replica the
primary does not list is not streaming, and its lag is unknown — never 0.

A replica further behind than ``spec.replication.maxReadLagBytes``, or not listed, is labelled ``kanri.dev/reads:
withheld`` (neither ``-ro`` nor ``-r`` selects it) until the primary lists it within the bound again; the
``Degraded`` condition says which and why (``ReadsWithheld``). Without a primary's report nothing is known better
than before: the replica keeps its own figure and its label.

Weak spot: a primary that lists no standby at all is read as no report (the instance-manager doubles of the
integration tests send an empty list); so the one replica of a two-instance cluster whose receiver froze keeps its
own figure. With three or more instances the frozen one is caught.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.cluster.problems import Problem

__all__ = ["ReadLag", "read_lag", "withheld_problem"]

_MIB = 1 << 20


@dataclass(frozen=True)
class ReadLag:
    """Each replica's replay lag as the primary sees it, and the replicas that serve no reads (with why)."""

    lag: Mapping[str, int | None]
    """Replica -> bytes behind the primary in replay; None: unknown (the primary does not list it)."""
    withheld: Mapping[str, str]
    """Replica -> why it serves no reads."""


def _mib(value: int) -> str:
    return f"{value / _MIB:g} MiB" if value % _MIB == 0 else f"{value} bytes"


def read_lag(reports: Mapping[str, InstanceReport], primary: str | None, bound: int) -> ReadLag:
    """The replicas' lag from the primary's report (``bound``: maxReadLagBytes). Replicas not answering are left
    out (their label stays as it is); with no primary report, each replica's own figure, and none withheld."""
    source = reports.get(primary) if primary else None
    # An empty list is no evidence either way (test doubles send one); see the module's note on it.
    listed = source.replicas if source is not None and source.role == "primary" and source.replicas else None
    lag: dict[str, int | None] = {}
    withheld: dict[str, str] = {}
    for name, report in reports.items():
        if report.role != "replica" or name == primary:
            continue
        if listed is None:
            lag[name] = report.lag_bytes
            continue
        row = next((r for r in listed if r.name == name), None)
        if row is None or row.lag_bytes is None:
            lag[name] = None
            withheld[name] = f"{name} is not streaming from the primary (its lag is unknown)"
            continue
        lag[name] = row.lag_bytes
        if row.lag_bytes > bound:
            withheld[name] = f"{name} is further behind in replay than replication.maxReadLagBytes ({_mib(bound)})"
    return ReadLag(lag=lag, withheld=withheld)


def withheld_problem(
    withheld: Mapping[str, str], reports: Mapping[str, InstanceReport], before: Collection[str]
) -> Problem | None:
    """``ReadsWithheld`` for ``Degraded``: ready replicas withheld this pass and the one before (``before``), so a
    replica that just started, or a planned switchover's former primary, is not told as a fault for the second it
    takes to stream. The messages name no byte count, so a replica catching up slowly does not rewrite the status
    (nor send an Event) on every pass."""
    told = sorted(n for n in withheld if n in before and (r := reports.get(n)) is not None and r.ready)
    if not told:
        return None
    why = "; ".join(withheld[name] for name in told)
    return Problem("ReadsWithheld", f"{why}: no reads are routed to it (-ro, -r) until it catches up")
