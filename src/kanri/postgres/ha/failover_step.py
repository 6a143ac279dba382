"""Carrying out failovers, switchovers and rejoins (the decisions are ``failover.py``'s; switchovers are
``switchover.py``'s, rejoins ``rejoin.py``'s, the per-pass view and its writes ``context.py``'s).

:class:`FailoverStep` runs once per reconcile pass, before anything else changes the cluster. Every phase is written
to ``status.failover`` before its actions, so an operator killed at any point resumes where it stopped: each action
is idempotent (fencing a fenced instance, pausing a paused replica, promoting a replica that already reports
primary). What only lives in memory — when the primary was last seen healthy, and where its WAL stood — is lost with
the operator; a restarted operator measures the detection window afresh (a later failover, never an earlier one)
and bounds the loss with what the replicas last heard of the old primary's WAL when that is recent enough
(:mod:`kanri.postgres.ha.position`); otherwise it cannot bound it (``DataLossUnknown``: it asks).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kanri.postgres import names
from kanri.postgres.children.config import synchronous_standbys
from kanri.postgres.cluster.problems import Problem
from kanri.postgres.cluster.recorded import LAST_PRIMARY, TIMELINE
from kanri.postgres.ha import durability, loss
from kanri.postgres.ha import switchover as switchovers
from kanri.postgres.ha.announce import announce_missed, finished_event, mark_announced
from kanri.postgres.ha.context import FailoverContext, Operator, iso, log, parse_time, status_progress
from kanri.postgres.ha.context import now as _now
from kanri.postgres.ha.failover import (
    APPROVE,
    LATE_PROBES,
    PROBE_INTERVAL,
    REJOIN,
    SUSPECT_INTERVAL,
    SWITCHOVER,
    UNREACHABLE_WINDOW,
    Candidate,
    Decision,
    Failure,
    failure_of,
    guard,
    heard,
    window,
)
from kanri.postgres.ha.position import last_position, node_silence, witnesses
from kanri.postgres.ha.primary_update import PLANNED, PlannedReason
from kanri.postgres.ha.rejoin import rejoin_former_primaries
from kanri.postgres.labels import FENCED, PRIMARY
from kanri.postgres.metrics import lsn_bytes
from kanri.runtime import ApiError
from kanri.runtime.kinds import CONFIG_MAP, NODE

__all__ = ["FailoverStep", "Operator", "StepResult"]

Obj = dict[str, Any]

FENCE_ATTEMPT = 2.0
"""How long the fence request to a failed primary may take: it usually does not answer at all."""


@dataclass
class StepResult:
    """What the rest of the pass needs from the step."""

    active: bool = False
    """A failover or switchover is under way: the pass changes nothing else (no rollout, scale or restart)."""
    requeue: float | None = None
    progress: Obj | None = None
    """``status.failover`` as it stands after the step."""
    problems: list[Problem] = field(default_factory=list)
    cluster: Obj = field(default_factory=dict)
    """The cluster as the step last wrote it (its status is newer than the cache's)."""
    promoted: bool = False
    """A replica was promoted this pass: the rest of the pass would read an outdated primary."""


class FailoverStep(FailoverContext):
    """One pass's failover work for one cluster; see the module docstring."""

    # --- the step ------------------------------------------------------------------------------------------------

    async def run(self) -> StepResult:
        return self._finished(await self._run())

    async def planned_switchover(self, target: str, reason: PlannedReason) -> StepResult | None:
        """A switchover the operator begins itself to update the primary (``primary_update.py``); None when it
        cannot begin now (a ``SwitchoverRefused`` Event says why)."""
        started = await self.start_switchover(target, reason)
        return self._finished(started) if started is not None else None

    def _finished(self, result: StepResult) -> StepResult:
        result.cluster = self.cluster
        result.promoted = self.promoted
        result.problems = [*result.problems, *(p for p in self.problems if p not in result.problems)]
        return result

    async def _run(self) -> StepResult:
        if self.token is None or self.spec.replicas == 0:
            return StepResult()
        if (self.status.get("upgrade") or {}).get("phase") == "Upgrading":
            return StepResult()  # the upgrade stops and restarts every instance on purpose: nothing to fail over
        await rejoin_former_primaries(self)
        await announce_missed(self)  # the last failover's Event, if an operator killed after its record missed it
        progress = self.status.get("failover")
        if progress:
            return await self.resume(dict(progress))
        if self.primary is None or self.primary not in self.instances or len(self.instances) < 2:
            return StepResult()
        await self.resume_left_paused()
        target = self.annotations.get(SWITCHOVER)
        if target and target != self.primary:
            started = await self.start_switchover(target)
            if started is not None:
                return started
        return await self.watch_primary()

    async def watch_primary(self) -> StepResult:
        """Probe the primary; start the failover once it stayed failed for the window."""
        assert self.primary is not None
        primary = self.primary
        raw = self.raw.get(primary)
        clock = self.r.clock()
        if raw is not None and raw.fenced and (raw.fence_reason or "").startswith("isolated"):
            # It stopped itself when it could not reach the API server or any standby, and no failover followed:
            # it is still the primary, so it serves again.
            address = self.address(primary)
            if address is not None and await self.r.instances.unfence(address, self.token or ""):
                await self.r.events.normal(self.cluster, "Unfenced", f"{primary} had fenced itself "
                                           f"({raw.fence_reason}); no failover happened: it serves again")  # fmt: skip
            return StepResult(requeue=SUSPECT_INTERVAL)
        failure = failure_of(self.reports.get(primary), self.pods.get(primary), datetime.now(UTC))
        seen = self.memory.primary_seen
        if failure is None:
            report = self.reports[primary]
            self.memory.primary_seen = (primary, report.write_lsn, report.timeline, clock)
            self.memory.suspect = None
            return StepResult(requeue=PROBE_INTERVAL)
        if self.status.get("phase") in (None, "Pending", "Provisioning"):
            return StepResult()  # never Ready: no replica holds its data yet, there is nothing to fail over to
        since = self.memory.suspect
        if since is None or since[0] != primary:
            # From the last good answer when it was recent: the fault happened after it, not at this probe.
            last_good = seen[3] if seen is not None and seen[0] == primary else clock
            since = (primary, min(clock, max(last_good, clock - 2 * PROBE_INTERVAL)))
            self.memory.suspect = since
            log.warning("primary not healthy; watching", cluster=self.name, namespace=self.namespace,
                        primary=primary, failure=failure)  # fmt: skip
        elapsed = clock - since[1]
        limit = window(failure, self.spec.failover.delay_seconds)
        if elapsed < limit:
            if failure == "PrimaryUnreachable":
                self.probe_late(primary, limit)
            return StepResult(requeue=SUSPECT_INTERVAL)
        self.memory.suspect = None
        lsn, timeline = (seen[1], seen[2]) if seen is not None and seen[0] == primary else (None, None)
        return await self.start_failover(primary, failure, elapsed, lsn, timeline)

    async def start_failover(
        self, primary: str, failure: Failure, elapsed: float, lsn: str | None, timeline: int | None
    ) -> StepResult:
        """Record the failover's first phase with the inputs the guard will use, then carry it on. The old primary's
        position: the operator's memory (``lsn``) or what the replicas last heard of it (``ha/position.py``)."""
        silent = await self.primary_node_silence(primary) if lsn is None else None
        known = last_position(lsn, witnesses(self.raw, primary), watched=elapsed, node_silent=silent,
                              timeline=timeline or self.status.get("timeline"))  # fmt: skip
        progress: Obj = {"phase": "Fencing", "from": primary, "reason": failure, "started": iso(_now()),
                         "primaryLSN": known.lsn, "primaryLSNSource": known.source, "primaryTimeline": timeline,
                         "primaryLSNEvidence": known.evidence[:512] if known.source != "Memory" else None}  # fmt: skip
        progress = status_progress(progress)
        self.memory.failover_started = self.r.clock()
        await self.set_progress(progress)
        await self.r.events.warning(self.cluster, "FailoverStarted", f"primary {primary} failed ({failure} for "
                                    f"{elapsed:.0f} s): fencing it, pausing the replicas' WAL receivers")  # fmt: skip
        return await self.resume(progress)

    async def primary_node_silence(self, primary: str) -> float | None:
        """At least how many seconds ago the primary's node last renewed its Lease, from its Node (``get nodes``, as
        node maintenance reads it): known only once the node lifecycle controller marked it ``Ready=Unknown``
        (``NodeStatusUnknown``); None otherwise (:func:`~kanri.postgres.ha.position.node_silence`)."""
        node = ((self.pods.get(primary) or {}).get("spec") or {}).get("nodeName")
        if not node:
            return None
        try:
            found = await self.r.client.get(NODE, str(node))
        except ApiError as exc:
            log.info("node unreadable: the failover anchors on its own detection", node=node, status=exc.status)
            return None
        return node_silence(found, _now(), self.r.node_monitor_grace)

    def probe_late(self, primary: str, limit: float) -> None:
        """Ask the silent primary's ``/status`` once more in the background with ``limit`` (the whole window) to
        answer in, at most :data:`LATE_PROBES` at once: a starved manager answers late, a dead one never."""
        address = self.address(primary)
        tag = f"late-status {self.namespace}/{self.name}"
        if address is None or sum(t.get_name() == tag for t in self.r.background) >= LATE_PROBES:
            return
        task = asyncio.create_task(self._late_status(primary, address, self.r.clock(), limit), name=tag)
        self.r.background.add(task)
        task.add_done_callback(self.r.background.discard)

    async def _late_status(self, primary: str, address: str, sent: float, limit: float) -> None:
        if await self.r.instances.status(address, timeout=limit, token=self.token) is None:
            return
        moved = heard(self.memory.suspect, primary, sent)
        if moved is not None:
            self.memory.suspect = moved
            log.info("primary answered late: starved, not failed", cluster=self.name, namespace=self.namespace,
                     primary=primary, seconds=round(self.r.clock() - sent, 1))  # fmt: skip

    async def resume(self, progress: Obj) -> StepResult:
        """Carry the failover or switchover on from its recorded phase."""
        for _ in range(4):  # phases that finish at once go straight on to the next one
            phase = progress.get("phase")
            if phase == "Fencing":
                progress = await self.fence(progress)
            elif phase == "Electing":
                progress = await self.elect(progress)
            elif phase == "Blocked":
                return await self.blocked(progress)
            elif phase == "Demoting":
                progress = await switchovers.demote(self, progress)
                if progress.get("phase") == "Demoting":
                    return StepResult(active=True, requeue=SUSPECT_INTERVAL, progress=progress)
            elif phase == "Promoting":
                done = await self.promote(progress)
                if done:
                    return StepResult(requeue=SUSPECT_INTERVAL)
                return StepResult(active=True, requeue=SUSPECT_INTERVAL / 2, progress=self.status.get("failover"))
            else:
                await self.set_progress(None)
                return StepResult()
            if progress is None or not self.status.get("failover"):
                return StepResult(requeue=SUSPECT_INTERVAL)
        return StepResult(active=True, requeue=SUSPECT_INTERVAL, progress=progress)

    async def fence(self, progress: Obj) -> Obj:
        """Routing first (the label), then a stop request the failed primary will probably not answer, then the
        replicas' receivers paused: from here on nobody's position moves."""
        old = str(progress["from"])
        await self.label(old, FENCED)
        address = self.address(old)
        if address is not None and self.token is not None:
            reason = f"failover: {old} was declared failed ({progress.get('reason')})"
            # It usually does not answer (routing is cut already, and its own isolation check stops it): the request
            # goes on in the background instead of delaying the election.
            task = asyncio.create_task(self._try_fence(address, self.token, reason))
            self.r.background.add(task)
            task.add_done_callback(self.r.background.discard)
        candidates = await self.pause_replicas(old, [])
        progress = {**progress, "phase": "Electing", "candidates": [c.as_status() for c in candidates]}
        await self.set_progress(progress)
        return progress

    async def _try_fence(self, address: str, token: str, reason: str) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.r.instances.fence(address, token, reason), FENCE_ATTEMPT)

    async def pause_replicas(self, old: str, known: list[Candidate]) -> list[Candidate]:
        """Pause every replica not paused yet (all at once); the candidates known plus those that answered."""
        have = {c.name for c in known}
        asked = [i for i in self.instances if i != old and i not in have and self.address(i) is not None]
        answers = await asyncio.gather(*(self.r.instances.pause_replication(self.address(i) or "", self.token or "")
                                         for i in asked))  # fmt: skip
        found = list(known)
        for instance, paused in zip(asked, answers, strict=True):
            if paused is not None:
                found.append(Candidate(instance, paused.receive_lsn, paused.replay_lsn, paused.timeline))
        return found

    def decide(self, progress: Obj, candidates: list[Candidate]) -> Decision:
        sync = self.spec.replication.mode == "Sync"
        # dataDurability preferred may have lowered the number commits waited for: count on the one in force
        in_force = durability.in_force(self.r.cache.get(CONFIG_MAP, names.config_map(self.name), self.namespace))
        return guard(
            candidates,
            primary_lsn=progress.get("primaryLSN"),
            policy=self.spec.failover.policy,
            max_data_loss_bytes=self.spec.failover.max_data_loss_bytes,
            sync_mode=sync,
            sync_standbys=durability.guarded_standbys(synchronous_standbys(self.spec), in_force),
            standbys=len(self.instances) - 1,
            approved=self.annotations.get(APPROVE),
            evidence=str(progress.get("primaryLSNEvidence") or ""),
        )

    async def elect(self, progress: Obj) -> Obj:
        candidates = [Candidate.from_status(c) for c in progress.get("candidates") or []]
        decision = self.decide(progress, candidates)
        return await self.apply_decision(progress, decision)

    async def apply_decision(self, progress: Obj, decision: Decision) -> Obj:
        best = decision.candidate
        if decision.blocked is not None:
            entering = progress.get("phase") != "Blocked" or progress.get("blockedReason") != decision.blocked
            progress = {**progress, "phase": "Blocked", "blockedReason": decision.blocked,
                        "message": decision.message[:1024]}  # fmt: skip
            if best is not None:
                progress["target"] = best.name
            if decision.gap is not None:
                progress["lsnGapBytes"] = decision.gap
            await self.set_progress(progress)
            if entering:
                await self.r.events.warning(self.cluster, "FailoverBlocked", decision.message)
            return progress
        assert best is not None
        progress = {
            **progress,
            "phase": "Promoting",
            "target": best.name,
            "dataLossPossible": decision.data_loss_possible,
        }
        progress.pop("blockedReason", None)
        progress.pop("message", None)
        progress.pop("lsnGapBytes", None)  # as a Blocked phase had it: recorded again only as loss.recorded_gap says
        if (gap := loss.recorded_gap(decision.gap, decision.data_loss_possible)) is not None:
            progress["lsnGapBytes"] = gap
        if decision.approved:
            progress["approvedBy"] = self.annotations.get(APPROVE)
        await self.set_progress(status_progress(progress))
        return progress

    async def blocked(self, progress: Obj) -> StepResult:
        """Waiting for approval. Approving the old primary itself, or the old primary answering healthy again after
        it fenced itself, cancels the failover."""
        old = str(progress["from"])
        raw = self.raw.get(old)
        approved = self.annotations.get(APPROVE)
        came_back = raw is not None and (
            (raw.role == "primary" and raw.ready and not raw.fenced)
            or (raw.fenced and (raw.fence_reason or "").startswith("isolated"))
        )
        if approved == old or came_back:
            await self.cancel(progress, "approved keeping it" if approved == old else "it answers again")
            return StepResult(requeue=SUSPECT_INTERVAL)
        if progress.get("blockedReason") == "DataLossUnknown" and not progress.get("primaryLSN"):
            progress = await self.reposition(progress)
        known = [Candidate.from_status(c) for c in progress.get("candidates") or []]
        candidates = await self.pause_replicas(old, known)
        if len(candidates) != len(known):
            progress = {**progress, "candidates": [c.as_status() for c in candidates]}
        decision = self.decide(progress, candidates)
        progress = await self.apply_decision(progress, decision)
        if progress.get("phase") == "Promoting":
            done = await self.promote(progress)
            return StepResult(active=not done, requeue=SUSPECT_INTERVAL)
        self.problems.append(Problem("FailoverBlocked", str(progress.get("message") or "failover blocked")))
        return StepResult(active=True, requeue=2 * SUSPECT_INTERVAL, progress=progress)

    async def reposition(self, progress: Obj) -> Obj:
        """A failover blocked for want of the old primary's position, looked at again: the replicas' evidence (kept
        by their managers while paused) may count now that its node is known to be gone (``ha/position.py``). The
        progress with the position when it does (the guard's next decision records it), unchanged otherwise."""
        old = str(progress["from"])
        # since the operator found it failed: at least the detection window before the failover started
        watched = (_now() - parse_time(str(progress["started"]))).total_seconds() + UNREACHABLE_WINDOW
        known = last_position(None, witnesses(self.raw, old), watched=watched,
                              timeline=progress.get("primaryTimeline") or self.status.get("timeline"),
                              node_silent=await self.primary_node_silence(old))  # fmt: skip
        if known.lsn is None:
            return progress
        log.info("the old primary's position is known now", cluster=self.name, namespace=self.namespace,
                 primary=old, lsn=known.lsn, evidence=known.evidence)  # fmt: skip
        return {**progress, "primaryLSN": known.lsn, "primaryLSNSource": known.source,
                "primaryLSNEvidence": known.evidence[:512]}  # fmt: skip

    async def cancel(self, progress: Obj, why: str) -> None:
        old = str(progress["from"])
        address = self.address(old)
        if address is not None:
            await self.r.instances.unfence(address, self.token or "")
        await self.resume_all(old)
        await self.set_progress(None)
        await self.drop_annotation(APPROVE)
        await self.r.events.normal(self.cluster, "FailoverCancelled", f"failover from {old} cancelled: {why}; "
                                   f"{old} stays the primary")  # fmt: skip

    async def resume_left_paused(self) -> None:
        """Resume a replica whose receiver is still paused with no failover in progress. The pause exists only
        while a failover decides; a resume lost at the end of one (a timeout on a busy instance) would otherwise
        leave that replica without a WAL receiver for good — and in Sync mode a primary whose only standby it is
        stops taking writes."""
        for instance, report in self.raw.items():
            address = self.address(instance)
            if instance == self.primary or report.role != "replica" or not report.replication_paused or not address:
                continue
            resumed = await self.r.instances.resume_replication(address, self.token or "")
            log.warning("replication left paused with no failover in progress; resuming", cluster=self.name,
                        namespace=self.namespace, instance=instance, resumed=resumed)  # fmt: skip
            if resumed:
                await self.r.events.normal(self.cluster, "ReplicationResumed", f"{instance}'s WAL receiver was "
                                           "still paused after the failover: it streams again")  # fmt: skip

    async def resume_all(self, primary: str, former: str | None = None) -> None:
        """Let every replica stream again, from ``primary``. ``former`` (a failed primary, fenced, never paused) is
        not asked: a frozen one would hold the failover's last step for a whole request timeout."""
        others = [i for i in self.instances if i not in (primary, former) and self.address(i) is not None]
        await asyncio.gather(*(self.r.instances.resume_replication(self.address(i) or "", self.token or "")
                               for i in others))  # fmt: skip

    async def promote(self, progress: Obj) -> bool:
        """Promote the target; True once it is the primary and everything is recorded."""
        target = str(progress["target"])
        old = str(progress["from"])
        switchover = progress.get("reason") in PLANNED
        if switchover and not self.caught_up(progress, target):
            started = parse_time(str(progress["started"]))
            if (_now() - started).total_seconds() > switchovers.SWITCHOVER_TIMEOUT:
                await switchovers.abandon_switchover(
                    self, progress, f"{target} did not receive {old}'s shutdown checkpoint"
                )
            return False
        raw = self.raw.get(target)
        timeline: int | None = None
        if raw is not None and raw.role == "primary" and not raw.fenced:
            timeline = raw.timeline  # promoted in an earlier pass (an operator killed right after)
        else:
            address = self.address(target)
            promoted = await self.r.instances.promote(address, self.token or "") if address else None
            if promoted is None:
                log.warning("promotion not done yet; retrying", cluster=self.name, target=target)
                return False
            timeline = promoted.timeline
        await self.finish(progress, target, old, timeline, switchover)
        return True

    def caught_up(self, progress: Obj, target: str) -> bool:
        """A switchover's target has received the demoted primary's shutdown checkpoint."""
        checkpoint = lsn_bytes(progress.get("checkpointLSN"))
        report = self.raw.get(target)
        if report is None:
            return False
        if report.role == "primary":
            return True
        received = lsn_bytes(report.receive_lsn)
        return checkpoint is not None and received is not None and received > checkpoint

    async def finish(self, progress: Obj, target: str, old: str, timeline: int | None, switchover: bool) -> None:
        """The target is primary: record it everywhere, route to it, let the others follow."""
        await self.annotate_claim(target, {LAST_PRIMARY: "true", TIMELINE: str(timeline) if timeline else None,
                                           REJOIN: None})  # fmt: skip
        old_marks: dict[str, str | None] = {LAST_PRIMARY: None, TIMELINE: None}
        if not switchover:
            old_marks[REJOIN] = str(timeline or 1)
        if old != target:  # an abandoned switchover promotes the old primary back: it is no former primary
            await self.annotate_claim(old, old_marks)
        await self.label(target, PRIMARY)
        await self.resume_all(target, former=None if switchover else old)
        started = parse_time(str(progress["started"]))
        now = _now()
        began, self.memory.failover_started = self.memory.failover_started, None
        duration = self.r.clock() - began if began is not None else (now - started).total_seconds()
        record: Obj = {"time": iso(now), "from": old, "to": target, "reason": progress.get("reason"),
                       "dataLossPossible": bool(progress.get("dataLossPossible", not switchover)),
                       "durationSeconds": round(max(duration, 0.0), 3)}  # fmt: skip
        if switchover:
            record["lsnGapBytes"] = 0
            record["dataLossPossible"] = False
        elif (gap := loss.recorded_gap(progress.get("lsnGapBytes"), record["dataLossPossible"])) is not None:
            record["lsnGapBytes"] = gap  # a 0 as last seen bounds nothing while loss is possible: not recorded
        if timeline:
            record["timeline"] = timeline
        if progress.get("approvedBy"):
            record["approvedBy"] = progress["approvedBy"]
        if not switchover and progress.get("primaryLSNSource"):
            record["primaryLSNSource"] = progress["primaryLSNSource"]
        patch: Obj = {"failover": None, "lastFailover": record, "currentPrimary": target}
        if timeline:
            patch["timeline"] = timeline
        await self.write_status(patch)
        await self.drop_annotation(APPROVE)
        if switchover and progress.get("reason") == "Switchover":
            await self.drop_annotation(SWITCHOVER)
        if switchover or old == target:  # SwitchedOver, PrimaryRestored: all they say is in the record
            await self.r.events.event(self.cluster, *finished_event(record))
        else:
            gap = progress.get("lsnGapBytes")
            if gap is None and lsn_bytes(progress.get("primaryLSN")) is not None:
                gap = 0  # the position was known, the gap 0 as last seen (loss.recorded_gap leaves it out)
            lost = loss.promotion_loss(old, gap, record["dataLossPossible"], progress.get("primaryLSNSource"),
                                       str(progress.get("primaryLSNEvidence") or ""))  # fmt: skip
            await self.r.events.warning(self.cluster, "FailedOver", f"promoted {target} (timeline {timeline or '?'}) "
                                        f"after {old} failed ({progress.get('reason')}); {lost}")  # fmt: skip
        await mark_announced(self, record)  # told: a later pass does not post it again (ha/announce.py)
        if self.r.metrics is not None:
            self.r.metrics.promoted(self.namespace, self.name, str(progress.get("reason")))
        self.memory.primary_seen = None
        self.promoted = True
        log.warning("promoted", cluster=self.name, namespace=self.namespace, primary=target, former=old,
                    timeline=timeline, reason=progress.get("reason"))  # fmt: skip

    async def start_switchover(self, target: str, reason: str = "Switchover") -> StepResult | None:
        """A switchover to ``target`` begun and carried on (:func:`switchovers.begin`), or None when it cannot begin."""
        progress = await switchovers.begin(self, target, reason)
        return await self.resume(progress) if progress is not None else None
