"""The PostgresBackup controller: one base backup per object, taken by an instance manager, recorded in the object's
status, then retention.

The state machine lives in ``status`` (so a restarted operator resumes it; nothing is only in memory):

- ``Pending``: waits, with a reason, until the cluster exists, asks for backups, has a repository, is ready, and this
  backup is first in line (one at a time per cluster, :func:`kanri.postgres.backup.plan.first_in_line`).
- ``Running``: the intent is written first (the instance chosen, ``startedAt``), then the instance is asked ``POST
  /backups {"id": <uid>}``. The id is the idempotency key: the instance answers a known id with its record and never
  starts a second backup, so every later pass simply asks ``GET /backups/{id}`` (and ``POST`` again only when the
  instance never heard of the id, e.g. the operator stopped between writing the intent and asking).
- A failed attempt that may pass (barman failed, the instance did not answer) goes back to ``Pending`` (reason
  ``RetryScheduled``, ``nextAttemptAt``, ``lastErrorReason``/``lastError``) and is tried again after an exponential
  backoff, under a new idempotency key per attempt (:mod:`kanri.postgres.backup.retry` decides); a refused one, or the
  last allowed attempt, is ``Failed``.
- ``Completed`` / ``Failed``: terminal; the instance's record (barman's id, WAL range, LSNs, size) is copied. After a
  completed backup, the primary is asked to switch WAL (``POST /wal/switch``: the backup's last segment is archived
  at once, so the backup is restorable now rather than at the next archive_timeout), then retention runs over the
  recorded backups and those of the repository's catalogue that no PostgresBackup records (``POST
  /backups/catalogue``; :mod:`kanri.postgres.backup.catalogue`), never one a restore under way needs: ``POST
  /backups/expire`` on the primary, then the expired objects are deleted.

The instance is reached as every other operator→instance call
(:class:`kanri.postgres.cluster.instances.HttpInstanceClient`:
HTTPS with the cluster's CA once the TLS step trusted the pods, the bearer token of ``<cluster>-api``). "Now" comes
from an injectable clock (retention and timeouts), so tests can age backups without touching the S3 server's clock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, runtime_checkable

import structlog
from pydantic import ValidationError

from kanri.contract.backup import BackupRecord, Catalogue, Expired, WalSwitched
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.backup import plan as backup_plan
from kanri.postgres.backup import retry as backup_retry
from kanri.postgres.backup.archiving import BackupSettings, Repository, resolve, server_name
from kanri.postgres.backup.catalogue import needed_by_restores, unrecorded
from kanri.postgres.cluster.instances import BackupAnswer, instance_endpoint
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.postgres.metrics import PostgresMetrics
from kanri.runtime import ApiError, Cache, Client, EventRecorder, Request, Result

__all__ = ["WAIT", "BackupClient", "CatalogueClient", "PostgresBackupReconciler", "Wait", "gate", "siblings"]

log = structlog.get_logger("kanri.postgres.backup.controller")
Obj = dict[str, Any]

WAIT = 30.0
"""A Pending backup is looked at again this often (and whenever its cluster or a sibling backup changes)."""
POLL = 5.0
"""A Running backup's record is read this often."""
RETRY = 10.0
"""After an instance did not answer (or refused for now)."""
UNANSWERED = timedelta(minutes=15)
"""A Running backup whose instance has not known it for this long is Failed (the pod gone, the instance down)."""


@runtime_checkable
class BackupClient(Protocol):
    """The instance API's backup endpoints (:class:`kanri.postgres.cluster.instances.HttpInstanceClient` has them)."""

    async def start_backup(self, address: str, token: str, backup: str) -> BackupAnswer: ...

    async def backup_record(self, address: str, token: str, backup: str) -> BackupAnswer: ...

    async def expire_backups(
        self, address: str, token: str, ids: list[str], server: str | None = None
    ) -> BackupAnswer: ...

    async def switch_wal(self, address: str, token: str) -> BackupAnswer: ...


@runtime_checkable
class CatalogueClient(Protocol):
    """The instance API's catalogue of the repository (a test's stand-in without it: retention sees recorded
    backups only)."""

    async def backup_catalogue(self, address: str, token: str, server: str | None = None) -> BackupAnswer: ...


@dataclass(frozen=True)
class Wait:
    """Why a Pending backup does not start yet."""

    reason: str
    message: str


def siblings(cache: Cache, namespace: str, cluster: str) -> list[Obj]:
    """The PostgresBackups of ``cluster`` (by ``spec.cluster``)."""
    return [b for b in cache.list(POSTGRES_BACKUP, namespace) if (b.get("spec") or {}).get("cluster") == cluster]


