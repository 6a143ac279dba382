"""Failover and switchover: when the primary is declared failed, which replica is promoted, and when to stop and ask.

Pure decisions; ``failover_step.py`` carries them out. The state machine is ``status.failover.phase``:

- (none): the primary is probed every pass (every :data:`PROBE_INTERVAL` s while it has replicas); once it stayed
  failed for the detection window (:func:`window`) plus ``failover.delaySeconds`` → ``Fencing``. A starved primary
  is not a dead one (issue 33): while it does not answer in time, each pass also sends a probe that may take the
  whole window to answer; an answer, however late, proves its manager ran after that probe was sent, so the window
  starts again from then (:func:`heard`). A frozen, stopped or cut-off primary answers no probe sent after the fault:
  it fails over exactly as before.
- ``Fencing``: the old primary's pod is labelled ``fenced`` (no Service routes to it) and asked to fence itself (stop
  PostgreSQL) if it answers; every reachable replica's WAL receiver is paused, so positions stop moving → ``Electing``.
- ``Electing``: the replica with the highest received (then replayed) LSN is chosen and :func:`guard` decides →
  ``Promoting``, or ``Blocked``.
- ``Blocked``: ``FailoverBlocked=True`` with the reason; waits for ``kanri.dev/approve-failover=<instance>``; cancelled
  (the old primary unfenced, the replicas resumed) when the old primary answers as a healthy primary again.
- ``Promoting``: ``POST /promote`` on the target; its claim becomes ``last-primary``; ``status.lastFailover`` is
  written, the other replicas resume streaming (from the new primary, through ``-rw``) → (none).

A switchover (``kanri.dev/switchover-to=<instance>``) runs ``Demoting`` (the primary shuts down cleanly and restarts
as a replica) → ``Promoting`` once the target received the shutdown checkpoint: nothing acknowledged is lost.

The old primary is marked on its claim (``kanri.dev/rejoin``) until it is back as a replica of the new timeline: its
reports never count as a primary again, its pod is labelled ``fenced``, and it is asked to rejoin (``pg_rewind``, or
a fresh clone when rewinding is impossible).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.metrics import lsn_bytes

__all__ = [
    "APPROVE",
    "LATE_PROBES",
    "NOT_RUNNING_WINDOW",
    "PROBE_INTERVAL",
    "REJOIN",
    "SUSPECT_INTERVAL",
    "SWITCHOVER",
    "UNREACHABLE_WINDOW",
    "BlockedReason",
    "Candidate",
    "Decision",
    "Failure",
    "best_candidate",
    "failure_of",
    "gap_bytes",
    "guard",
    "heard",
    "window",
]

Obj = dict[str, Any]

APPROVE = "kanri.dev/approve-failover"
"""Annotation on the PostgresCluster: the instance a human approves promoting while a failover is blocked."""
SWITCHOVER = "kanri.dev/switchover-to"
"""Annotation on the PostgresCluster: the replica to hand the primary role to (a planned switchover)."""
REJOIN = "kanri.dev/rejoin"
"""Annotation on a former primary's claim: the timeline it must follow before it may serve again."""

UNREACHABLE_WINDOW = 6.0
"""Seconds the primary's instance manager may stay unanswering, while its pod is meant to run, before the primary
is declared failed. Longer than the instance's own isolation window (4 s: a partitioned primary has stopped itself
first); as CNPG's 15 s lease / Patroni's 30 s TTL, but measured from the last good answer, probed every second."""
NOT_RUNNING_WINDOW = 30.0
"""Seconds the instance manager may answer that PostgreSQL is not running or not accepting connections (a crash the
manager restarts, a pod being recreated in place) before the primary is declared failed: restarting in place is
faster and loses nothing, so it gets its chance first."""
PROBE_INTERVAL = 2.0
"""How often a cluster with replicas is looked at (its primary probed) when nothing is happening."""
SUSPECT_INTERVAL = 1.0
"""How often while the primary does not answer, and while a failover or switchover runs."""

LATE_PROBES = 6
"""At most this many late probes (a ``/status`` with the whole window to answer) in flight per cluster: one a pass."""

Failure = Literal["PrimaryUnreachable", "PrimaryNotRunning", "PrimaryRestarting", "PrimaryDataLost"]
BlockedReason = Literal["ManualPolicy", "DataLossAboveLimit", "DataLossUnknown", "NoSynchronousStandby",
                        "NoCandidate"]  # fmt: skip


