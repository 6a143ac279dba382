"""The major upgrade's executor: the check pod, the downtime, pg_upgrade on the primary's volume, the restart.

:mod:`kanri.postgres.upgrade.machine` decides the phase up to ``Checking``; this module carries ``Checking`` and
``Upgrading`` out, one pass at a time, every step written to ``status.upgrade`` before it acts (a restarted operator
resumes from the record; the upgrade pod itself refuses to run pg_upgrade twice on one data directory):

- ``Checking``: pod ``<cluster>-upgrade-check`` (:mod:`kanri.postgres.children.upgrade`) runs ``pg_upgrade --check``
  against a schema copy while the cluster serves. Failed → phase ``Failed`` with the check's output; the cluster
  keeps its major and nothing is retried until the spec changes. Passed → ``Upgrading``/``Stopping``, naming the
  primary whose data is upgraded and the time the downtime begins.
- ``Stopping``: every instance's StatefulSet goes to 0 (PostgreSQL shuts down cleanly); the step waits until no
  instance pod is left. No failover is started while the record is ``Upgrading``.
- ``Upgrading``: pod ``<cluster>-upgrade`` on the primary's claim runs ``pg_upgrade --link``. Failed → ``Failed``
  (the message says whether the old data directory is intact; the instances start again on the old major).
  Succeeded → ``status.backup.serverName`` becomes ``<cluster>.pg<to>`` (the new system archives apart from the old
  one, whose backups stay restorable to before the upgrade) and the claim records the new major, so every
  StatefulSet gets the new image.
- ``Starting``: the instances start; the ConfigMap's ``upgrade`` note lets replicas of the old major clone again
  from the upgraded primary. ``servingAt`` is the first pass that sees the primary ready on the new major; once
  every instance is, ``Succeeded`` with the downtime.

Both pods are trusted only as the operator's own (:mod:`kanri.postgres.pods.oneshot`: uid recorded in
``status.oneShotPods``, the cluster its controller): a pod someone else made under either name is never read nor
deleted; the pass reports it as ``ForeignPod`` and the step waits until it is gone.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from kanri.contract.instance_config import UpgradeNote
from kanri.kit import read_verdict
from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.backup.archiving import BackupSettings, Repository, resolve, upgraded_server_name
from kanri.postgres.backup.plan import PRE_UPGRADE
from kanri.postgres.backup.plan import parse_time as parse_lenient
from kanri.postgres.backup.schedule import backup_object
from kanri.postgres.children.images import PostgresImages
from kanri.postgres.children.upgrade import check_pod, upgrade_pod
from kanri.postgres.cluster.recorded import PG_MAJOR, SYSTEM_IDENTIFIER
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.postgres.pods import oneshot
from kanri.postgres.upgrade import machine
from kanri.postgres.upgrade.machine import failed
from kanri.runtime import ApiError, get_condition, parse_optional_time
from kanri.runtime.kinds import POD, PVC

if TYPE_CHECKING:
    from kanri.postgres.cluster.instances import InstanceReport
    from kanri.postgres.topology.plan import InstancePlan

__all__ = [
    "CHECK_TIMEOUT",
    "UPGRADE_TIMEOUT",
    "advance",
    "backups_in_flight",
    "check",
    "config_note",
    "in_progress",
    "repository_missing",
    "run",
    "stops_instances",
    "sweep",
]

log = structlog.get_logger("kanri.postgres.upgrade.step")
Obj = dict[str, Any]


class Pass(oneshot.Pass, Protocol):
    """What the major upgrade's step needs from the reconcile pass."""

    @property
    def spec(self) -> PostgresClusterSpec: ...

    @property
    def images(self) -> PostgresImages: ...

    @property
    def backup_settings(self) -> BackupSettings: ...


