"""The Event that tells a failover or switchover finished, derived from ``status.lastFailover`` so that it is told
even when the operator that wrote the record was killed before posting it.

The step writes the record, posts the Event, then marks the cluster with the record's time
(:data:`ANNOUNCED`). A later pass that finds a record newer than the mark (no failover running) posts the Event
from the record and marks it: at least once, and at most twice (a kill between the Event and the mark). A record
older than :data:`REPOST_WITHIN` is never posted late: a cluster made before the mark existed gets no stale Event.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from kanri.postgres.ha.context import FailoverContext, now, parse_time
from kanri.postgres.ha.loss import promotion_loss
from kanri.postgres.ha.primary_update import PLANNED
from kanri.postgres.kinds import POSTGRES_CLUSTER

__all__ = ["ANNOUNCED", "REPOST_WITHIN", "announce_missed", "finished_event", "mark_announced"]

Obj = dict[str, Any]
EventType = Literal["Normal", "Warning"]

ANNOUNCED = "kanri.dev/failover-announced"
"""On the cluster: ``status.lastFailover.time`` of the last failover or switchover whose Event was posted."""
REPOST_WITHIN = timedelta(minutes=15)
"""How old a record may be and still get its missed Event (an operator restart takes seconds to minutes)."""


def finished_event(record: Obj) -> tuple[EventType, str, str]:
    """The Event of a finished failover or switchover, from its record (type, reason, message)."""
    old, target = str(record.get("from")), str(record.get("to"))
    timeline = record.get("timeline") or "?"
    reason = record.get("reason")
    if reason in PLANNED:
        then = {"Switchover": "", "NodeMaintenance": ", and its node can be drained (NodeMaintenance)"}.get(
            str(reason), f", and is updated next ({reason})"
        )
        return "Normal", "SwitchedOver", f"{target} is the primary (timeline {timeline}); {old} follows it as a " \
                                         f"replica{then}"  # fmt: skip
    if old == target:
        return "Normal", "PrimaryRestored", (f"{old} is the primary again (timeline {timeline}) after the switchover "
                                             f"was abandoned")  # fmt: skip
    lost = promotion_loss(old, record.get("lsnGapBytes"), bool(record.get("dataLossPossible", True)))
    return "Warning", "FailedOver", f"promoted {target} (timeline {timeline}) after {old} failed ({reason}); {lost}"


async def mark_announced(ctx: FailoverContext, record: Obj) -> None:
    """Mark the record's Event as posted (after posting it)."""
    when = str(record.get("time"))
    await ctx.r.client.patch(POSTGRES_CLUSTER, ctx.name, {"metadata": {"annotations": {ANNOUNCED: when}}},
                             ctx.namespace)  # fmt: skip
    ctx.annotations[ANNOUNCED] = when


async def announce_missed(ctx: FailoverContext) -> bool:
    """Post the Event of a finished failover or switchover that was recorded but not told (the operator was killed
    in between); True when it did."""
    record = ctx.status.get("lastFailover")
    if not isinstance(record, dict) or ctx.status.get("failover") or not record.get("time"):
        return False
    when = str(record["time"])
    if ctx.annotations.get(ANNOUNCED) == when:
        return False
    try:
        late = now() - parse_time(when) > REPOST_WITHIN
    except ValueError:
        return False
    if late:
        return False
    event_type, reason, message = finished_event(record)
    await ctx.r.events.event(ctx.cluster, event_type, reason, message)
    await mark_announced(ctx, record)
    return True
