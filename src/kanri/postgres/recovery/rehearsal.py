"""Restore rehearsals on the operator's side: when one is due, its throwaway pod, and what it found.

Due (:func:`due`): the first as soon as the cluster's first base backup completed (:data:`FIRST_BACKUP`: a cluster
nobody ever restored is not known to be recoverable, and the weekly slot could be days away), then on
``spec.backup.restoreTest.schedule`` (cron, UTC; counted from the last rehearsal), and on demand whenever the
annotation ``kanri.dev/restore-test`` carries a value no rehearsal has answered yet (the value handled is kept as
``status.backup.lastRestoreTest.request``, so each new value runs once). One rehearsal at a time per cluster: the
pod's name is fixed (``<cluster>-restore-test``, :mod:`kanri.postgres.children.rehearsal`).

Trusted (:mod:`kanri.postgres.pods.oneshot`): only the pod the operator created — its uid recorded in
``status.oneShotPods`` and its controller the cluster — is read and deleted. A pod someone else made under the name
(a forged verdict) is never read nor deleted; the pass reports it as ``ForeignPod`` and the rehearsal waits until it
is gone.

Done (:func:`outcome`): the pod ended (phase Succeeded or Failed); its termination message is the verdict
:mod:`kanri.instance.rehearsal` wrote — or, when there is none (killed, evicted, the image failed), the reason the
kubelet gives. The operator records ``status.backup.lastRestoreTest {time, durationSeconds, result, recoveredTo,
message, request}``, sends an Event (Warning on failure), sets the metrics and deletes the pod. A pod that has not
ended after :data:`TIMEOUT` is recorded as failed and deleted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import structlog
from cronsim import CronSim, CronSimError

from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.backup.plan import parse_time as parse_lenient
from kanri.postgres.children.images import PostgresImages
from kanri.postgres.children.rehearsal import REHEARSAL, REQUEST, rehearsal_pod
from kanri.postgres.context import MeasuredStep
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.pods import oneshot
from kanri.runtime import ApiError
from kanri.runtime.kinds import POD

__all__ = ["ANNOTATION", "FIRST_BACKUP", "SCHEDULE", "TIMEOUT", "due", "next_scheduled", "outcome", "run"]

log = structlog.get_logger("kanri.postgres.recovery.rehearsal")
Obj = dict[str, Any]


class Pass(oneshot.Pass, MeasuredStep, Protocol):
    """What a restore rehearsal needs from the reconcile pass."""

    @property
    def images(self) -> PostgresImages: ...


ANNOTATION = REHEARSAL
"""``kubectl annotate pgc NAME kanri.dev/restore-test=<any new value>``: rehearse now."""
SCHEDULE = "schedule"
"""The request recorded for a scheduled rehearsal."""
FIRST_BACKUP = "first-backup"
"""The request recorded for the first rehearsal, run once the first base backup completed."""
TIMEOUT = timedelta(hours=6)
"""A rehearsal pod that has not ended by then is recorded as failed and removed."""


def last_record(status: Obj) -> Obj:
    return dict((status.get("backup") or {}).get("lastRestoreTest") or {})


def next_scheduled(schedule: str, since: datetime) -> datetime | None:
    """The first moment of ``schedule`` (cron, UTC) after ``since``; None for a schedule cronsim refuses."""
    try:
        moment: datetime = next(CronSim(schedule, since.astimezone(UTC)))
    except (CronSimError, StopIteration):
        return None
    return moment


def due(spec: PostgresClusterSpec, cluster: Obj, now: datetime) -> str | None:
    """What asks for a rehearsal now (the annotation's new value, :data:`FIRST_BACKUP` or :data:`SCHEDULE`), or
    None."""
    if spec.backup is None:
        return None
    status = cluster.get("status") or {}
    record = last_record(status)
    asked = ((cluster["metadata"].get("annotations") or {}).get(ANNOTATION) or "").strip()
    if asked and asked != record.get("request"):
        return asked[:253]
    test = spec.backup.restore_test
    if not test.enabled or not (status.get("backup") or {}).get("lastSuccessful"):
        return None  # nothing to restore yet: a rehearsal would only fail
    since = parse_lenient(record.get("time"))
    if since is None:
        return FIRST_BACKUP  # never rehearsed, and a backup completed: now, not at the next slot
    moment = next_scheduled(test.schedule, since)
    return SCHEDULE if moment is not None and moment <= now else None


def _seconds(duration: timedelta) -> int:
    """Whole seconds (the status field is an integer)."""
    return max(0, round(duration.total_seconds()))


@dataclass(frozen=True)
class Outcome:
    """A finished rehearsal: the record for ``status.backup.lastRestoreTest``."""

    record: Obj

    @property
    def succeeded(self) -> bool:
        return self.record.get("result") == "Succeeded"


def _terminated(pod: Obj) -> Obj | None:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated = (status.get("state") or {}).get("terminated")
        if terminated:
            return dict(terminated)
    return None


def outcome(pod: Obj, now: datetime) -> Outcome | None:
    """The record of a rehearsal pod that ended (or ran past :data:`TIMEOUT`); None while it runs."""
    status = pod.get("status") or {}
    phase = status.get("phase")
    request = ((pod["metadata"].get("annotations") or {}).get(REQUEST)) or SCHEDULE
    created = parse_lenient(pod["metadata"].get("creationTimestamp")) or now
    if phase not in ("Succeeded", "Failed"):
        if now - created < TIMEOUT:
            return None
        late = f"the rehearsal did not finish within {TIMEOUT.total_seconds() / 3600:.0f} h (pod phase {phase})"
        return Outcome({"time": now.isoformat(), "durationSeconds": _seconds(now - created),
                        "result": "Failed", "request": request, "message": late})  # fmt: skip
    terminated = _terminated(pod) or {}
    finished = parse_lenient(terminated.get("finishedAt")) or now
    started = parse_lenient(terminated.get("startedAt")) or created
    raw = str(terminated.get("message") or "")
    verdict: Obj | None = None
    try:
        parsed = json.loads(raw.strip().splitlines()[-1]) if raw.strip() else None
        verdict = parsed if isinstance(parsed, dict) and parsed.get("result") in ("Succeeded", "Failed") else None
    except ValueError:
        verdict = None
    if verdict is None:
        why = terminated.get("reason") or status.get("reason") or phase
        code = terminated.get("exitCode")
        detail = (raw.strip().splitlines() or [str(status.get("message") or "")])[-1][:500]
        message = f"the rehearsal pod ended without a verdict ({why}, exit code {code})" + (f": {detail}" if detail
                                                                                           else "")  # fmt: skip
        return Outcome({"time": finished.isoformat(), "durationSeconds": _seconds(finished - started),
                        "result": "Failed", "request": request, "message": message})  # fmt: skip
    took = timedelta(seconds=float(verdict.get("durationSeconds") or 0)) or finished - started
    record: Obj = {
        "time": finished.isoformat(),
        "durationSeconds": _seconds(took),
        "result": verdict["result"],
        "request": request,
        "message": (f"backup {verdict['backup']}: " if verdict.get("backup") else "") + str(verdict.get("message")),
    }
    if verdict.get("recoveredTo"):
        record["recoveredTo"] = verdict["recoveredTo"]
    return Outcome(record)


# --- executor ----------------------------------------------------------------------------------------------------


async def run(step: Pass, major: int, archiving: bool) -> None:
    """One pass: record and remove a finished rehearsal, or start a due one (``archiving``: the cluster has a
    repository, i.e. something to restore from). Only the pod the operator created is read or deleted
    (:mod:`kanri.postgres.pods.oneshot`); a foreign pod of that name (reported by the pass) holds the rehearsal back."""
    now = datetime.now(UTC)
    name = names.restore_test_pod(step.name)
    _metrics(step, last_record(step.status))
    pod = step.cache.get(POD, name, step.namespace)
    if pod is not None and not oneshot.trusted(pod, step.cluster, step.status):
        return  # someone else's pod under our name: its "verdict" is never read, the pod never deleted
    if pod is not None and not pod["metadata"].get("deletionTimestamp"):
        finished = outcome(pod, now)
        if finished is not None:
            await _record(step, finished)
            try:
                await step.client.delete(POD, name, step.namespace)
            except ApiError as exc:
                if not exc.not_found:
                    raise
        return
    if pod is not None or not archiving or not step.running:
        return
    request = due(step.spec, step.cluster, now)
    if request is None:
        await oneshot.forget(step, name)  # answered and gone: the uid record goes too
        return
    if not await oneshot.create(step, rehearsal_pod(step.cluster, major, request, images=step.images)):
        return
    kind = {SCHEDULE: "on schedule", FIRST_BACKUP: "after the first backup"}.get(request, "on request")
    log.info("restore rehearsal started", cluster=step.name, namespace=step.namespace, request=request)
    await step.events.normal(step.cluster, "RestoreTestStarted", f"restore rehearsal started {kind}: pod {name} "
                               "restores the latest backup and checks it")  # fmt: skip


async def _record(step: Pass, finished: Outcome) -> None:
    if last_record(step.status) == finished.record:
        return  # recorded by an earlier pass that did not get to delete the pod
    patch = {"status": {"backup": {"lastRestoreTest": finished.record}}}
    await step.client.patch_status(POSTGRES_CLUSTER, step.name, patch, step.namespace)
    _metrics(step, finished.record)
    message = f"restore rehearsal {finished.record['result'].lower()}: {finished.record['message']}"[:1000]
    log.info("restore rehearsal finished", cluster=step.name, namespace=step.namespace,
             result=finished.record["result"])  # fmt: skip
    if finished.succeeded:
        await step.events.normal(step.cluster, "RestoreTestSucceeded", message)
    else:
        await step.events.warning(step.cluster, "RestoreTestFailed", message)


def _metrics(step: Pass, record: Obj) -> None:
    when = parse_lenient(record.get("time"))
    if step.metrics is not None and when is not None:
        step.metrics.restore_tested(step.namespace, step.name, when, record.get("result") == "Succeeded")