CHECK_TIMEOUT = timedelta(hours=1)
UPGRADE_TIMEOUT = timedelta(hours=6)


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def stops_instances(status: Obj) -> bool:
    """The instances must be stopped: the upgrade is stopping them or upgrading the primary's data."""
    record = status.get("upgrade") or {}
    return record.get("phase") == "Upgrading" and record.get("step") in ("Stopping", "Upgrading")


def in_progress(status: Obj) -> str | None:
    """What the upgrade under way is doing (its message), or None when none is (the cluster's phase Upgrading)."""
    record = status.get("upgrade") or {}
    if record.get("phase") != "Upgrading":
        return None
    return f"major upgrade {record.get('from')} -> {record.get('to')}, step {record.get('step')}: " + str(
        record.get("message") or ""
    )


def config_note(status: Obj) -> Obj | None:
    """instance.json's ``upgrade`` note (:class:`kanri.contract.instance_config.UpgradeNote`) once the primary's
    data is of the new major: replicas of an older major clone again from it."""
    record = status.get("upgrade") or {}
    started = record.get("phase") == "Upgrading" and record.get("step") == "Starting"
    if (started or record.get("phase") == "Succeeded") and record.get("primary"):
        # constructed, not validated: the note carries the record's values as they are (as before)
        return UpgradeNote.model_construct(to=record["to"], primary=record["primary"]).model_dump(mode="json")
    return None


def _verdict(pod: Obj, timeout: timedelta, now: datetime) -> Obj | None:
    """The pod's verdict ({result, message, ...}) once it ended (or ran past ``timeout``); None while it runs. Read
    by the kit (:func:`kanri.kit.read_verdict`); the fields the pod wrote besides the two stay beside them."""
    verdict = read_verdict(pod, timeout=timeout, now=now)
    return None if verdict is None else {**verdict.details, "result": verdict.result, "message": verdict.message}


async def _pod_verdict(step: Pass, name: str, build: Callable[[], Obj], timeout: timedelta, now: datetime, what: str,
                       **fields: str) -> Obj | None:  # fmt: skip
    """Start the one-shot pod ``name`` (``build()``) when there is none; its verdict once it ended. None meanwhile,
    and while a pod that is going or is not the operator's holds the name."""
    pod = step.cache.get(POD, name, step.namespace)
    if pod is None:
        if await oneshot.create(step, build()):
            log.info(f"{what} started", cluster=step.name, namespace=step.namespace, **fields)
        return None
    if pod["metadata"].get("deletionTimestamp") or not oneshot.trusted(pod, step.cluster, step.status):
        return None  # going, or someone else's pod under our name (reported as ForeignPod): never read
    return _verdict(pod, timeout, now)


async def _write(step: Pass, old: Obj, new: Obj) -> None:
    patch = {**{key: None for key in old if key not in new}, **new}
    updated = await step.client.patch_status(POSTGRES_CLUSTER, step.name, {"status": {"upgrade": patch}},
                                             step.namespace)  # fmt: skip
    step.adopt_status(updated)


async def _delete(step: Pass, name: str) -> None:
    try:
        await step.client.delete(POD, name, step.namespace)
    except ApiError as exc:
        if not exc.not_found:
            raise


