"""Updating the primary by switchover: when a rolling update or a restart hands the primary role away first.

Pure decisions; the reconciler asks them when the primary is the only instance left to roll (a pod-template change)
or to restart (``pendingRestart``), and :class:`~kanri.postgres.ha.failover_step.FailoverStep` carries the switchover
out as a planned one (``status.failover.reason`` ``RollingUpdate`` or ``PendingRestart``). Restarting the primary
in place costs writes a pod's restart (seconds to tens of seconds); a switchover costs them the demotion and the
promotion (about a second, docs/benchmarks.md), and the old primary is then updated as a replica.

The target must already have the change (rolled, or restarted): otherwise it would need its own restart right after
becoming the primary. The restart order of ``restarts.py`` stays in force: a change lowering ``max_connections`` or
another standby limit restarts the primary first, in place — a switchover would promote a replica still running with
the higher limit, and the demoted primary, now its standby with the lower one, would refuse to start.

A planned switchover that failed or was abandoned is recorded in ``status.primaryUpdate`` with the spec's generation:
the primary's update then waits (``Progressing`` reason ``PrimaryUpdateWaiting``) instead of retrying every minute,
until the spec changes, the primary is switched over by hand, or ``primaryUpdateStrategy`` is ``InPlace``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

from kanri.postgres.cluster.instances import InstanceReport

__all__ = ["PLANNED", "PlannedReason", "record_blocks", "restart_up_to_date", "switchover_target", "waiting_message"]

Obj = dict[str, Any]
PlannedReason = Literal["RollingUpdate", "PendingRestart", "NodeMaintenance"]
PLANNED: frozenset[str] = frozenset({"Switchover", "RollingUpdate", "PendingRestart", "NodeMaintenance"})
"""``status.failover.reason`` of a switchover (by annotation, or begun by the operator to update the primary)."""


def switchover_target(
    primary: str | None, instances: Sequence[str], reports: Mapping[str, InstanceReport], up_to_date: Collection[str]
) -> str | None:
    """The replica to hand the primary role to before the primary is updated, or None (update it in place).

    A candidate is up to date and reports itself a ready (for a replica: its WAL receiver streams), unfenced replica
    whose receiver is not paused; the least replay lag wins, then the lowest instance number (every pass agrees)."""
    if primary is None:
        return None
    candidates = [
        name
        for name in instances
        if name != primary
        and name in up_to_date
        and (r := reports.get(name)) is not None
        and r.role == "replica"
        and r.ready
        and r.running
        and not r.fenced
        and not r.replication_paused
    ]
    if not candidates:
        return None

    def order(name: str) -> tuple[int, int]:
        tail = name.rpartition("-")[2]
        return reports[name].lag_bytes or 0, int(tail) if tail.isdigit() else 0

    return min(candidates, key=order)


def restart_up_to_date(instances: Sequence[str], reports: Mapping[str, InstanceReport]) -> set[str]:
    """The instances that need no restart (their pending parameters are applied, or they had none)."""
    return {name for name in instances if (r := reports.get(name)) is not None and not r.pending_restart}


def record_blocks(record: Obj | None, generation: int) -> bool:
    """Whether ``status.primaryUpdate`` holds the primary's update back: a switchover for this very spec failed."""
    return record is not None and int(record.get("generation", -1)) == generation


def waiting_message(record: Obj, primary: str) -> str:
    """Why the primary's update waits, and the three ways on."""
    return (f"the update of the primary {primary} waits: {record.get('message') or record.get('reason')}; switch over "
            f"by hand (kubectl annotate pgc <cluster> kanri.dev/switchover-to=<replica>), set "
            f"spec.primaryUpdateStrategy InPlace, or change the spec to try again")  # fmt: skip
