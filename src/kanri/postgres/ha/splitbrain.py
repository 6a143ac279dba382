"""Split brain: two or more instances report themselves primary (PostgreSQL out of recovery) in the same pass.

Seen in the hostile round: ``select pg_promote()`` on a replica made it report primary; the operator then preferred
the highest timeline, so the hand-promoted replica won, both pods were labelled primary, ``-rw`` had two ready
endpoints and writes split between them. Now:

- **Which one stays** is what the operator *recorded*, never who has the highest timeline (a hand promotion always
  has the highest): the claims' ``kanri.dev/last-primary`` mark (``recorded.py``), then ``status.currentPrimary``.
  Only when neither names one of the primaries does the highest timeline, then write LSN, win — and the record says
  so (``keptBy: HighestPosition``).
- **The others are fenced**, in the same pass: routing first (pod label ``kanri.dev/role=fenced``, which neither
  ``-rw`` nor ``-ro`` selects), then ``POST /fence`` (the instance stops PostgreSQL and keeps it stopped). An instance
  that reports ``fenced`` no longer counts as a primary.
- **A primary the record does not confirm** — one instance reports primary, but the recorded primary is another
  instance that did not answer this pass — is *held*: its report is left out (no label flips, the record does not
  move) until a pass sees both. Otherwise one slow answer from the real primary would hand the record to the rogue,
  and the next pass would fence the real primary.
- **The record** (``status.splitBrain``: when, who was kept and why, who was fenced, each one's timeline and write
  LSN at detection) stays until every fenced instance is resolved: gone, or back as an unfenced replica (a new
  volume re-cloned from the primary). While it stays, ``Degraded=True, SplitBrain`` names both sides.

Pure functions; the reconciler only wires them (``reconciler.py``: ``fence_rogues``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.cluster.problems import Problem
from kanri.postgres.labels import FENCED
from kanri.postgres.metrics import lsn_bytes

__all__ = [
    "KeptBy",
    "Position",
    "Verdict",
    "decide",
    "fenced_names",
    "next_record",
    "routed",
    "split_brain_problem",
]

Obj = dict[str, Any]
KeptBy = Literal["LastPrimary", "CurrentPrimary", "HighestPosition"]

_WHY: dict[str, str] = {
    "LastPrimary": "the primary the operator recorded",
    "CurrentPrimary": "status.currentPrimary",
    "HighestPosition": "no record names either of them: the highest timeline and write LSN",
}
HELP = "see 'Split brain' in docs/postgres-operator.md to recover it"


@dataclass(frozen=True)
class Position:
    """Where one primary's history stood when the split was seen."""

    name: str
    timeline: int | None
    lsn: str | None
    """Its write LSN (``pg_current_wal_lsn``)."""

    def as_status(self) -> Obj:
        entry: Obj = {"name": self.name}
        if self.timeline is not None:
            entry["timeline"] = self.timeline
        if self.lsn is not None:
            entry["lsn"] = self.lsn
        return entry

    def describe(self) -> str:
        return f"{self.name} (timeline {self.timeline or '?'}, LSN {self.lsn or '?'})"


@dataclass(frozen=True)
class Verdict:
    """What one pass's reports say about the primaries."""

    primary: str | None
    """The primary the pass follows (None: no confirmed primary reports)."""
    kept: Position | None = None
    """With a split: the primary that stays."""
    kept_by: KeptBy | None = None
    fence: tuple[Position, ...] = ()
    """The other primaries: fenced now."""
    held: tuple[str, ...] = ()
    """Primaries the record does not confirm this pass (their reports are left out)."""

    @property
    def split(self) -> bool:
        return bool(self.fence)


def _position(name: str, report: InstanceReport) -> Position:
    return Position(name, report.timeline, report.write_lsn)


def _height(position: Position) -> tuple[int, int]:
    return position.timeline or 0, lsn_bytes(position.lsn) or 0