async def check(step: Pass, record: Obj, primary: str | None) -> None:
    """Phase Checking: start the check pod, or record what it found."""
    name = names.upgrade_check_pod(step.name)
    now = datetime.now(UTC)
    old, to = int(record["from"]), int(record["to"])
    found = await _pod_verdict(step, name, lambda: check_pod(step.cluster, old, to, images=step.images), CHECK_TIMEOUT,
                               now, "upgrade check")  # fmt: skip
    if found is None:
        return
    generation = int(step.cluster["metadata"].get("generation", 0))
    if found["result"] != "Succeeded" or primary is None:
        why = str(found.get("message") or "") if primary is not None else "no primary to upgrade"
        await _write(step, record, failed(record, why, generation))
        await step.events.warning(step.cluster, "UpgradeCheckFailed", f"upgrade {record['from']} -> "
                                    f"{record['to']} refused by pg_upgrade --check: {why}"[:1000])  # fmt: skip
        await _delete(step, name)
        return
    message = (f"{found.get('message')}; stopping every instance to upgrade {primary}'s data directory with "
               f"pg_upgrade --link (the downtime begins)")  # fmt: skip
    new = {**record, "phase": "Upgrading", "step": "Stopping", "primary": primary, "stoppedAt": _stamp(now),
           "message": message}  # fmt: skip
    await _write(step, record, new)
    await step.events.normal(step.cluster, "UpgradeCheckPassed", str(found.get("message"))[:1000])
    await step.events.normal(step.cluster, "UpgradeStopping", f"stopping every instance for the upgrade "
                               f"{record['from']} -> {record['to']} of {primary}")  # fmt: skip
    await _delete(step, name)


async def sweep(step: Pass, record: Obj | None) -> None:
    """Delete the check and upgrade pods once the record is past the step that runs them.

    Each step deletes its pod right after writing the record that moves past it; an operator killed between the two
    writes leaves the finished pod behind, and nothing else would ever remove it (it would hold its address and
    carry the cluster's label). Only a pod the operator created is deleted (:mod:`kanri.postgres.pods.oneshot`); the
    record of one seen gone is dropped."""
    phase = (record or {}).get("phase")
    wanted = {
        names.upgrade_check_pod(step.name): phase == "Checking",
        names.upgrade_pod(step.name): phase == "Upgrading" and (record or {}).get("step") == "Upgrading",
    }
    for name, needed in wanted.items():
        pod = step.cache.get(POD, name, step.namespace)
        if pod is None and not needed:
            await oneshot.forget(step, name)
        if pod is None or not oneshot.trusted(pod, step.cluster, step.status):
            continue
        if not needed and not pod["metadata"].get("deletionTimestamp"):
            log.info("leftover upgrade pod deleted", cluster=step.name, namespace=step.namespace, pod=name,
                     phase=phase)  # fmt: skip
            await _delete(step, name)


def _instance_pods(step: Pass, instances: list[str]) -> list[str]:
    return sorted(i for i in instances if step.cache.get(POD, names.pod_name(i), step.namespace) is not None)


async def advance(step: Pass, record: Obj, plan: InstancePlan, reports: dict[str, InstanceReport]) -> None:
    """Phase Upgrading: one step forward when the current one is done (see the module docstring)."""
    now = datetime.now(UTC)
    primary = str(record.get("primary") or plan.primary or "")
    current = record.get("step")
    if current == "Stopping":
        left = _instance_pods(step, plan.instances)
        if left:
            message = f"stopping every instance for the upgrade; waiting for: {', '.join(left)}"
            if record.get("message") != message:
                await _write(step, record, {**record, "message": message})
            return
        new = {
            **record,
            "step": "Upgrading",
            "message": f"every instance stopped; pg_upgrade --link "
            f"{record['from']} -> {record['to']} runs on {primary}'s volume (pod {names.upgrade_pod(step.name)})",
        }
        await _write(step, record, new)  # fmt: skip
        await step.events.normal(step.cluster, "UpgradeRunning", new["message"])
        record = new
        current = "Upgrading"
    if current == "Upgrading":
        await _run_upgrade_pod(step, record, primary, now)
        return
    if current == "Starting":
        await _starting(step, record, plan, reports, primary, now)