def _spec(cluster: Obj) -> PostgresClusterSpec | None:
    try:
        return PostgresClusterSpec.model_validate(cluster.get("spec") or {})
    except ValidationError:
        return None


def gate(backup: Obj, cluster: Obj | None, others: list[Obj], repository: Repository | str | None) -> Wait | str:
    """The instance to take ``backup`` from, or why it waits. Pure: every input comes from the cache."""
    name = backup["spec"]["cluster"]
    if cluster is None:
        return Wait("ClusterNotFound", f"PostgresCluster {name} does not exist (yet)")
    if cluster["metadata"].get("deletionTimestamp"):
        return Wait("ClusterDeleting", f"PostgresCluster {name} is being deleted")
    spec = _spec(cluster)
    if spec is None or spec.backup is None:
        return Wait("NoBackupConfigured", f"PostgresCluster {name} has no spec.backup: it has no repository to "
                    "back up into; set spec.backup (e.g. {retentionDays: 7})")  # fmt: skip
    if not isinstance(repository, Repository):
        return Wait(str(repository or "NoRepository"), f"PostgresCluster {name} has no usable backup repository "
                    f"({repository}); see its condition ContinuousArchiving")  # fmt: skip
    first = backup_plan.first_in_line(others)
    if first is not None and first["metadata"]["name"] != backup["metadata"]["name"]:
        return Wait("WaitingForBackup", f"backup {first['metadata']['name']} of {name} goes first: one backup at a "
                    "time per cluster")  # fmt: skip
    status = cluster.get("status") or {}
    if spec.replicas == 0:
        return Wait("ClusterNotReady", f"PostgresCluster {name} is hibernated (replicas 0)")
    source = backup_plan.choose_source(status.get("instances") or [], status.get("currentPrimary"))
    if source is None:
        return Wait("ClusterNotReady", f"no instance of {name} is ready to take a backup from (phase "
                    f"{status.get('phase') or 'unknown'})")  # fmt: skip
    return source


