"""Carrying out failovers, switchovers and rejoins (the decisions are ``failover.py``'s).

:class:`FailoverStep` runs once per reconcile pass, before anything else changes the cluster. Every phase is written
to ``status.failover`` before its actions, so an operator killed at any point resumes where it stopped: each action
is idempotent (fencing a fenced instance, pausing a paused replica, promoting a replica that already reports
primary). What only lives in memory — when the primary was last seen healthy, and where its WAL stood — is lost with
the operator; a restarted operator measures the detection window afresh (a later failover, never an earlier one)
and, not knowing the old primary's position, cannot bound the loss (``DataLossUnknown``: it asks).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.cluster.instances import Demoted, InstanceClient, InstanceReport
from kanri.postgres.cluster.problems import Problem
from kanri.postgres.cluster.recorded import LAST_PRIMARY, TIMELINE
from kanri.postgres.credentials.secrets import secret_value
from kanri.postgres.ha.failover import (
    APPROVE,
    LATE_PROBES,
    PROBE_INTERVAL,
    REJOIN,
    SUSPECT_INTERVAL,
    SWITCHOVER,
    Candidate,
    Decision,
    failure_of,
    guard,
    heard,
    window,
)
from kanri.postgres.ha.memory import HaMemory
from kanri.postgres.ha.primary_update import PLANNED, PlannedReason
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import FENCED, PRIMARY, ROLE
from kanri.postgres.metrics import PostgresMetrics, lsn_bytes
from kanri.runtime import ApiError, Cache, Client, EventRecorder
from kanri.runtime.kinds import POD, PVC, SECRET

__all__ = ["FailoverStep", "StepResult", "rejoining", "withhold_rejoining"]

Obj = dict[str, Any]
log = structlog.get_logger("kanri.postgres.ha.failover")


class Operator(Protocol):
    """What the step uses of the operator (the PostgresClusterReconciler, which it never imports)."""

    @property
    def cache(self) -> Cache: ...

    @property
    def client(self) -> Client: ...

    @property
    def instances(self) -> InstanceClient: ...

    @property
    def events(self) -> EventRecorder: ...

    @property
    def metrics(self) -> PostgresMetrics | None: ...

    @property
    def ha(self) -> HaMemory:
        """Per-cluster memory between passes (see :mod:`kanri.postgres.ha.memory`)."""
        ...

    @property
    def background(self) -> set[asyncio.Task[None]]:
        """Requests that must not hold a pass up; the operator cancels what is left at shutdown."""
        ...

    def clock(self) -> float: ...


FENCE_ATTEMPT = 2.0
"""How long the fence request to a failed primary may take: it usually does not answer at all."""
SWITCHOVER_TIMEOUT = 60.0
"""A switchover whose target has not caught up (or answered) by then is abandoned: the old primary is promoted back."""
REJOIN_COOLDOWN = 30.0
"""Between two rejoin requests to the same instance."""


def _now() -> datetime:
    return datetime.now(UTC)


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


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
        name: replace(report, fenced=True) if name in marked and report.role == "primary" else report
        for name, report in reports.items()
    }


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


class FailoverStep:
    """One pass's failover work for one cluster; see the module docstring."""

    def __init__(
        self,
        reconciler: Operator,
        cluster: Obj,
        spec: PostgresClusterSpec,
        *,
        primary: str | None,
        instances: list[str],
        reports: Mapping[str, InstanceReport],
        raw: Mapping[str, InstanceReport],
        pods: dict[str, Obj],
        claims: Mapping[str, Obj],
    ) -> None:
        self.r = reconciler
        self.cluster = cluster
        self.spec = spec
        self.primary = primary
        self.instances = instances
        self.reports = reports
        """As routed: a fenced or rejoining instance reads as role ``fenced``."""
        self.raw = raw
        """As the instances answered."""
        self.pods = pods
        self.claims = claims
        meta = cluster["metadata"]
        self.name: str = meta["name"]
        self.namespace: str = meta["namespace"]
        self.memory = reconciler.ha.of(cluster)
        self.status: Obj = cluster.get("status") or {}
        self.annotations: dict[str, str] = dict(meta.get("annotations") or {})
        self.token = secret_value(reconciler.cache.get(SECRET, names.api_secret(self.name), self.namespace), "token")
        self.problems: list[Problem] = []
        self.promoted = False

    # --- plumbing ------------------------------------------------------------------------------------------------

    def address(self, instance: str) -> str | None:
        pod = self.pods.get(instance)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            return None
        ip = (pod.get("status") or {}).get("podIP")
        return str(ip) if ip else None

    async def write_status(self, patch: Obj) -> None:
        """Write status fields at once (the phase must survive this process)."""
        updated = await self.r.client.patch_status(POSTGRES_CLUSTER, self.name, {"status": patch}, self.namespace)
        self.status = updated.get("status") or {}
        self.cluster = {**self.cluster, "metadata": updated.get("metadata", self.cluster["metadata"]),
                        "status": self.status}  # fmt: skip

    async def set_progress(self, progress: Obj | None) -> None:
        began = self.memory.failover_started
        elapsed = round(self.r.clock() - began, 3) if began is not None else None
        log.info("failover phase", cluster=self.name, namespace=self.namespace,
                 phase=(progress or {}).get("phase"), elapsed=elapsed)  # fmt: skip
        await self.write_status({"failover": progress})

    async def label(self, instance: str, role: str) -> None:
        pod = self.pods.get(instance)
        if pod is None:
            return
        labels = pod["metadata"].get("labels") or {}
        if labels.get(ROLE) == role:
            return
        try:
            await self.r.client.patch(POD, pod["metadata"]["name"], {"metadata": {"labels": {ROLE: role}}},
                                      self.namespace)  # fmt: skip
        except ApiError as exc:
            if not exc.not_found:
                log.warning("relabelling refused", instance=instance, status=exc.status, error=exc.message)
            return
        self.pods[instance] = {**pod, "metadata": {**pod["metadata"], "labels": {**labels, ROLE: role}}}

    async def annotate_claim(self, instance: str, annotations: dict[str, str | None]) -> None:
        try:
            await self.r.client.patch(PVC, instance, {"metadata": {"annotations": annotations}}, self.namespace)
        except ApiError as exc:
            if not exc.not_found:
                raise

    async def drop_annotation(self, key: str) -> None:
        if key in self.annotations:
            await self.r.client.patch(POSTGRES_CLUSTER, self.name, {"metadata": {"annotations": {key: None}}},
                                      self.namespace)  # fmt: skip
            self.annotations.pop(key, None)

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
        await self.rejoin_former_primaries()
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
        failure = failure_of(self.reports.get(primary), self.pods.get(primary))
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
        progress: Obj = {"phase": "Fencing", "from": primary, "reason": failure, "started": _iso(_now())}
        if lsn:
            progress["primaryLSN"] = lsn
        if timeline:
            progress["primaryTimeline"] = timeline
        self.memory.failover_started = clock
        await self.set_progress(progress)
        await self.r.events.warning(self.cluster, "FailoverStarted", f"primary {primary} failed ({failure} for "
                                    f"{elapsed:.0f} s): fencing it, pausing the replicas' WAL receivers")  # fmt: skip
        return await self.resume(progress)

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
                progress = await self.demote(progress)
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
        replication = self.spec.replication
        sync = replication.mode == "Sync"
        return guard(
            candidates,
            primary_lsn=progress.get("primaryLSN"),
            policy=self.spec.failover.policy,
            max_data_loss_bytes=self.spec.failover.max_data_loss_bytes,
            sync_mode=sync,
            sync_standbys=(replication.sync_standbys or 1) if sync else 0,
            standbys=len(self.instances) - 1,
            approved=self.annotations.get(APPROVE),
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
        if decision.gap is not None:
            progress["lsnGapBytes"] = decision.gap
        if decision.approved:
            progress["approvedBy"] = self.annotations.get(APPROVE)
        await self.set_progress(_status_progress(progress))
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
            started = _parse(str(progress["started"]))
            if (_now() - started).total_seconds() > SWITCHOVER_TIMEOUT:
                await self.abandon_switchover(progress, f"{target} did not receive {old}'s shutdown checkpoint")
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
        started = _parse(str(progress["started"]))
        now = _now()
        began, self.memory.failover_started = self.memory.failover_started, None
        duration = self.r.clock() - began if began is not None else (now - started).total_seconds()
        record: Obj = {"time": _iso(now), "from": old, "to": target, "reason": progress.get("reason"),
                       "dataLossPossible": bool(progress.get("dataLossPossible", not switchover)),
                       "durationSeconds": round(max(duration, 0.0), 3)}  # fmt: skip
        if switchover:
            record["lsnGapBytes"] = 0
            record["dataLossPossible"] = False
        elif progress.get("lsnGapBytes") is not None:
            record["lsnGapBytes"] = progress["lsnGapBytes"]
        if timeline:
            record["timeline"] = timeline
        if progress.get("approvedBy"):
            record["approvedBy"] = progress["approvedBy"]
        patch: Obj = {"failover": None, "lastFailover": record, "currentPrimary": target}
        if timeline:
            patch["timeline"] = timeline
        await self.write_status(patch)
        await self.drop_annotation(APPROVE)
        if switchover:
            if progress.get("reason") == "Switchover":
                await self.drop_annotation(SWITCHOVER)
            then = "" if progress.get("reason") == "Switchover" else f", and is updated next ({progress['reason']})"
            await self.r.events.normal(self.cluster, "SwitchedOver", f"{target} is the primary (timeline "
                                       f"{timeline or '?'}); {old} follows it as a replica{then}")  # fmt: skip
        elif old == target:
            await self.r.events.normal(self.cluster, "PrimaryRestored", f"{old} is the primary again (timeline "
                                       f"{timeline or '?'}) after the switchover was abandoned")  # fmt: skip
        else:
            gap = record.get("lsnGapBytes")
            loss = (f"possible data loss: up to {gap} bytes of WAL as last seen (more if {old} wrote after that)"
                    if record["dataLossPossible"] else "no acknowledged commit lost")  # fmt: skip
            await self.r.events.warning(self.cluster, "FailedOver", f"promoted {target} (timeline {timeline or '?'}) "
                                        f"after {old} failed ({progress.get('reason')}); {loss}")  # fmt: skip
        if self.r.metrics is not None:
            self.r.metrics.promoted(self.namespace, self.name, str(progress.get("reason")))
        self.memory.primary_seen = None
        self.promoted = True
        log.warning("promoted", cluster=self.name, namespace=self.namespace, primary=target, former=old,
                    timeline=timeline, reason=progress.get("reason"))  # fmt: skip

    # --- switchover ----------------------------------------------------------------------------------------------

    async def start_switchover(self, target: str, reason: str = "Switchover") -> StepResult | None:
        """Begin a switchover to ``target`` when it can be done now; otherwise say why once (an Event). ``reason``:
        ``Switchover`` (asked by annotation) or the update of the primary that asks for it (``PLANNED``)."""
        assert self.primary is not None
        primary_report = self.reports.get(self.primary)
        target_report = self.reports.get(target)
        why: str | None = None
        if target not in self.instances:
            why = f"{target} is not an instance of this cluster"
        elif target_report is None or target_report.role != "replica" or not target_report.ready:
            why = f"{target} is not a ready replica"
        elif primary_report is None or failure_of(primary_report, self.pods.get(self.primary)) is not None:
            why = f"the primary {self.primary} is not healthy (a failover, not a switchover, handles that)"
        if why is not None:
            told = self.memory.switchover_refused
            if told != (target, why):
                self.memory.switchover_refused = (target, why)
                await self.r.events.warning(self.cluster, "SwitchoverRefused", f"switchover to {target}: {why}")
            return None
        self.memory.switchover_refused = None
        progress: Obj = {"phase": "Demoting", "from": self.primary, "reason": reason, "target": target,
                         "started": _iso(_now())}  # fmt: skip
        assert primary_report is not None
        if primary_report.write_lsn:
            progress["primaryLSN"] = primary_report.write_lsn
        self.memory.failover_started = self.r.clock()
        self.memory.suspect = None  # the primary answered: the window of a failure during it starts afresh
        await self.set_progress(progress)
        why = "" if reason == "Switchover" else f" before updating {self.primary} ({reason})"
        await self.r.events.normal(self.cluster, "SwitchoverStarted", f"handing the primary role from "
                                   f"{self.primary} to {target}{why}")  # fmt: skip
        return await self.resume(progress)

    async def demote(self, progress: Obj) -> Obj:
        old = str(progress["from"])
        await self.label(old, FENCED)  # no new writes reach it while it shuts down
        raw = self.raw.get(old)
        address = self.address(old)
        checkpoint: str | None = None
        if raw is not None and raw.role == "replica" and (end := lsn_bytes(raw.replay_lsn)) is not None:
            # Demoted in an earlier pass: its replay ends just after the shutdown checkpoint record, so the target
            # must have received at least that much (one byte before it, in the strictly-greater test below).
            checkpoint = _lsn_text(end - 1)
        elif raw is not None and address is not None:
            # Not asked while it does not answer its status: a demote request to a frozen primary would hold this
            # pass for the whole demote timeout.
            demoted, unanswered_since = await self.demote_watched(address)
            if demoted is not None:
                checkpoint = demoted.checkpoint_lsn
            elif unanswered_since is not None:
                self.memory.suspect = (old, unanswered_since)
                raw = None  # it stopped answering while it was being demoted
        if checkpoint is None:
            if raw is None and (failover := await self.failed_while_demoting(progress)) is not None:
                return failover
            if raw is not None:
                self.memory.suspect = None
            started = _parse(str(progress["started"]))
            if (_now() - started).total_seconds() > SWITCHOVER_TIMEOUT:
                await self.label(old, PRIMARY)
                await self.set_progress(None)
                await self.drop_annotation(SWITCHOVER)
                await self.r.events.warning(self.cluster, "SwitchoverFailed", f"{old} could not be demoted; it stays "
                                            "the primary")  # fmt: skip
                await self.record_planned_failure(progress, "SwitchoverFailed", f"{old} could not be demoted "
                                                  f"within {SWITCHOVER_TIMEOUT:.0f} s")  # fmt: skip
                return {}
            return progress
        progress = {**progress, "phase": "Promoting", "checkpointLSN": checkpoint}
        await self.set_progress(_status_progress(progress))
        return progress

    async def demote_watched(self, address: str) -> tuple[Demoted | None, float | None]:
        """Ask the primary to demote itself, probing its status meanwhile (a clean shutdown may take long, but its
        manager answers while it runs). When it stops answering for the detection window the request is given up:
        returns (None, since when it did not answer); otherwise (the demotion or None, None)."""
        request = asyncio.create_task(self.r.instances.demote(address, self.token or ""))
        unanswered_since: float | None = None
        limit = window("PrimaryUnreachable", self.spec.failover.delay_seconds)
        try:
            while True:
                done, _ = await asyncio.wait({request}, timeout=SUSPECT_INTERVAL)
                if done:
                    return request.result(), None
                asked = self.r.clock()
                answered = await self.r.instances.status(address, token=self.token) is not None
                if request.done():
                    return request.result(), None
                if answered:
                    unanswered_since = None
                    continue
                unanswered_since = asked if unanswered_since is None else unanswered_since
                silent = self.r.clock() - unanswered_since
                if silent >= limit:
                    log.warning("primary stopped answering while being demoted", cluster=self.name,
                                namespace=self.namespace, seconds=round(silent, 1))  # fmt: skip
                    return None, unanswered_since
        finally:
            if not request.done():
                request.cancel()
                with contextlib.suppress(BaseException):
                    await request

    async def failed_while_demoting(self, progress: Obj) -> Obj | None:
        """The primary being handed over stopped answering: once that lasted the detection window, the switchover
        becomes a failover (fenced, elected, guarded as any other) instead of waiting out the switchover timeout
        with writes stopped. None while the window runs."""
        old = str(progress["from"])
        clock = self.r.clock()
        since = self.memory.suspect
        if since is None or since[0] != old:
            self.memory.suspect = (old, clock)
            return None
        elapsed = clock - since[1]
        if elapsed < window("PrimaryUnreachable", self.spec.failover.delay_seconds):
            return None
        self.memory.suspect = None
        failover: Obj = {"phase": "Fencing", "from": old, "reason": "PrimaryUnreachable", "started": _iso(_now())}
        for key in ("primaryLSN", "primaryTimeline"):  # as last seen when the switchover began
            if progress.get(key):
                failover[key] = progress[key]
        await self.drop_annotation(SWITCHOVER)
        await self.set_progress(failover)
        await self.r.events.warning(self.cluster, "FailoverStarted", f"primary {old} stopped answering during the "
                                    f"switchover to {progress.get('target')} ({elapsed:.0f} s): failing over "
                                    "instead")  # fmt: skip
        return failover

    async def abandon_switchover(self, progress: Obj, why: str) -> None:
        """The target cannot take over: the demoted primary is promoted back (it has every commit)."""
        old = str(progress["from"])
        await self.drop_annotation(SWITCHOVER)
        await self.record_planned_failure(progress, "SwitchoverAbandoned", f"the switchover to "
                                          f"{progress.get('target')} was abandoned ({why})")  # fmt: skip
        progress = {**progress, "target": old, "reason": "SwitchoverAbandoned", "checkpointLSN": None,
                    "dataLossPossible": False}  # fmt: skip
        await self.set_progress(_status_progress(progress))
        await self.r.events.warning(self.cluster, "SwitchoverAbandoned", f"{why}: promoting {old} back")

    async def record_planned_failure(self, progress: Obj, reason: str, message: str) -> None:
        """A switchover begun to update the primary did not happen: ``status.primaryUpdate`` holds the update back
        (``primary_update.py``), so it is not tried again every minute for the same spec."""
        if progress.get("reason") not in PLANNED - {"Switchover"}:
            return
        generation = int(self.cluster["metadata"].get("generation", 0))
        text = f"{message} while updating it ({progress['reason']})"[:1024]
        record = {"reason": reason, "generation": generation, "time": _iso(_now()), "message": text}
        await self.write_status({"primaryUpdate": record})

    # --- rejoin --------------------------------------------------------------------------------------------------

    async def rejoin_former_primaries(self) -> None:
        """Each former primary (claim marked ``kanri.dev/rejoin``) is asked to rejoin once the new primary serves;
        the mark goes once it reports itself an unfenced replica on the new timeline."""
        marked = rejoining(self.claims)
        if not marked:
            return
        current = self.primary
        current_report = self.reports.get(current) if current else None
        serving = current_report is not None and current_report.role == "primary" and current_report.ready
        for instance, timeline in marked.items():
            raw = self.raw.get(instance)
            if raw is None:
                continue
            if raw.role == "replica" and not raw.fenced and (raw.timeline or 0) >= timeline and raw.ready:
                await self.record_divergence(instance, raw)
                await self.annotate_claim(instance, {REJOIN: None})
                how = {"rewind": "pg_rewind", "clone": "a fresh clone"}.get(raw.rejoin_method or "", "streaming")
                detail = f": {raw.rejoin_message}" if raw.rejoin_message else ""
                await self.r.events.normal(self.cluster, "Rejoined", f"{instance} rejoined as a replica of "
                                           f"timeline {raw.timeline} by {how}{detail}")  # fmt: skip
                continue
            if raw.rejoin_state == "running" or not serving:
                continue
            if raw.rejoin_state == "failed":
                self.problems.append(Problem("RejoinFailed", f"{instance} could not rejoin: "
                                             f"{raw.rejoin_message or 'see its log'}"))  # fmt: skip
            asked = self.memory.rejoin_requests.get(instance)
            if asked is not None and self.r.clock() - asked < REJOIN_COOLDOWN:
                continue
            address = self.address(instance)
            if address is None:
                continue
            await self.label(instance, FENCED)
            if raw.role == "primary" and not raw.fenced:
                await self.r.instances.fence(address, self.token or "", f"failover: {current} is the primary now")
            if await self.r.instances.rejoin(address, self.token or ""):
                self.memory.rejoin_requests[instance] = self.r.clock()
                await self.r.events.normal(self.cluster, "Rejoining", f"{instance} (a former primary) rejoins as "
                                           f"a replica of {current}")  # fmt: skip

    async def record_divergence(self, instance: str, raw: InstanceReport) -> None:
        """The WAL the former primary had written past the switchpoint, measured by it before its rewind or clone,
        into the failover's record: the gap estimated at the promotion (its position as last seen) was a lower
        bound; this is the loss itself. Recorded once, and only for the failover that instance was the source of."""
        measured = raw.rejoin_diverged_bytes
        last = dict(self.status.get("lastFailover") or {})
        if measured is None or last.get("from") != instance or last.get("divergedBytes") is not None:
            return
        estimated = last.get("lsnGapBytes")
        last["divergedBytes"] = measured
        if raw.rejoin_switchpoint:
            last["divergedAt"] = raw.rejoin_switchpoint
        last["lsnGapBytes"] = max(measured, estimated if isinstance(estimated, int) else 0)
        await self.write_status({"lastFailover": last})
        where = f"past {raw.rejoin_switchpoint}" if raw.rejoin_switchpoint else "past the switchpoint"
        was = f"; estimated at the promotion: {estimated} bytes" if estimated is not None else ""
        if measured == 0:
            await self.r.events.normal(self.cluster, "FailoverLossMeasured", f"{instance} had written nothing "
                                       f"{where} on its timeline: the failover lost nothing{was}")  # fmt: skip
            return
        which = ("commits acknowledged from it are lost" if last.get("dataLossPossible")
                 else "none of it was acknowledged: the promoted standby was synchronous")  # fmt: skip
        message = f"{instance} had written {measured} bytes of WAL {where} on its old timeline, discarded when it "
        await self.r.events.warning(self.cluster, "FailoverLossMeasured", f"{message}rejoined; {which}{was}")


def _lsn_text(position: int) -> str:
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


def _status_progress(progress: Obj) -> Obj:
    """``status.failover`` holds only the schema's fields (and no nulls)."""
    allowed = ("phase", "from", "reason", "started", "primaryLSN", "primaryTimeline", "target", "checkpointLSN",
               "candidates", "lsnGapBytes", "dataLossPossible", "approvedBy", "blockedReason", "message")  # fmt: skip
    return {k: v for k, v in progress.items() if k in allowed and v is not None}