async def _run_upgrade_pod(step: Pass, record: Obj, primary: str, now: datetime) -> None:
    name = names.upgrade_pod(step.name)
    old, to = int(record["from"]), int(record["to"])
    found = await _pod_verdict(step, name, lambda: upgrade_pod(step.cluster, step.spec, primary, old, to, step.images),
                               UPGRADE_TIMEOUT, now, "upgrade pod", instance=primary)  # fmt: skip
    if found is None:
        return
    if found["result"] != "Succeeded":
        why = str(found.get("message") or "")
        generation = int(step.cluster["metadata"].get("generation", 0))
        await _write(step, record, {**failed(record, why, generation), "step": None})
        await step.events.warning(step.cluster, "UpgradeFailed", f"upgrade {old} -> {to} failed: {why}"[:1000])
        await _delete(step, name)
        return
    # the claim records the new major first: from this write on every StatefulSet gets the new image
    annotations = {PG_MAJOR: str(to)}
    # A new PostgreSQL system archives into a folder of its own (see upgraded_server_name), from its first segment:
    # the next pass writes it into the ConfigMap before any StatefulSet gets the new image. Its first base backup
    # is asked for at once (lastScheduled cleared: the schedule starts again with "<cluster>-pg<to>-initial").
    fields: Obj = {"backup": {"serverName": upgraded_server_name(step.name, to), "lastScheduled": None}}
    identifier = str(found.get("systemIdentifier") or "")
    if identifier.isdigit():
        # pg_upgrade's new cluster has a system identifier of its own: from now on it is the cluster's
        annotations[SYSTEM_IDENTIFIER] = identifier
        fields["systemIdentifier"] = identifier
    updated = await step.client.patch_status(POSTGRES_CLUSTER, step.name, {"status": fields}, step.namespace)
    step.adopt_status(updated)
    await step.client.patch(PVC, primary, {"metadata": {"annotations": annotations}}, step.namespace)
    seconds = found.get("pgUpgradeSeconds")
    new = {**record, "step": "Starting", "message": f"{primary}'s data directory is PostgreSQL {to}; starting the "
           f"instances (replicas are cloned again from {primary})"}  # fmt: skip
    if isinstance(seconds, int | float):
        new["pgUpgradeSeconds"] = float(seconds)
    await _write(step, record, new)
    await step.events.normal(step.cluster, "UpgradeDataUpgraded", f"pg_upgrade --link {old} -> {to} finished on "
                               f"{primary}" + (f" in {seconds} s" if seconds is not None else ""))  # fmt: skip
    await _delete(step, name)


async def _starting(step: Pass, record: Obj, plan: InstancePlan, reports: dict[str, InstanceReport],
                    primary: str, now: datetime) -> None:  # fmt: skip
    to = int(record["to"])
    head = reports.get(primary)
    new = dict(record)
    if "servingAt" not in new and head is not None and head.ready and head.data_version == to:
        new["servingAt"] = _stamp(now)
        stopped = parse_lenient(record.get("stoppedAt"))
        if stopped is not None:
            new["downtimeSeconds"] = round((now - stopped).total_seconds(), 1)
        new["message"] = f"{primary} serves on PostgreSQL {to}; waiting for the replicas to be cloned again"
    waiting = [i for i in plan.instances if (r := reports.get(i)) is None or not r.ready or r.data_version != to]
    if "servingAt" in new and not waiting:
        new.update({"phase": "Succeeded", "step": None, "finishedAt": _stamp(now),
                    "message": f"upgraded from PostgreSQL {record['from']} to {to}: every instance runs {to}; "
                    f"downtime {new.get('downtimeSeconds')} s"})  # fmt: skip
        await _write(step, record, new)
        await step.events.normal(step.cluster, "UpgradeSucceeded", new["message"])
        log.info("major upgrade succeeded", cluster=step.name, namespace=step.namespace, downtime=new.get(
            "downtimeSeconds"))  # fmt: skip
        return
    if new != record:
        await _write(step, record, new)


def _backups(step: Pass) -> dict[str, str]:
    """The cluster's PostgresBackups: name -> phase (Pending before the controller wrote one)."""
    found = step.cache.list(POSTGRES_BACKUP, step.namespace)
    return {b["metadata"]["name"]: str((b.get("status") or {}).get("phase") or "Pending") for b in found
            if (b.get("spec") or {}).get("cluster") == step.name}  # fmt: skip