def decide(
    reports: Mapping[str, InstanceReport], *, recorded: str | None, status: str | None, instances: Collection[str]
) -> Verdict:
    """The verdict for one pass. ``recorded``: the claims' last-primary mark; ``status``: ``status.currentPrimary``;
    ``instances``: the instances that exist (a volume or a StatefulSet)."""
    primaries = sorted(name for name, r in reports.items() if r.role == "primary" and not r.fenced)
    if not primaries:
        return Verdict(primary=None)
    if len(primaries) == 1:
        (only,) = primaries
        unconfirmed = recorded is not None and recorded != only and recorded in instances and recorded not in reports
        return Verdict(primary=None, held=(only,)) if unconfirmed else Verdict(primary=only)
    positions = [_position(name, reports[name]) for name in primaries]
    kept_by: KeptBy
    if recorded in primaries:
        kept, kept_by = recorded, "LastPrimary"
    elif status in primaries:
        kept, kept_by = status, "CurrentPrimary"
    else:
        # Highest (timeline, LSN); the lowest name breaks a tie, so every pass picks the same one.
        kept = max(positions, key=lambda p: (*_height(p), -primaries.index(p.name))).name
        kept_by = "HighestPosition"
    assert kept is not None
    return Verdict(
        primary=kept,
        kept=next(p for p in positions if p.name == kept),
        kept_by=kept_by,
        fence=tuple(p for p in positions if p.name != kept),
    )


def routed(reports: Mapping[str, InstanceReport], verdict: Verdict) -> dict[str, InstanceReport]:
    """The reports as the rest of the pass reads them: an instance that is fenced (it says so, or it is fenced now)
    has role ``fenced`` and is not ready — so it is never labelled, recorded or counted as primary — and a held
    primary is left out."""
    fencing = {p.name for p in verdict.fence}
    found: dict[str, InstanceReport] = {}
    for name, report in reports.items():
        if name in verdict.held:
            continue
        fence = report.fenced or name in fencing
        # never ready either: it takes no traffic (the one fenced this pass still answered ready a moment ago)
        found[name] = report.model_copy(update={"role": FENCED, "ready": False}) if fence else report
    return found


def fenced_names(record: Obj | None) -> set[str]:
    """The instances a split-brain record keeps fenced."""
    return {str(entry.get("name")) for entry in (record or {}).get("fenced") or []}


def next_record(
    old: Obj | None,
    verdict: Verdict,
    reports: Mapping[str, InstanceReport],
    instances: Sequence[str],
    now: datetime,
) -> Obj | None:
    """``status.splitBrain`` after this pass (``reports`` as :func:`routed` gives them).

    A split with no record (or another kept primary) is a new occurrence: a new record. A split seen again keeps its
    record, the divergence as first seen, and adds any newly fenced instance. Without a split, the record stays until
    every fenced instance is resolved: gone, or reporting itself an unfenced replica."""
    if verdict.split and verdict.kept is not None:
        if old is None or (old.get("kept") or {}).get("name") != verdict.kept.name:
            return {
                "detectedAt": now.isoformat(timespec="seconds").replace("+00:00", "Z"),
                "kept": verdict.kept.as_status(),
                "keptBy": verdict.kept_by,
                "fenced": [p.as_status() for p in verdict.fence],
            }
        known = fenced_names(old)
        added = [p.as_status() for p in verdict.fence if p.name not in known]
        return {**old, "fenced": [*old.get("fenced", []), *added]} if added else old
    if old is None:
        return None
    remaining = [
        entry
        for entry in old.get("fenced") or []
        if (name := str(entry.get("name"))) in instances
        and not ((r := reports.get(name)) is not None and r.role == "replica" and not r.fenced)
    ]
    if not remaining:
        return None
    return old if remaining == old.get("fenced") else {**old, "fenced": remaining}


def _described(entry: Obj) -> str:
    return Position(str(entry.get("name")), entry.get("timeline"), entry.get("lsn")).describe()


def split_brain_problem(record: Obj | None) -> Problem | None:
    """``Degraded=True, SplitBrain`` for a record: both sides, their timelines and LSNs, why one was kept, what next."""
    if not record:
        return None
    kept = record.get("kept") or {}
    fenced = record.get("fenced") or []
    names = ", ".join(str(e.get("name")) for e in fenced)
    message = (
        f"split brain: {names} and {kept.get('name')} both ran as primary; kept {_described(kept)}, chosen by "
        f"{_WHY.get(str(record.get('keptBy')), 'the operator')}; fenced {', '.join(_described(e) for e in fenced)}: "
        f"no Service routes to it and its PostgreSQL is stopped; the writes it took after the histories diverged "
        f"are only on its volume — {HELP}"
    )
    return Problem("SplitBrain", message)
