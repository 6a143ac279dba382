"""Switchovers: handing the primary role to a chosen replica with nothing lost (the step is ``failover_step.py``).

Asked by the annotation ``kanri.dev/switchover`` or begun by the operator to update the primary
(``primary_update.py``). The primary is demoted first (a clean shutdown: its last WAL, the shutdown checkpoint,
reaches the replicas), then the target is promoted once it has received that checkpoint. A primary that stops
answering while it is demoted turns the switchover into a failover; a target that cannot take over within
:data:`SWITCHOVER_TIMEOUT` gives the role back to the demoted primary, which has every commit.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from kanri.postgres.cluster.instances import Demoted
from kanri.postgres.ha.context import FailoverContext, iso, log, lsn_text, now, parse_time, status_progress
from kanri.postgres.ha.failover import SUSPECT_INTERVAL, SWITCHOVER, failure_of, window
from kanri.postgres.ha.primary_update import PLANNED
from kanri.postgres.labels import FENCED, PRIMARY
from kanri.postgres.metrics import lsn_bytes

__all__ = ["SWITCHOVER_TIMEOUT", "abandon_switchover", "begin", "demote", "record_planned_failure"]

Obj = dict[str, Any]

SWITCHOVER_TIMEOUT = 60.0
"""A switchover whose target has not caught up (or answered) by then is abandoned: the old primary is promoted back."""


async def begin(ctx: FailoverContext, target: str, reason: str = "Switchover") -> Obj | None:
    """Begin a switchover to ``target`` when it can be done now (its first phase recorded, returned for the step to
    carry on); otherwise say why once (an Event) and return None. ``reason``: ``Switchover`` (asked by annotation)
    or the update of the primary that asks for it (``PLANNED``)."""
    assert ctx.primary is not None
    primary_report = ctx.reports.get(ctx.primary)
    target_report = ctx.reports.get(target)
    why: str | None = None
    if target not in ctx.instances:
        why = f"{target} is not an instance of this cluster"
    elif target_report is None or target_report.role != "replica" or not target_report.ready:
        why = f"{target} is not a ready replica"
    elif primary_report is None or failure_of(primary_report, ctx.pods.get(ctx.primary)) is not None:
        why = f"the primary {ctx.primary} is not healthy (a failover, not a switchover, handles that)"
    if why is not None:
        told = ctx.memory.switchover_refused
        if told != (target, why):
            ctx.memory.switchover_refused = (target, why)
            await ctx.r.events.warning(ctx.cluster, "SwitchoverRefused", f"switchover to {target}: {why}")
        return None
    ctx.memory.switchover_refused = None
    progress: Obj = {"phase": "Demoting", "from": ctx.primary, "reason": reason, "target": target,
                     "started": iso(now())}  # fmt: skip
    assert primary_report is not None
    if primary_report.write_lsn:
        progress["primaryLSN"] = primary_report.write_lsn
    ctx.memory.failover_started = ctx.r.clock()
    ctx.memory.suspect = None  # the primary answered: the window of a failure during it starts afresh
    await ctx.set_progress(progress)
    why = {"Switchover": "", "NodeMaintenance": f" (NodeMaintenance: {ctx.primary}'s node is cordoned)"}.get(
        reason, f" before updating {ctx.primary} ({reason})"
    )
    await ctx.r.events.normal(ctx.cluster, "SwitchoverStarted", f"handing the primary role from "
                               f"{ctx.primary} to {target}{why}")  # fmt: skip
    return progress


async def demote(ctx: FailoverContext, progress: Obj) -> Obj:
    """Phase ``Demoting``: the primary, cut from routing, shuts down cleanly; its shutdown checkpoint moves the
    switchover on to ``Promoting``. A primary that stops answering turns it into a failover; one that cannot be
    demoted within :data:`SWITCHOVER_TIMEOUT` stays the primary. Returns the progress as it now stands."""
    old = str(progress["from"])
    await ctx.label(old, FENCED)  # no new writes reach it while it shuts down
    raw = ctx.raw.get(old)
    address = ctx.address(old)
    checkpoint: str | None = None
    if raw is not None and raw.role == "replica" and (end := lsn_bytes(raw.replay_lsn)) is not None:
        # Demoted in an earlier pass: its replay ends just after the shutdown checkpoint record, so the target
        # must have received at least that much (one byte before it, in the strictly-greater test below).
        checkpoint = lsn_text(end - 1)
    elif raw is not None and address is not None:
        # Not asked while it does not answer its status: a demote request to a frozen primary would hold this
        # pass for the whole demote timeout.
        demoted, unanswered_since = await demote_watched(ctx, address)
        if demoted is not None:
            checkpoint = demoted.checkpoint_lsn
        elif unanswered_since is not None:
            ctx.memory.suspect = (old, unanswered_since)
            raw = None  # it stopped answering while it was being demoted
    if checkpoint is None:
        if raw is None and (failover := await failed_while_demoting(ctx, progress)) is not None:
            return failover
        if raw is not None:
            ctx.memory.suspect = None
        started = parse_time(str(progress["started"]))
        if (now() - started).total_seconds() > SWITCHOVER_TIMEOUT:
            await ctx.label(old, PRIMARY)
            await ctx.set_progress(None)
            await ctx.drop_annotation(SWITCHOVER)
            await ctx.r.events.warning(ctx.cluster, "SwitchoverFailed", f"{old} could not be demoted; it stays "
                                        "the primary")  # fmt: skip
            await record_planned_failure(ctx, progress, "SwitchoverFailed", f"{old} could not be demoted "
                                              f"within {SWITCHOVER_TIMEOUT:.0f} s")  # fmt: skip
            return {}
        return progress
    progress = {**progress, "phase": "Promoting", "checkpointLSN": checkpoint}
    await ctx.set_progress(status_progress(progress))
    return progress


async def demote_watched(ctx: FailoverContext, address: str) -> tuple[Demoted | None, float | None]:
    """Ask the primary to demote itself, probing its status meanwhile (a clean shutdown may take long, but its
    manager answers while it runs). When it stops answering for the detection window the request is given up:
    returns (None, since when it did not answer); otherwise (the demotion or None, None)."""
    request = asyncio.create_task(ctx.r.instances.demote(address, ctx.token or ""))
    unanswered_since: float | None = None
    limit = window("PrimaryUnreachable", ctx.spec.failover.delay_seconds)
    try:
        while True:
            done, _ = await asyncio.wait({request}, timeout=SUSPECT_INTERVAL)
            if done:
                return request.result(), None
            asked = ctx.r.clock()
            answered = await ctx.r.instances.status(address, token=ctx.token) is not None
            if request.done():
                return request.result(), None
            if answered:
                unanswered_since = None
                continue
            unanswered_since = asked if unanswered_since is None else unanswered_since
            silent = ctx.r.clock() - unanswered_since
            if silent >= limit:
                log.warning("primary stopped answering while being demoted", cluster=ctx.name,
                            namespace=ctx.namespace, seconds=round(silent, 1))  # fmt: skip
                return None, unanswered_since
    finally:
        if not request.done():
            request.cancel()
            with contextlib.suppress(BaseException):
                await request


async def failed_while_demoting(ctx: FailoverContext, progress: Obj) -> Obj | None:
    """The primary being handed over stopped answering: once that lasted the detection window, the switchover
    becomes a failover (fenced, elected, guarded as any other) instead of waiting out the switchover timeout
    with writes stopped. None while the window runs."""
    old = str(progress["from"])
    clock = ctx.r.clock()
    since = ctx.memory.suspect
    if since is None or since[0] != old:
        ctx.memory.suspect = (old, clock)
        return None
    elapsed = clock - since[1]
    if elapsed < window("PrimaryUnreachable", ctx.spec.failover.delay_seconds):
        return None
    ctx.memory.suspect = None
    failover: Obj = {"phase": "Fencing", "from": old, "reason": "PrimaryUnreachable", "started": iso(now())}
    for key in ("primaryLSN", "primaryTimeline"):  # as last seen when the switchover began
        if progress.get(key):
            failover[key] = progress[key]
    await ctx.drop_annotation(SWITCHOVER)
    await ctx.set_progress(failover)
    await ctx.r.events.warning(ctx.cluster, "FailoverStarted", f"primary {old} stopped answering during the "
                                f"switchover to {progress.get('target')} ({elapsed:.0f} s): failing over "
                                "instead")  # fmt: skip
    return failover


async def abandon_switchover(ctx: FailoverContext, progress: Obj, why: str) -> None:
    """The target cannot take over: the demoted primary is promoted back (it has every commit)."""
    old = str(progress["from"])
    await ctx.drop_annotation(SWITCHOVER)
    await record_planned_failure(ctx, progress, "SwitchoverAbandoned", f"the switchover to "
                                      f"{progress.get('target')} was abandoned ({why})")  # fmt: skip
    progress = {**progress, "target": old, "reason": "SwitchoverAbandoned", "checkpointLSN": None,
                "dataLossPossible": False}  # fmt: skip
    await ctx.set_progress(status_progress(progress))
    await ctx.r.events.warning(ctx.cluster, "SwitchoverAbandoned", f"{why}: promoting {old} back")


async def record_planned_failure(ctx: FailoverContext, progress: Obj, reason: str, message: str) -> None:
    """A switchover begun to update the primary did not happen: ``status.primaryUpdate`` holds the update back
    (``primary_update.py``), so it is not tried again every minute for the same spec."""
    if progress.get("reason") not in PLANNED - {"Switchover", "NodeMaintenance"}:  # no update waits on these
        return
    generation = int(ctx.cluster["metadata"].get("generation", 0))
    text = f"{message} while updating it ({progress['reason']})"[:1024]
    record = {"reason": reason, "generation": generation, "time": iso(now()), "message": text}
    await ctx.write_status({"primaryUpdate": record})
