"""Former primaries rejoin as replicas: the claim mark ``kanri.dev/rejoin``, the request, and what was lost.

A former primary is never a primary again until it rejoined: its report reads as fenced (:func:`withhold_rejoining`)
and its pod stays labelled ``fenced``. Once the new primary serves it is asked to rejoin (pg_rewind, or a fresh clone);
the mark goes once it reports itself an unfenced replica on the new timeline, and the WAL it had written past the
switchpoint, as it measured before rewinding, goes into ``status.lastFailover`` (:func:`record_divergence`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.cluster.problems import Problem
from kanri.postgres.ha import loss
from kanri.postgres.ha.context import FailoverContext
from kanri.postgres.ha.failover import REJOIN
from kanri.postgres.labels import FENCED

__all__ = ["REJOIN_COOLDOWN", "record_divergence", "rejoin_former_primaries", "rejoining", "withhold_rejoining"]

Obj = dict[str, Any]

REJOIN_COOLDOWN = 30.0
"""Between two rejoin requests to the same instance."""


def rejoining(claims: Mapping[str, Obj]) -> dict[str, int]:
    """Former primaries that must follow the new timeline before they serve: instance -> that timeline."""
    found: dict[str, int] = {}
    for name, claim in claims.items():
        value = (claim["metadata"].get("annotations") or {}).get(REJOIN)
        if value is not None:
            found[name] = int(value) if value.isdigit() else 1
    return found


def withhold_rejoining(reports: Mapping[str, InstanceReport], marked: Mapping[str, int]) -> dict[str, InstanceReport]:
    """A former primary's report never counts as a primary: it is read as fenced until it is back as a replica."""
    return {
        name: report.model_copy(update={"fenced": True}) if name in marked and report.role == "primary" else report
        for name, report in reports.items()
    }


async def rejoin_former_primaries(ctx: FailoverContext) -> None:
    """Each former primary (claim marked ``kanri.dev/rejoin``) is asked to rejoin once the new primary serves;
    the mark goes once it reports itself an unfenced replica on the new timeline."""
    marked = rejoining(ctx.claims)
    if not marked:
        return
    current = ctx.primary
    current_report = ctx.reports.get(current) if current else None
    serving = current_report is not None and current_report.role == "primary" and current_report.ready
    for instance, timeline in marked.items():
        raw = ctx.raw.get(instance)
        if raw is None:
            continue
        rejoin = raw.rejoin
        if raw.role == "replica" and not raw.fenced and (raw.timeline or 0) >= timeline and raw.ready:
            await record_divergence(ctx, instance, raw)
            await ctx.annotate_claim(instance, {REJOIN: None})
            how = {"rewind": "pg_rewind", "clone": "a fresh clone"}.get((rejoin and rejoin.method) or "", "streaming")
            detail = f": {rejoin.message}" if rejoin and rejoin.message else ""
            await ctx.r.events.normal(ctx.cluster, "Rejoined", f"{instance} rejoined as a replica of "
                                       f"timeline {raw.timeline} by {how}{detail}")  # fmt: skip
            continue
        state = rejoin.state if rejoin else None
        if state == "running" or not serving:
            continue
        if rejoin is not None and rejoin.state == "failed":
            ctx.problems.append(Problem("RejoinFailed", f"{instance} could not rejoin: "
                                         f"{rejoin.message or 'see its log'}"))  # fmt: skip
        asked = ctx.memory.rejoin_requests.get(instance)
        if asked is not None and ctx.r.clock() - asked < REJOIN_COOLDOWN:
            continue
        address = ctx.address(instance)
        if address is None:
            continue
        await ctx.label(instance, FENCED)
        if raw.role == "primary" and not raw.fenced:
            await ctx.r.instances.fence(address, ctx.token or "", f"failover: {current} is the primary now")
        if await ctx.r.instances.rejoin(address, ctx.token or ""):
            ctx.memory.rejoin_requests[instance] = ctx.r.clock()
            await ctx.r.events.normal(ctx.cluster, "Rejoining", f"{instance} (a former primary) rejoins as "
                                       f"a replica of {current}")  # fmt: skip


async def record_divergence(ctx: FailoverContext, instance: str, raw: InstanceReport) -> None:
    """The WAL the former primary had written past the switchpoint, measured by it before its rewind or clone,
    into the failover's record: the gap estimated at the promotion (its position as last seen) was a lower
    bound; this is the loss itself (:func:`kanri.postgres.ha.loss.measured`: measured 0, no loss is possible any
    more). Recorded once, and only for the failover that instance was the source of."""
    divergence = raw.rejoin.divergence if raw.rejoin else None
    measured = divergence.bytes if divergence else None
    switchpoint = divergence.switchpoint if divergence else None
    last = dict(ctx.status.get("lastFailover") or {})
    if measured is None or last.get("from") != instance or last.get("divergedBytes") is not None:
        return
    estimated = last.get("lsnGapBytes")
    where = f"past {switchpoint}" if switchpoint else "past the switchpoint"
    told = loss.measured(instance, measured, where, possible=bool(last.get("dataLossPossible")),
                         estimated=estimated if isinstance(estimated, int) else None)  # fmt: skip
    last.update({"divergedBytes": measured, "lsnGapBytes": told.gap, "dataLossPossible": told.possible})
    if switchpoint:
        last["divergedAt"] = switchpoint
    await ctx.write_status({"lastFailover": last})
    if told.warning:
        await ctx.r.events.warning(ctx.cluster, "FailoverLossMeasured", told.message)
    else:
        await ctx.r.events.normal(ctx.cluster, "FailoverLossMeasured", told.message)