class PostgresBackupReconciler:
    """Drives each PostgresBackup through Pending → Running → Completed | Failed (see the module's docstring)."""

    def __init__(
        self,
        cache: Cache,
        client: Client,
        *,
        instances: BackupClient,
        events: EventRecorder,
        settings: Callable[[], BackupSettings],
        metrics: PostgresMetrics | None = None,
        retry: backup_retry.RetryPolicy | None = None,
    ) -> None:
        self.cache = cache
        self._retry = retry
        self.client = client
        self.instances = instances
        self.events = events
        self.settings = settings
        self.metrics = metrics

    def now(self) -> datetime:
        return self.settings().now()

    @property
    def retry(self) -> backup_retry.RetryPolicy:
        """The retry policy given, else :data:`kanri.postgres.backup.retry.DEFAULT` (read at each use)."""
        return self._retry or backup_retry.DEFAULT

    async def reconcile(self, request: Request) -> Result | None:
        backup = self.cache.get(POSTGRES_BACKUP, request.name, request.namespace)
        if backup is None:
            return None
        phase = (backup.get("status") or {}).get("phase")
        if phase in backup_plan.TERMINAL:
            return None  # finished: its record stays as it is (retention ran when it completed)
        cluster = self.cache.get(POSTGRES_CLUSTER, backup["spec"]["cluster"], request.namespace)
        try:
            if phase == "Running":
                return await self.running(backup, cluster)
            return await self.pending(backup, cluster)
        except ApiError as exc:
            if exc.not_found:
                return None  # the PostgresBackup was deleted while we worked on it
            raise

    # --- Pending ---------------------------------------------------------------------------------------------------

    async def pending(self, backup: Obj, cluster: Obj | None) -> Result | None:
        namespace, status = backup["metadata"]["namespace"], backup.get("status") or {}
        retry_at = backup_plan.parse_time(status.get("nextAttemptAt"))
        if retry_at is not None and (left := (retry_at - self.now()).total_seconds()) > 0:
            return Result(requeue_after=min(left, WAIT))  # a failed attempt's backoff
        repository = None
        if cluster is not None and (spec := _spec(cluster)) is not None:
            repository = resolve(spec, namespace, self.settings())
        verdict = gate(backup, cluster, siblings(self.cache, namespace, backup["spec"]["cluster"]), repository)
        if isinstance(verdict, Wait):
            await self.write(backup, {"phase": "Pending", "reason": verdict.reason, "message": verdict.message})
            return Result(requeue_after=WAIT)
        # The intent first: a restarted operator finds Running with the instance and resumes there.
        started = self.now().isoformat(timespec="seconds")
        # serverName: where this system's backups go (the instance's archive target says the same), for retention
        # and recovery to find it after a major upgrade moved the cluster on to a new system
        server = server_name(cluster) if cluster is not None else str(backup["spec"]["cluster"])
        attempt = int(status.get("attempts") or 0) + 1
        nth = f" (attempt {attempt} of {self.retry.max_attempts})" if attempt > 1 else ""
        intent = {"phase": "Running", "reason": "Started", "instance": verdict, "startedAt": started,
                  "serverName": server, "message": f"asking {verdict} to take the backup{nth}", "attempts": attempt,
                  "nextAttemptAt": None}  # fmt: skip
        try:
            # Guarded by resourceVersion: read from a stale cache (the object is Running already, maybe on another
            # instance), the write gets a 409 instead of a second intent.
            written = await self.write(backup, intent, guard=True)
        except ApiError as exc:
            if exc.status != 409:
                raise
            return Result(requeue_after=1.0)
        log.info("base backup started", backup=backup["metadata"]["name"], namespace=namespace, instance=verdict)
        await self.events.normal(written, "BackupStarted", f"base backup of {backup['spec']['cluster']} started on "
                                 f"{verdict}{nth}")  # fmt: skip
        return await self.running(written, cluster)

    # --- Running ---------------------------------------------------------------------------------------------------

    async def running(self, backup: Obj, cluster: Obj | None) -> Result | None:
        meta, status = backup["metadata"], backup.get("status") or {}
        namespace, instance = meta["namespace"], str(status.get("instance") or "")
        key = backup_retry.attempt_id(backup_plan.idempotency_id(meta["uid"]), int(status.get("attempts") or 1))
        endpoint = instance_endpoint(self.cache, namespace, backup["spec"]["cluster"], instance) if instance else None
        if endpoint is None:
            answer = BackupAnswer(0, {}, f"instance {instance} has no address (pod gone or not running)")
        else:
            address, token = endpoint
            answer = await self.instances.backup_record(address, token, key)
            if answer.status == 404:  # never heard of it: the intent was written, the request not yet sent
                answer = await self.instances.start_backup(address, token, key)
        if answer.status in (200, 202):
            record = BackupRecord.read(answer.body)  # None: not a record yet (asked again after POLL)
            if record is not None and record.phase == "Completed":
                await self.completed(backup, cluster, record)
                return None
            if record is not None and record.phase == "Failed":
                return await self.attempt_failed(backup, cluster, "BackupFailed", record.error or "no reason")
            return Result(requeue_after=POLL)
        since = backup_plan.parse_time(status.get("startedAt")) or self.now()
        if answer.status == 400 or self.now() - since > UNANSWERED:
            why = "BackupRefused" if answer.status == 400 else "InstanceUnreachable"
            return await self.attempt_failed(backup, cluster, why, f"instance {instance}: {answer.error}")
        message = f"instance {instance} answers {answer.status or 'nothing'}: {answer.error}; retrying"
        await self.write(backup, {"message": message[:4000]})
        return Result(requeue_after=RETRY)

    # --- the end ---------------------------------------------------------------------------------------------------

    async def completed(self, backup: Obj, cluster: Obj | None, record: BackupRecord) -> None:
        status = backup.get("status") or {}
        where = "a replica" if record.from_standby else "the primary"
        fields: Obj = {
            "phase": "Completed", "reason": "Completed",
            "message": f"taken from {status.get('instance')} ({where})",
            "startedAt": record.begin_time or status.get("startedAt"),
            "completedAt": record.end_time or record.completed_at or self.now().isoformat(),
            "backupId": record.backup_id, "beginWAL": record.begin_wal, "endWAL": record.end_wal,
            "beginLSN": record.begin_lsn, "endLSN": record.end_lsn, "timeline": record.timeline,
            "sizeBytes": record.size_bytes,
        }  # fmt: skip
        written = await self.write(backup, {k: v for k, v in fields.items() if v is not None})
        name, of = backup["metadata"]["name"], backup["spec"]["cluster"]
        size = record.size_bytes
        text = (
            f"base backup {name} of {of} completed: {record.backup_id}"
            + (f", {size / 1048576:.1f} MiB" if isinstance(size, int) else "")
            + f", from {status.get('instance')}"
        )
        log.info("base backup completed", backup=name, namespace=backup["metadata"]["namespace"],
                 backup_id=record.backup_id)  # fmt: skip
        await self.events.normal(written, "BackupCompleted", text)
        if cluster is not None:
            await self.events.normal(cluster, "BackupCompleted", text)
            await self.close_segment(cluster, name)
            await self.retention(cluster, written)

    async def close_segment(self, cluster: Obj, backup: str) -> None:
        """Ask the primary to switch WAL, so the backup's last segment is archived now: until it is, the backup
        cannot be restored (recovery stops with "WAL ends before consistent recovery point"), and on a quiet cluster
        it would wait for archive_timeout. Best effort: a failure is logged, and archive_timeout still bounds it."""
        namespace, name = cluster["metadata"]["namespace"], cluster["metadata"]["name"]
        address, token = self.primary_address(cluster)
        if address is None or token is None:
            log.warning("WAL not switched after a backup: no primary to ask", cluster=name, namespace=namespace,
                        backup=backup)  # fmt: skip
            return
        answer = await self.instances.switch_wal(address, token)
        switched = WalSwitched.read(answer.body) if answer.status == 200 else None
        if answer.status == 200:
            log.info("WAL switched after a backup", cluster=name, namespace=namespace, backup=backup,
                     segment=switched.segment if switched else None)  # fmt: skip
        else:
            log.warning("WAL not switched after a backup", cluster=name, namespace=namespace, backup=backup,
                        status=answer.status, error=answer.error)  # fmt: skip

    def primary_address(self, cluster: Obj) -> tuple[str | None, str | None]:
        """The current primary's pod address and the cluster's API token (None where there is none)."""
        namespace, name = cluster["metadata"]["namespace"], cluster["metadata"]["name"]
        primary = (cluster.get("status") or {}).get("currentPrimary")
        endpoint = instance_endpoint(self.cache, namespace, name, primary) if primary else None
        return endpoint or (None, None)

    async def attempt_failed(self, backup: Obj, cluster: Obj | None, reason: str, why: str) -> Result | None:
        """One attempt failed: tried again after the backoff, or Failed for good (a refusal, the last attempt)."""
        failed = int((backup.get("status") or {}).get("attempts") or 1)
        verdict = backup_retry.decide(self.retry, failed, reason, self.now())
        if isinstance(verdict, backup_retry.GiveUp):
            await self.failed(backup, cluster, reason, why, f" ({verdict.why})" if failed > 1 else "")
            return None
        at = verdict.at.isoformat(timespec="seconds")
        message = (f"attempt {failed} of {self.retry.max_attempts} failed ({reason}): {why}; attempt "
                   f"{verdict.attempt} at {at}")  # fmt: skip
        fields = {"phase": "Pending", "reason": "RetryScheduled", "message": message[:4000], "nextAttemptAt": at,
                  "lastErrorReason": reason, "lastError": why[:4000]}  # fmt: skip
        try:
            # Guarded like the intent: a pass that read a stale Running must not rewind a newer attempt.
            written = await self.write(backup, fields, guard=True)
        except ApiError as exc:
            if exc.status != 409:
                raise
            return Result(requeue_after=1.0)
        name, namespace = backup["metadata"]["name"], backup["metadata"]["namespace"]
        log.warning("base backup attempt failed; retrying", backup=name, namespace=namespace, reason=reason,
                    attempt=failed, next_attempt_at=at, error=why)  # fmt: skip
        await self.events.warning(written, "BackupRetryScheduled", f"base backup {name}: {message}"[:1000])
        return Result(requeue_after=min(max((verdict.at - self.now()).total_seconds(), 0.1), WAIT))

    async def failed(self, backup: Obj, cluster: Obj | None, reason: str, why: str, after: str = "") -> None:
        fields = {"phase": "Failed", "reason": reason, "message": f"{why}{after}"[:4000], "lastErrorReason": reason,
                  "lastError": why[:4000], "completedAt": self.now().isoformat(timespec="seconds")}  # fmt: skip
        written = await self.write(backup, fields)
        name, of, namespace = backup["metadata"]["name"], backup["spec"]["cluster"], backup["metadata"]["namespace"]
        log.warning("base backup failed", backup=name, namespace=namespace, reason=reason, error=why)
        text = f"base backup {name} of {of} failed ({reason}): {why}{after}"[:1000]
        await self.events.warning(written, "BackupFailed", text)
        if cluster is not None:
            await self.events.warning(cluster, "BackupFailed", text)
        if self.metrics is not None:
            self.metrics.backup_failed(namespace, of)

    async def retention(self, cluster: Obj, done: Obj) -> None:
        """Expire what the recovery window no longer needs, on the primary; then delete those PostgresBackups.
        A failure is told (Event) and tried again after the next backup."""
        spec = _spec(cluster)
        if spec is None or spec.backup is None:
            return
        meta = cluster["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        mine = {b["metadata"]["name"]: b for b in siblings(self.cache, namespace, name)}
        mine[done["metadata"]["name"]] = done  # the cache may not have its new status yet
        recorded = backup_plan.completed(mine.values(), name)
        address, token = self.primary_address(cluster)
        current = server_name(cluster)
        # the repository's own catalogue: backups made by hand, or whose PostgresBackup was deleted, count too
        candidates = [*recorded, *await self.unrecorded(cluster, address, token, current, recorded)]
        needed = needed_by_restores(self.cache.list(POSTGRES_CLUSTER, namespace), name, candidates)
        old = [d for d in backup_plan.expired(candidates, spec.backup.retention_days, self.now())
               if d.backup_id not in needed]  # fmt: skip
        if not old:
            return
        if not address or token is None:
            await self.events.warning(cluster, "RetentionFailed", "cannot expire old backups: no primary to ask")
            return
        # Each PostgreSQL system's backups live under its own server name (a major upgrade makes a new system):
        # one request per server name, the current system's without one.
        deleted: set[str] = set()
        failed: dict[str, str] = {}
        errors: list[str] = []
        for server in sorted({d.server for d in old}):
            ids = [d.backup_id for d in old if d.server == server]
            answer = await self.instances.expire_backups(address, token, ids, None if server == current else server)
            expired = Expired.read(answer.body) if answer.status == 200 else None
            if expired is not None:
                deleted |= {f"{server}/{i}" for i in expired.deleted}
                failed |= {f"{server}/{k}": v for k, v in expired.failed.items()}
            elif answer.error:
                errors.append(answer.error)
        for item in old:
            if item.name and f"{item.server}/{item.backup_id}" in deleted:
                try:
                    await self.client.delete(POSTGRES_BACKUP, item.name, namespace)
                except ApiError as exc:
                    if not exc.not_found:
                        raise
        gone = [d.name or f"{d.backup_id} (no PostgresBackup)" for d in old if f"{d.server}/{d.backup_id}" in deleted]
        if gone:
            log.info("base backups expired", cluster=name, namespace=namespace, backups=gone)
            window = f"{spec.backup.retention_days}-day recovery window"
            await self.events.normal(cluster, "BackupsExpired", f"expired {', '.join(gone)}: outside the {window} "
                                     "(their WAL with them)")  # fmt: skip
        if len(gone) < len(old):
            why = "; ".join(f"{k}: {v}" for k, v in failed.items()) or "; ".join(errors) or "no reason given"
            await self.events.warning(cluster, "RetentionFailed", f"could not expire every old backup: {why}"[:1000])

    async def unrecorded(
        self, cluster: Obj, address: str | None, token: str | None, server: str, recorded: list[backup_plan.Done]
    ) -> list[backup_plan.Done]:
        """The complete backups of the current system in the repository that no PostgresBackup records, from the
        primary's ``POST /backups/catalogue``; none (and a Warning Event) when it cannot be read."""
        if not address or token is None or not isinstance(self.instances, CatalogueClient):
            return []
        answer = await self.instances.backup_catalogue(address, token)
        catalogue = Catalogue.read(answer.body) if answer.status == 200 else None
        if catalogue is None:
            why = answer.error or f"status {answer.status}"
            await self.events.warning(cluster, "RetentionFailed", "cannot read the repository's catalogue, so backups "
                                      f"no PostgresBackup records are not counted this time: {why}"[:1000])  # fmt: skip
            return []
        return unrecorded(catalogue.backups, server, recorded)

    async def write(self, backup: Obj, fields: Obj, *, guard: bool = False) -> Obj:
        """Merge ``fields`` into the backup's status when they change something; the backup as written. ``guard``:
        only if the object is still the version read (else the API server answers 409)."""
        status = backup.get("status") or {}
        if all(status.get(k) == v for k, v in fields.items()):
            return backup
        meta = backup["metadata"]
        patch: Obj = {"status": fields}
        if guard:
            patch["metadata"] = {"resourceVersion": meta["resourceVersion"]}
        return await self.client.patch_status(POSTGRES_BACKUP, meta["name"], patch, meta["namespace"])
