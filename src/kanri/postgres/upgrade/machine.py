"""The major-upgrade state machine (issue 14 item 3): a pure :func:`decide` over what one pass observed.

``status.upgrade`` is the record (written before any step acts, so a restarted operator resumes from it):

- ``WaitingForApproval``: ``spec.version`` is above the data's major and ``spec.upgrade.approvedVersion`` is not
  equal to it. Nothing changes: the instances keep running the data's major (a merged pull request alone never
  upgrades a database).
- ``WaitingForPreconditions``: approved; the operator records ``approvedAt`` (its clock, the first pass that saw
  the approval: the spec carries no time) and waits for each gate, named in the message: the cluster is Ready, and
  a base backup completed after the approval, and no backup is Pending or Running (the stop would cut it off). The
  backup gate is only a comparison of
  ``status.backup.lastSuccessful`` with ``approvedAt``: whatever takes the backup (the PostgresBackup controller, a
  schedule, a backup asked by hand) composes with it, and a backup older than the approval never counts.
- ``Checking``: ``pg_upgrade --check`` in a one-off pod (:mod:`kanri.postgres.upgrade.step` carries it out).
- ``Failed``: the check (or a step) failed; its output is in the message, the cluster keeps serving on the old
  major, and nothing is retried until the spec changes (``metadata.generation`` recorded).
- ``Upgrading`` / ``Succeeded``: the executor's (:mod:`kanri.postgres.upgrade.step`), resumed from the record,
  never re-deciding a step already taken.

A record for another target (``to``) or, when Failed, for an older generation, is started over (a new
``approvedAt``, so a new backup).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kanri.runtime import parse_optional_time

__all__ = ["Action", "Decision", "Observed", "decide"]

Obj = dict[str, Any]
Action = Literal["none", "check", "upgrade"]


@dataclass(frozen=True)
class Observed:
    """What one pass knows that the upgrade depends on."""

    running: int
    """The data's major (:func:`kanri.postgres.upgrade.versions.running_major`)."""
    version: int
    """``spec.version``."""
    approved: int | None
    """``spec.upgrade.approvedVersion``."""
    generation: int
    ready: bool
    """Every instance is ready (the cluster's Ready condition as this pass computes it)."""
    last_backup: datetime | None
    """``status.backup.lastSuccessful``."""
    record: Obj | None
    """``status.upgrade`` as recorded."""
    now: datetime
    backups_in_flight: tuple[str, ...] = ()
    """PostgresBackups of the cluster that are Pending or Running (the upgrade's stop would cut them off)."""


@dataclass(frozen=True)
class Decision:
    record: Obj | None
    """The new ``status.upgrade`` (None: none is wanted)."""
    action: Action
    event: tuple[str, str] | None = None
    """(reason, message) of a Normal Event, when the phase changes."""


def _stamp(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _parse(value: object) -> datetime | None:
    return parse_optional_time(value) if isinstance(value, str) else None


def _changed(old: Obj | None, new: Obj, reason: str, message: str) -> tuple[str, str] | None:
    return (reason, message) if old is None or old.get("phase") != new["phase"] else None


def decide(obs: Observed) -> Decision:
    """The next ``status.upgrade`` and what the executor must do (see the module docstring)."""
    old = obs.record
    if old is not None and old.get("phase") == "Upgrading":
        # under way (the data may be of the new major already): finished whatever the spec says now, since the
        # instances are stopped or the primary's data is upgraded; a spec change is looked at afterwards
        return Decision(old, "upgrade")
    if obs.version <= obs.running:
        # nothing asked (or a downgrade, which the MajorUpgrade condition refuses): a finished record is kept
        if old is not None and old.get("phase") in ("Succeeded", "Failed") and old.get("to") == obs.running:
            return Decision(old, "none")
        keep = old if old is not None and old.get("phase") == "Succeeded" else None
        return Decision(keep, "none")
    same_target = old is not None and old.get("to") == obs.version and old.get("from") == obs.running
    if same_target and old is not None:
        phase = old.get("phase")
        if phase in ("Upgrading", "Succeeded"):
            return Decision(old, "upgrade" if phase == "Upgrading" else "none")  # resumed, never re-decided
        if phase == "Failed" and old.get("generation") == obs.generation:
            return Decision(old, "none")  # no retry until the spec changes
    base: Obj = {"from": obs.running, "to": obs.version, "generation": obs.generation}
    if obs.approved != obs.version:
        message = (
            f"spec.version {obs.version} is above the data's major {obs.running}: set "
            f"spec.upgrade.approvedVersion: {obs.version} to upgrade; PostgreSQL {obs.running} keeps running"
        )
        new = {**base, "phase": "WaitingForApproval", "message": message}
        return Decision(new, "none", _changed(old, new, "UpgradeWaitingForApproval", message))
    # a Failed record left by a spec change starts over: approved anew, so a backup from after this approval counts
    resumable = same_target and old is not None and old.get("phase") != "Failed"
    approved_at = _parse(old.get("approvedAt")) if resumable and old is not None else None
    approved_at = approved_at or obs.now
    base["approvedAt"] = _stamp(approved_at)
    if same_target and old is not None and old.get("phase") == "Checking":
        return Decision({**old, "generation": obs.generation}, "check")
    gates = []
    if not obs.ready:
        gates.append("the cluster is not Ready")
    if obs.last_backup is None or obs.last_backup <= approved_at:
        last = _stamp(obs.last_backup) if obs.last_backup else "none"
        gates.append(f"no base backup completed after the approval at {_stamp(approved_at)} "
                     f"(status.backup.lastSuccessful: {last})")  # fmt: skip
    if obs.backups_in_flight:
        gates.append(f"base backup {', '.join(obs.backups_in_flight)} has not finished (the upgrade stops every "
                     "instance)")  # fmt: skip
    if gates:
        message = f"upgrade {obs.running} -> {obs.version} approved; waiting: " + "; ".join(gates)
        new = {**base, "phase": "WaitingForPreconditions", "message": message}
        return Decision(new, "none", _changed(old, new, "UpgradeWaitingForPreconditions", message))
    message = f"checking the upgrade {obs.running} -> {obs.version} with pg_upgrade --check"
    new = {**base, "phase": "Checking", "message": message}
    return Decision(new, "check", _changed(old, new, "UpgradeChecking", message))


def failed(record: Obj, output: str, generation: int) -> Obj:
    """The record once the check (or a step) failed: Failed, with its output, for this generation."""
    return {**record, "phase": "Failed", "generation": generation, "message": output[-32000:]}