def backups_in_flight(step: Pass) -> tuple[str, ...]:
    """The cluster's PostgresBackups that are Pending or Running."""
    return tuple(sorted(name for name, phase in _backups(step).items() if phase in ("Pending", "Running")))


def _repository_missing(step: Pass) -> str | None:
    """Why the cluster has no backup repository its pre-upgrade backup could go to; None when it has one."""
    found = resolve(step.spec, step.namespace, step.backup_settings)
    if isinstance(found, Repository):
        return None
    return "spec.backup is not set" if found is None else str(found)


def repository_missing(step: Pass) -> str | None:
    """Why an approved upgrade cannot have its fresh backup (no usable repository), for the ``MajorUpgrade``
    condition; None when it can, or when ``spec.upgrade.withoutBackup`` approved it without one."""
    wanted = step.spec.upgrade
    if wanted is not None and wanted.without_backup:
        return None
    return _repository_missing(step)


async def _ask_for_backup(step: Pass, name: str, record: Obj) -> None:
    """Create the pre-upgrade PostgresBackup (409: created before an operator restart, nothing to do)."""
    moment = parse_lenient(record.get("approvedAt")) or datetime.now(UTC)
    try:
        await step.client.create(POSTGRES_BACKUP, backup_object(step, name, moment, PRE_UPGRADE))
    except ApiError as exc:
        if exc.status != 409:
            raise
        return
    log.info("pre-upgrade backup asked", cluster=step.name, namespace=step.namespace, backup=name)
    await step.events.normal(step.cluster, "UpgradeBackupRequested", f"created PostgresBackup {name}: the fresh "
                             f"backup the upgrade {record.get('from')} -> {record.get('to')} waits for")  # fmt: skip


async def run(step: Pass, major: int, plan: InstancePlan, reports: dict[str, InstanceReport]) -> bool:
    """The major upgrade's record (``status.upgrade``) as :func:`kanri.postgres.upgrade.machine.decide` wants it,
    written before anything acts on it, with a Normal Event when its phase changes; then the check or the
    upgrade's next step. True while one of them is under way (the pass looks again soon)."""
    status = step.cluster.get("status") or {}
    ready = get_condition(status.get("conditions") or [], "Ready") or {}
    last_backup = (status.get("backup") or {}).get("lastSuccessful")
    decision = machine.decide(machine.Observed(
        running=major, version=step.spec.version,
        approved=step.spec.upgrade.approved_version if step.spec.upgrade else None,
        generation=int(step.cluster["metadata"].get("generation", 0)),
        ready=ready.get("status") == "True" and plan.primary is not None,
        last_backup=parse_optional_time(last_backup),
        record=status.get("upgrade"), now=datetime.now(UTC).replace(microsecond=0),
        backups_in_flight=backups_in_flight(step), cluster=step.name, repository=_repository_missing(step),
        without_backup=bool(step.spec.upgrade and step.spec.upgrade.without_backup),
        backups=_backups(step)))  # fmt: skip
    old = status.get("upgrade")
    if decision.record != old:
        patch = decision.record
        if patch is not None and old:  # a merge patch: fields the new record lacks are removed
            patch = {**{key: None for key in old if key not in patch}, **patch}
        updated = await step.client.patch_status(POSTGRES_CLUSTER, step.name, {"status": {"upgrade": patch}},
                                                 step.namespace)  # fmt: skip
        step.adopt_status(updated)
        if decision.event is not None:
            await step.events.normal(step.cluster, *decision.event)
    record = step.status.get("upgrade")
    if decision.backup is not None and record is not None:
        await _ask_for_backup(step, decision.backup, record)  # after approvedAt (its name's source) is recorded
    await sweep(step, record)
    if record is None or decision.action == "none":
        return False
    if decision.action == "check":
        await check(step, dict(record), plan.primary)
    else:
        await advance(step, dict(record), plan, reports)
    return True