DATA_LOST = "DataDirectoryLost"
"""The problem an instance reports when its volume is empty while the cluster has data (it never runs initdb)."""

STARTING_GRACE = 20.0
"""Seconds after its container started during which a silent primary counts as restarting, not unreachable: its
instance manager (a Python process) may take that long to answer on a loaded machine. Seen in a CI run: right after
a wake from hibernation the new primary pod's manager had not answered within the 6 s window and its replica,
started at the same moment, was promoted."""


def _running_pod(pod: Obj | None, now: datetime | None = None) -> bool:
    """The pod is meant to be answering now: it exists, is not being deleted, and its container started (at least
    :data:`STARTING_GRACE` before ``now``, when given)."""
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return False
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    states = [c.get("state") or {} for c in status.get("containerStatuses") or [{}]]
    if not all("running" in state for state in states):
        return False
    if now is None:
        return True
    for state in states:
        started = _timestamp(state["running"].get("startedAt"))
        if started is not None and (now - started).total_seconds() < STARTING_GRACE:
            return False
    return True


def _timestamp(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def failure_of(report: InstanceReport | None, pod: Obj | None, now: datetime | None = None) -> Failure | None:
    """Why the primary is failed now (None: it serves). ``report`` is its answer this pass (None: no answer);
    ``now`` (wall clock) lets a container that has only just started count as restarting."""
    if report is not None:
        if report.role == "primary" and report.running and report.ready:
            return None
        if any(p.reason == DATA_LOST for p in report.problems):
            return "PrimaryDataLost"  # its volume came back empty: no restart in place can bring the data back
        return "PrimaryNotRunning"
    return "PrimaryUnreachable" if _running_pod(pod, now) else "PrimaryRestarting"


def window(failure: Failure, delay_seconds: int) -> float:
    """How long ``failure`` must last before the failover starts (a lost data directory: not at all, beyond the
    spec's delay — waiting cannot bring the data back, and the replicas are the only copies left)."""
    if failure == "PrimaryDataLost":
        return float(delay_seconds)
    base = UNREACHABLE_WINDOW if failure == "PrimaryUnreachable" else NOT_RUNNING_WINDOW
    return base + delay_seconds


def heard(suspect: tuple[str, float] | None, primary: str, sent: float) -> tuple[str, float] | None:
    """The suspicion once ``primary`` answered a probe sent at ``sent`` (late: after the pass gave up on it): its
    manager ran after ``sent``, so the primary counts as silent only from then. None when there is nothing to move:
    no suspicion of that primary any more (it recovered, or a failover began) or one that began after ``sent``."""
    if suspect is None or suspect[0] != primary or suspect[1] >= sent:
        return None
    return primary, sent


@dataclass(frozen=True)
class Candidate:
    """A replica whose WAL receiver was paused, and where it stopped."""

    name: str
    receive_lsn: str | None
    replay_lsn: str | None
    timeline: int | None = None

    @property
    def height(self) -> tuple[int, int]:
        return lsn_bytes(self.receive_lsn) or 0, lsn_bytes(self.replay_lsn) or 0

    def as_status(self) -> Obj:
        entry: Obj = {"name": self.name}
        if self.receive_lsn:
            entry["receivedLSN"] = self.receive_lsn
        if self.replay_lsn:
            entry["replayedLSN"] = self.replay_lsn
        return entry

    @classmethod
    def from_status(cls, entry: Obj) -> Candidate:
        return cls(str(entry["name"]), entry.get("receivedLSN"), entry.get("replayedLSN"))


def best_candidate(candidates: Sequence[Candidate]) -> Candidate | None:
    """The highest received LSN, then replayed; the lowest instance number breaks a tie (every pass agrees)."""
    if not candidates:
        return None

    def number(c: Candidate) -> int:
        tail = c.name.rpartition("-")[2]
        return int(tail) if tail.isdigit() else 0

    return max(candidates, key=lambda c: (*c.height, -number(c)))


def gap_bytes(primary_lsn: str | None, candidate: Candidate) -> int | None:
    """WAL the failed primary had (as last seen) that the candidate did not receive; None when unknown."""
    primary = lsn_bytes(primary_lsn)
    if primary is None:
        return None
    return max(primary - candidate.height[0], 0)


@dataclass(frozen=True)
class Decision:
    """Whether to promote ``candidate`` now, or why not."""

    candidate: Candidate | None
    gap: int | None
    blocked: BlockedReason | None = None
    message: str = ""
    data_loss_possible: bool = True
    approved: bool = False


def sync_quorum_heard(standbys: int, required: int, heard: int) -> bool:
    """With ``ANY required`` of ``standbys``, every acknowledged commit is on ``required`` of them: hearing from
    ``standbys - required + 1`` of them guarantees that one holds it."""
    return required >= 1 and heard >= standbys - required + 1


def guard(
    candidates: Sequence[Candidate],
    *,
    primary_lsn: str | None,
    policy: str,
    max_data_loss_bytes: int,
    sync_mode: bool,
    sync_standbys: int,
    standbys: int,
    approved: str | None,
    switchover: bool = False,
    evidence: str = "",
) -> Decision:
    """The RPO guard (seed §7D): promote only when the loss is bounded as the spec allows, else stop and ask.

    ``standbys``: how many replicas the primary had (the synchronous set); ``approved``: the instance named by
    ``kanri.dev/approve-failover``, which overrides the guard when it is one of the candidates; ``primary_lsn``: the
    failed primary's last known position (:mod:`kanri.postgres.ha.position`), ``evidence`` what the replicas said
    of it (named when it is unknown)."""
    best = best_candidate(candidates)
    # Every acknowledged commit is on a candidate that answered only in mode Sync with the quorum heard; otherwise
    # the primary may have acknowledged commits after it was last seen, whatever the gap as last seen.
    every_commit_heard = sync_mode and sync_quorum_heard(standbys, sync_standbys, len(candidates))
    if approved is not None:
        chosen = next((c for c in candidates if c.name == approved), None)
        if chosen is not None:
            gap = gap_bytes(primary_lsn, chosen)
            lossless = every_commit_heard and chosen == best  # the best holds every acknowledged commit
            return Decision(chosen, gap, data_loss_possible=not lossless and not switchover, approved=True,
                            message=f"promotion of {chosen.name} approved by {APPROVE}")  # fmt: skip
    if best is None:
        return Decision(None, None, "NoCandidate", "no replica answered: nothing can be promoted yet")
    gap = gap_bytes(primary_lsn, best)
    gap_text = "unknown" if gap is None else f"{gap} bytes"
    ask = f"approve with: kubectl annotate pgc <cluster> {APPROVE}={best.name}"
    if switchover:
        return Decision(best, gap, data_loss_possible=False)
    if every_commit_heard:
        # Every acknowledged commit is on the best candidate: the gap (if any) holds only unacknowledged WAL.
        return Decision(best, gap, data_loss_possible=False)
    if policy == "Manual":
        return Decision(best, gap, "ManualPolicy", f"failover.policy is Manual: best candidate {best.name}, possible "
                        f"loss {gap_text}; {ask}")  # fmt: skip
    if sync_mode:
        return Decision(best, gap, "NoSynchronousStandby", f"mode Sync, but only {len(candidates)} of {standbys} "
                        f"standbys answered: none is known to hold every acknowledged commit; best candidate "
                        f"{best.name}, possible loss {gap_text}; {ask}")  # fmt: skip
    if gap is None:
        said = evidence or "no replica reported evidence of its WAL end"
        return Decision(best, gap, "DataLossUnknown", f"the failed primary's last position is unknown (the operator "
                        f"had not seen it healthy since it started; {said}): best candidate {best.name}; "
                        f"{ask}")  # fmt: skip
    if gap > max_data_loss_bytes:
        return Decision(best, gap, "DataLossAboveLimit", f"best candidate {best.name} lacks {gap} bytes of WAL, above "
                        f"failover.maxDataLossBytes ({max_data_loss_bytes}); {ask}")  # fmt: skip
    # Async: the primary may have written more after it was last seen, so loss is always possible.
    return Decision(best, gap, data_loss_possible=True)


def replicas_of(reports: Mapping[str, InstanceReport], primary: str) -> list[str]:
    """The instances that answered as replicas (the ones whose receivers can be paused)."""
    return sorted(name for name, r in reports.items() if name != primary and r.role == "replica")
