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
  schedule, a backup asked by hand) composes with it, and a backup older than the approval never counts. The
  approval is the human decision; the backup is routine: while the gate is closed the decision names the
  PostgresBackup to create, ``<cluster>-pre-upgrade-<to>-<approvedAt>`` (:func:`pre_upgrade_backup`: derived from
  the recorded approval, so a restarted operator asks for the same one, and a later approval for a new one). A
  cluster without a usable backup repository cannot take it: the gate says so and names the two ways on (configure
  a repository, or ``spec.upgrade.withoutBackup: true``, which drops the backup gate for this approval).
- ``Checking``: ``pg_upgrade --check`` in a one-off pod (:mod:`kanri.postgres.upgrade.step` carries it out).
- ``Failed``: the check (or a step) failed; its output is in the message, the cluster keeps serving on the old
  major, and nothing is retried until the spec changes (``metadata.generation`` recorded).
- ``Upgrading`` / ``Succeeded``: the executor's (:mod:`kanri.postgres.upgrade.step`), resumed from the record,
  never re-deciding a step already taken.

A record for another target (``to``) or, when Failed, for an older generation, is started over (a new
``approvedAt``, so a new backup).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from kanri.runtime import parse_optional_time

__all__ = ["Action", "Decision", "Observed", "decide", "no_repository", "pre_upgrade_backup"]

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
    cluster: str = "db"
    """The cluster's name (the pre-upgrade backup's name starts with it)."""
    repository: str | None = None
    """Why the cluster has no usable backup repository (``NoRepository``, an endpoint refused, ...); None: it has."""
    without_backup: bool = False
    """``spec.upgrade.withoutBackup``: this approval needs no fresh backup."""
    backups: Mapping[str, str] = field(default_factory=dict)
    """The cluster's PostgresBackups: name -> phase (Pending when it has none yet)."""


@dataclass(frozen=True)
class Decision:
    record: Obj | None
    """The new ``status.upgrade`` (None: none is wanted)."""
    action: Action
    event: tuple[str, str] | None = None
    """(reason, message) of a Normal Event, when the phase changes."""
    backup: str | None = None
    """The pre-upgrade PostgresBackup the executor must create (it does not exist yet)."""


def _stamp(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _parse(value: object) -> datetime | None:
    return parse_optional_time(value) if isinstance(value, str) else None


def pre_upgrade_backup(cluster: str, to: int, approved_at: datetime) -> str:
    """The PostgresBackup the operator takes for the upgrade to ``to`` approved at ``approved_at``."""
    return f"{cluster}-pre-upgrade-{to}-{approved_at.astimezone(UTC):%Y%m%d%H%M%S}"


def no_repository(running: int, version: int, why: str) -> str:
    """What an approved upgrade of a cluster without a usable backup repository waits for, and the two ways on."""
    return (f"the upgrade {running} -> {version} needs a fresh backup and the cluster has no usable backup "
            f"repository ({why}): configure spec.backup with a repository, or set spec.upgrade.withoutBackup: true "
            "to upgrade without one")  # fmt: skip


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
    backup_gate, wanted = _backup_gate(obs, approved_at)
    gates += [backup_gate] if backup_gate else []
    others = [name for name in obs.backups_in_flight if name != pre_upgrade_backup(obs.cluster, obs.version,
                                                                                    approved_at)]  # fmt: skip
    if others:
        gates.append(f"base backup {', '.join(others)} has not finished (the upgrade stops every instance)")
    if gates:
        message = f"upgrade {obs.running} -> {obs.version} approved; waiting: " + "; ".join(gates)
        new = {**base, "phase": "WaitingForPreconditions", "message": message}
        event = _changed(old, new, "UpgradeWaitingForPreconditions", message)
        return Decision(new, "none", event, backup=wanted)
    message = f"checking the upgrade {obs.running} -> {obs.version} with pg_upgrade --check"
    new = {**base, "phase": "Checking", "message": message}
    return Decision(new, "check", _changed(old, new, "UpgradeChecking", message))


def _backup_gate(obs: Observed, approved_at: datetime) -> tuple[str | None, str | None]:
    """The backup gate's text (None: open) and the pre-upgrade PostgresBackup to create (None: none to create)."""
    if obs.without_backup:
        return None, None  # approved without a fresh backup (spec.upgrade.withoutBackup)
    if obs.last_backup is not None and obs.last_backup > approved_at:
        return None, None
    if obs.repository is not None:
        return no_repository(obs.running, obs.version, obs.repository), None
    last = _stamp(obs.last_backup) if obs.last_backup else "none"
    gate = (f"no base backup completed after the approval at {_stamp(approved_at)} (status.backup.lastSuccessful: "
            f"{last})")  # fmt: skip
    name = pre_upgrade_backup(obs.cluster, obs.version, approved_at)
    phase = obs.backups.get(name)
    if phase is None:
        return f"{gate}: taking the pre-upgrade backup {name}", name
    if phase == "Failed":
        return (f"{gate}: the pre-upgrade backup {name} failed (see its status); delete it to take another, or set "
                "spec.upgrade.withoutBackup: true to upgrade without one"), None  # fmt: skip
    return f"{gate}: the pre-upgrade backup {name} is {phase}", None


def failed(record: Obj, output: str, generation: int) -> Obj:
    """The record once the check (or a step) failed: Failed, with its output, for this generation."""
    return {**record, "phase": "Failed", "generation": generation, "message": output[-32000:]}
