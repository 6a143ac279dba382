"""The cluster's side of base backups, one step of each PostgresCluster pass: ask for the backups that are due, and
say in the cluster's status how its backups stand.

- Due: the first backup as soon as the cluster is Ready (``<cluster>-initial``: recoverable from minute one; after a
  major upgrade ``<cluster>-pg<major>-initial``, the new system's first, for which the upgrade clears the slot), then
  one per slot of ``spec.backup.schedule`` (cron, UTC; ``<cluster>-<yyyymmddhhmm>``). The slot asked for last is
  ``status.backup.lastScheduled``, written after the object is created; an operator that stops in between finds the
  object on its next pass (409, the name is the slot's) and records the slot then, so no slot gets two backups.
  A slot that passed while no operator looked (down, or the cluster not running) is made up once, for the latest
  slot only, and not when a backup completed after it (:mod:`kanri.postgres.backup.missed` decides; Event
  ``MissedScheduleMadeUp``, or ``MissedScheduleSkipped`` with the slot recorded all the same).
  The PostgresBackup controller (:mod:`kanri.postgres.backup.controller`) takes them one at a time.
- Told: ``status.backup.{lastSuccessful, lastFailed, firstRecoverabilityPoint}``, condition ``LastBackupSucceeded``
  (True ``Completed`` / False with the failed backup's reason) and the backup metrics, all from the cluster's
  PostgresBackups (:func:`kanri.postgres.backup.plan.summary`). Nothing is written on a converged cluster.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.backup import missed as backup_missed
from kanri.postgres.backup import plan as backup_plan
from kanri.postgres.backup.archiving import BackupSettings, Repository, Unresolved, server_name
from kanri.postgres.backup.controller import siblings
from kanri.postgres.context import ClusterStep, MeasuredStep
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.postgres.labels import cluster_labels
from kanri.runtime import ApiError, owner_reference, set_condition

__all__ = ["CONDITION", "SLOT_ANNOTATION", "Wanted", "backup_object", "due", "iso", "run", "wanted"]

log = structlog.get_logger("kanri.postgres.backup.schedule")
Obj = dict[str, Any]


class Owner(ClusterStep, Protocol):
    """What a backup the operator asks for is made from: the cluster and its spec (its deletion policy)."""

    @property
    def spec(self) -> PostgresClusterSpec: ...


class Pass(MeasuredStep, Protocol):
    """What the backup schedule needs from the reconcile pass."""

    @property
    def backup_settings(self) -> BackupSettings: ...


CONDITION = "LastBackupSucceeded"
SLOT_ANNOTATION = "kanri.dev/backup-slot"
"""On a backup the operator asked for: the schedule slot (or the moment the first backup was asked) it stands for."""


def iso(moment: datetime | None) -> str | None:
    """The form every time this step writes takes (compared as strings with what it wrote before)."""
    return None if moment is None else moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Wanted:
    """The backup the schedule stands for now."""

    name: str
    slot: datetime
    trigger: str
    ask: bool = True
    """Create it; False: a missed slot not made up (a newer backup covers it), recorded as handled all the same."""
    missed: int = 0
    """Slots that passed with no operator looking (0: on time, or the first backup)."""
    why: str = ""


def wanted(cluster: Obj, schedule: str, now: datetime, last_completed: datetime | None = None) -> Wanted | None:
    """The backup to ask for now, or None. The cluster must be Ready (checked here only for the first one: later slots
    wait for a cluster that is, say, failing over, in the controller). ``last_completed``: the end of the newest
    completed backup (a missed slot it covers is not made up)."""
    status = cluster.get("status") or {}
    name = cluster["metadata"]["name"]
    last = backup_plan.parse_time((status.get("backup") or {}).get("lastScheduled"))
    if last is None:
        if status.get("phase") != "Ready":
            return None
        return Wanted(backup_plan.initial_name(name, server_name(cluster)), now, backup_plan.INITIAL)
    decision = backup_missed.decide(schedule, last, now, last_completed)
    if decision is None:
        return None
    return Wanted(backup_plan.scheduled_name(name, decision.slot), decision.slot, "schedule", decision.ask,
                  decision.missed, decision.why)  # fmt: skip


def due(cluster: Obj, schedule: str, now: datetime) -> tuple[str, datetime, str] | None:
    """The backup to create now as (name, slot, trigger), or None (see :func:`wanted`)."""
    found = wanted(cluster, schedule, now)
    return (found.name, found.slot, found.trigger) if found is not None and found.ask else None


def backup_object(step: Owner, name: str, slot: datetime, trigger: str) -> Obj:
    """A PostgresBackup the operator asks for: labelled with its ``trigger``, annotated with the moment it stands
    for, owned by the cluster under deletionPolicy Delete."""
    meta: Obj = {
        "name": name,
        "namespace": step.namespace,
        "labels": {**cluster_labels(step.name), backup_plan.TRIGGER_LABEL: trigger},
        "annotations": {SLOT_ANNOTATION: str(iso(slot))},
    }
    if step.spec.deletion_policy == "Delete":
        # Delete: the records go with the cluster, as the repository's content does; Retain: they outlive it.
        meta["ownerReferences"] = [owner_reference(step.cluster, controller=False, block_owner_deletion=False)]
    return {"apiVersion": POSTGRES_BACKUP.api_version, "kind": POSTGRES_BACKUP.kind, "metadata": meta,
            "spec": {"cluster": step.name}}  # fmt: skip


async def run(step: Pass, repository: Repository | Unresolved | None) -> None:
    """Ask for a due backup, then write the summary (status, condition, metrics) when it changed."""
    backup = step.spec.backup
    if backup is None:
        if step.metrics is not None:
            step.metrics.backups(step.namespace, step.name, {})
        return
    now = step.backup_settings.now()
    scheduled = (step.status.get("backup") or {}).get("lastScheduled")
    summary = backup_plan.summary(siblings(step.cache, step.namespace, step.name))
    if isinstance(repository, Repository) and step.running:
        found = wanted(step.cluster, backup.schedule, now, summary.last_successful)
        if found is not None:
            await _ask(step, found)
            scheduled = iso(found.slot)
    fields = {
        "lastSuccessful": iso(summary.last_successful),
        "lastFailed": iso(summary.last_failed),
        "firstRecoverabilityPoint": iso(summary.first_recoverability_point),
        "lastScheduled": scheduled,
    }
    _metrics(step, summary)
    current = step.status.get("backup") or {}
    changed = {k: v for k, v in fields.items() if v is not None and current.get(k) != v}
    generation = int(step.cluster["metadata"].get("generation", 0))
    conditions = copy.deepcopy(step.status.get("conditions") or [])
    flipped = summary.condition is not None and _set(conditions, summary.condition, generation)
    if not changed and not flipped:
        return  # converged: no write
    patch: Obj = {"backup": changed} if changed else {}
    if flipped:
        # A merge patch replaces the whole conditions list: start from the object as it is now.
        fresh = await step.client.get(POSTGRES_CLUSTER, step.name, step.namespace)
        conditions = copy.deepcopy((fresh.get("status") or {}).get("conditions") or [])
        assert summary.condition is not None
        _set(conditions, summary.condition, generation)
        patch["conditions"] = conditions
    await step.client.patch_status(POSTGRES_CLUSTER, step.name, {"status": patch}, step.namespace)


async def _ask(step: Pass, found: Wanted) -> None:
    """Create the backup ``found`` stands for (or tell why a missed slot is not made up)."""
    slot = iso(found.slot)
    if not found.ask:
        if step.cache.get(POSTGRES_BACKUP, found.name, step.namespace) is not None:
            return  # made up already, by an operator that stopped before recording the slot
        log.info("missed schedule slot not made up", cluster=step.name, namespace=step.namespace, slot=slot,
                 why=found.why)  # fmt: skip
        await step.events.normal(step.cluster, "MissedScheduleSkipped", f"the schedule's {slot} slot passed while "
                                 f"no operator looked; not made up: {found.why}")  # fmt: skip
        return
    try:
        await step.client.create(POSTGRES_BACKUP, backup_object(step, found.name, found.slot, found.trigger))
    except ApiError as exc:
        if exc.status != 409:  # 409: created before an operator restart; its slot is recorded now
            raise
        return
    log.info("base backup asked", cluster=step.name, namespace=step.namespace, backup=found.name,
             trigger=found.trigger, missed=found.missed)  # fmt: skip
    kind = "the first backup" if found.trigger == backup_plan.INITIAL else f"the schedule's {slot} slot"
    await step.events.normal(step.cluster, "BackupScheduled", f"created PostgresBackup {found.name} for {kind}")
    if found.missed:
        passed = f"{found.missed} slots" if found.missed > 1 else "it"
        await step.events.normal(step.cluster, "MissedScheduleMadeUp", f"the schedule's {slot} slot passed while no "
                                 f"operator looked ({passed} since the last one asked): one backup, "
                                 f"{found.name}, makes up for it")  # fmt: skip


def _set(conditions: list[Obj], condition: tuple[bool, str, str], generation: int) -> bool:
    ok, reason, message = condition
    return set_condition(conditions, type=CONDITION, status=ok, reason=reason, message=message,
                         observed_generation=generation)  # fmt: skip


def _metrics(step: Pass, summary: backup_plan.Summary) -> None:
    if step.metrics is None:
        return

    def stamp(moment: datetime | None) -> float | None:
        return None if moment is None else moment.timestamp()

    succeeded = None if summary.condition is None else float(summary.condition[0])
    step.metrics.backups(step.namespace, step.name, {
        "success": stamp(summary.last_successful), "failure": stamp(summary.last_failed),
        "succeeded": succeeded, "recoverability": stamp(summary.first_recoverability_point)})  # fmt: skip
