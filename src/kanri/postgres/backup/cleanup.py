"""``deletionPolicy`` for a deleted cluster's backups: the finalizer's last step, after
:func:`kanri.postgres.cluster.deletion
.cleanup` has dealt with the volumes and Secrets.

- ``Retain`` (default): everything under ``<destination>/<cluster>/`` stays (base backups and WAL); an Event
  ``BackupsRetained`` names the place. A new cluster can restore from it, or a new cluster of the same name archives
  into it again (a new timeline, so nothing is overwritten).
- ``Delete``: once no pod of the cluster is left (a primary that is shutting down still archives its last segment;
  deleting before that would leave it behind), every object under that prefix is deleted with the operator's own
  S3 client (:mod:`kanri.postgres.backup.s3`), as a background job outside the reconcile workers (one at a time per
  namespace: :mod:`kanri.postgres.backup.repository_work`); then the cluster's PostgresBackup objects; Event
  ``BackupsDeleted``. While it waits, runs or fails, condition ``BackupsDeleted=False`` says why (reasons
  ``WaitingForPods``, ``Deleting``, ``DeleteFailing``) and the finalizer stays; a failure is retried with exponential
  backoff (2 s doubling up to 5 min), never in a hot loop. The manual escape of the finalizer
  (docs/postgres-operator.md) leaves the backups where they are, as ``Retain`` does. A repository whose endpoint the
  operator's allow-list refuses is never called: Event ``BackupsNotDeleted``, and the finalizer goes.
- **The finalizer's deadline**: waiting here is the only wait of the deletion (the rest only asks for deletes), and it
  can last forever — a pod held on a lost node, a store that stays down. Once the cluster has been deleted for longer
  than ``timeout`` (:data:`FINALIZER_TIMEOUT` by default; :func:`timed_out` decides), the operator stops waiting:
  condition ``BackupsDeleted=False`` reason ``TimedOut`` and a Warning Event ``BackupsNotDeleted`` name what is left
  (the prefix in the store, why it was not deleted) and how to remove it by hand; then the finalizer goes.

Only the cluster's own prefix is touched, with a trailing ``/``: ``orders`` never deletes ``orders2``'s objects.
A cluster without ``spec.backup``, or whose repository cannot be resolved, has nothing to delete.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from pydantic import ValidationError

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.backup.archiving import (
    BackupSettings,
    EndpointNotAllowed,
    KeysProblem,
    Repository,
    resolve,
    source_keys,
)
from kanri.postgres.backup.repository_work import RepositoryWork, backoff
from kanri.postgres.backup.s3 import S3Client, S3Keys
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.postgres.labels import of_cluster
from kanri.runtime import (
    ApiError,
    Cache,
    Client,
    EventRecorder,
    Result,
    deletion_time,
    get_condition,
    set_condition,
)
from kanri.runtime.kinds import POD

__all__ = ["CONDITION", "FINALIZER_TIMEOUT", "BackupCleanup", "backoff", "left_behind", "prefix", "timed_out"]

log = structlog.get_logger("kanri.postgres.backup.cleanup")
Obj = dict[str, Any]
CONDITION = "BackupsDeleted"
WAIT_FOR_PODS = 2.0
FINALIZER_TIMEOUT = 1800.0
"""Seconds a deleted cluster waits for its backups' deletion before the finalizer goes anyway (30 min: a deletion
job is cancelled after 15, so it had at least one full attempt and its retries)."""


def timed_out(deleted_at: datetime | None, now: datetime, timeout: float) -> bool:
    """Whether a cluster deleted at ``deleted_at`` has waited for its cleanup longer than ``timeout`` seconds."""
    return deleted_at is not None and now - deleted_at > timedelta(seconds=timeout)


def left_behind(where: str, bucket: str, why: str, pods: list[str]) -> str:
    """What a timed-out finalizer leaves, and how to clean it by hand (names and paths only, never a key)."""
    still = f"; pods still there: {', '.join(sorted(pods))}" if pods else ""
    return (f"gave up waiting for the backups under {where} to be deleted ({why}{still}); they are left in the "
            f"store: delete the objects under that prefix with the store's own tools (e.g. aws s3 rm --recursive "
            f"{where}) and the cluster's PostgresBackups (kubectl delete postgresbackup -l kanri.dev/cluster=<name>, "
            f"or by spec.cluster) by hand; bucket {bucket}")  # fmt: skip


def prefix(repository: Repository, cluster: str) -> str:
    """The cluster's key prefix in the bucket (barman's layout: ``<path>[/<namespace>]/<server name>/``)."""
    parts = [p for p in ((repository.s3.path or "").strip("/"), repository.tenant) if p]
    return "".join(f"{p}/" for p in parts) + f"{cluster}/"


def is_upgraded_system_key(key: str, repository: Repository, cluster: str) -> bool:
    """Whether ``key`` is in the folder of a system a major upgrade of ``cluster`` made (``<cluster>.pg<major>/``)."""
    folder = prefix(repository, cluster)[:-1]
    return re.match(re.escape(folder) + r"\.pg[0-9]{2}/", key) is not None


@dataclass
class BackupCleanup:
    """The backup step of the finalizer (one per reconciler). The listing and deleting run as background jobs
    (:mod:`kanri.postgres.backup.repository_work`), never inside the pass: a slow or hostile store cannot hold a
    reconcile
    worker."""

    settings: Callable[[], BackupSettings]
    work: RepositoryWork = field(default_factory=RepositoryWork)
    timeout: float = FINALIZER_TIMEOUT
    """Seconds after the deletion the finalizer stops waiting (:func:`timed_out`)."""
    now: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))

    async def run(self, client: Client, cache: Cache, events: EventRecorder, cluster: Obj) -> Result | None:
        """Carry out the backups' part of ``deletionPolicy``; None when done (the finalizer may go), else when to
        look again."""
        meta = cluster["metadata"]
        name, namespace, uid = meta["name"], meta["namespace"], meta.get("uid", "")
        self.work.sweep({c["metadata"].get("uid") for c in cache.list(POSTGRES_CLUSTER)} | {uid})
        try:
            spec = PostgresClusterSpec.model_validate(cluster.get("spec") or {})
        except ValidationError:
            return None  # never ran with a valid spec, so never archived
        repository = resolve(spec, namespace, self.settings())
        if isinstance(repository, EndpointNotAllowed) and spec.deletion_policy == "Delete":
            await events.warning(cluster, "BackupsNotDeleted", "deletionPolicy Delete: the backups were not deleted: "
                                 + repository.message("spec.backup.repository.s3.endpoint"))  # fmt: skip
        if not isinstance(repository, Repository):
            return None
        where = f"{repository.destination}/{name}/"
        if spec.deletion_policy != "Delete":
            await events.normal(cluster, "BackupsRetained", f"deletionPolicy Retain: kept the backups under {where}")
            return None
        pods = [p["metadata"]["name"] for p in of_cluster(cache, POD, namespace, name)]
        if timed_out(deletion_time(cluster), self.now(), self.timeout):
            await self._give_up(client, events, cluster, where, repository.s3.bucket, pods)
            return None
        if pods:
            await self._waiting(client, cluster, "WaitingForPods", f"deletes the backups under {where} once the "
                                f"pods are gone (still there: {', '.join(sorted(pods))})")  # fmt: skip
            return Result(requeue_after=self._before_deadline(cluster, WAIT_FOR_PODS))
        step = self.work.step(uid, namespace)
        memory = self.work.memory.get(uid)
        failures = memory.failures if memory is not None else 0
        last = f" (attempt {failures + 1}; the last failed: {memory.last_error})" if memory and failures else ""
        # a job that failed before keeps the reason DeleteFailing while it is retried: it is not known to work yet
        reason = "DeleteFailing" if failures else "Deleting"
        match step.action:
            case "start":
                self.work.start(uid, namespace, name, lambda: _delete_all(client, cache, repository, name))
                await self._waiting(client, cluster, reason, f"deleting the backups under {where}{last}")
                return Result(requeue_after=self._before_deadline(cluster, step.after or 2.0))
            case "wait" if step.blocker is not None:
                queued = f"once those of {step.blocker} are deleted (one deletion at a time per namespace)"
                await self._waiting(client, cluster, reason, f"deletes the backups under {where} {queued}{last}")
                return Result(requeue_after=self._before_deadline(cluster, step.after))
            case "wait":
                return Result(requeue_after=self._before_deadline(cluster, step.after))
            case "failed":
                error = self.work.claim(uid).error
                failures = self.work.memory[uid].failures
                delay = backoff(failures)
                await self._waiting(client, cluster, "DeleteFailing", f"cannot delete the backups under {where} "
                                    f"(attempt {failures}, next in {delay:.0f}s): {error}")  # fmt: skip
                return Result(requeue_after=self._before_deadline(cluster, delay))
        # done: the store holds nothing of the cluster any more; the records of its backups go too
        await _delete_backup_objects(client, cache, namespace, name)
        deleted = self.work.claim(uid).deleted
        await events.normal(cluster, "BackupsDeleted", f"deletionPolicy Delete: deleted {deleted} objects under "
                            f"{where} and the cluster's PostgresBackups")  # fmt: skip
        return None

    def _before_deadline(self, cluster: Obj, after: float) -> float:
        """``after``, but never past the finalizer's deadline (a retry's backoff reaches 5 min)."""
        deleted = deletion_time(cluster)
        if deleted is None:
            return after
        left = self.timeout - (self.now() - deleted).total_seconds()
        return max(0.5, min(after, left + 0.5))

    async def _give_up(self, client: Client, events: EventRecorder, cluster: Obj, where: str, bucket: str,
                       pods: list[str]) -> None:  # fmt: skip
        """The deadline passed: say what is left and how to remove it (condition and Warning Event); the caller
        then lets the finalizer go. A job still running goes on by itself (deleting is idempotent)."""
        uid = cluster["metadata"].get("uid", "")
        memory = self.work.memory.get(uid)
        current = get_condition(((cluster.get("status") or {}).get("conditions")) or [], CONDITION) or {}
        why = (memory.last_error if memory is not None and memory.last_error else None) or str(
            current.get("message") or "the deletion did not finish")  # fmt: skip
        message = left_behind(where, bucket, f"waited {self.timeout:g} s: {why}", pods)[:1000]
        await self._waiting(client, cluster, "TimedOut", message)
        await events.warning(cluster, "BackupsNotDeleted", message)
        log.warning("finalizer deadline passed: backups left in the store", cluster=cluster["metadata"]["name"],
                    namespace=cluster["metadata"]["namespace"], where=where)  # fmt: skip

    async def _waiting(self, client: Client, cluster: Obj, reason: str, message: str) -> None:
        """Condition ``BackupsDeleted=False`` with the reason (re-reading the cluster first: a merge patch replaces
        the whole list). Written only when it changes."""
        meta = cluster["metadata"]
        current = get_condition((cluster.get("status") or {}).get("conditions") or [], CONDITION)
        if current is not None and (current.get("reason"), current.get("message")) == (reason, message):
            return
        try:
            fresh = await client.get(POSTGRES_CLUSTER, meta["name"], meta["namespace"])
            conditions = copy.deepcopy((fresh.get("status") or {}).get("conditions") or [])
            set_condition(conditions, type=CONDITION, status=False, reason=reason, message=message,
                          observed_generation=int(meta.get("generation", 0)))  # fmt: skip
            await client.patch_status(POSTGRES_CLUSTER, meta["name"], {"status": {"conditions": conditions}},
                                      meta["namespace"])  # fmt: skip
        except ApiError as exc:
            if not exc.not_found:
                raise


async def _delete_all(client: Client, cache: Cache, repository: Repository, name: str) -> int:
    """The job: every object of the cluster (and of the systems its major upgrades made) deleted; how many."""
    keys = await _keys(client, cache, repository)
    async with S3Client(repository.s3.endpoint, keys, repository.s3.region or "us-east-1") as s3:
        found = await s3.list_keys(repository.s3.bucket, prefix(repository, name))
        # and the folders of the systems major upgrades made (never a neighbour's: "<name>.pg<NN>/" only)
        later = await s3.list_keys(repository.s3.bucket, prefix(repository, name)[:-1] + ".pg")
        found += [k for k in later if is_upgraded_system_key(k, repository, name)]
        return await s3.delete_keys(repository.s3.bucket, found)


async def _delete_backup_objects(client: Client, cache: Cache, namespace: str, cluster: str) -> None:
    """Delete the cluster's PostgresBackups: they describe backups that no longer exist. Those the operator made
    under Delete have an owner reference (the garbage collector would follow), but those a user made, or made
    while the policy was Retain, do not."""
    for backup in cache.list(POSTGRES_BACKUP, namespace):
        if (backup.get("spec") or {}).get("cluster") != cluster:
            continue
        try:
            await client.delete(POSTGRES_BACKUP, backup["metadata"]["name"], namespace)
        except ApiError as exc:
            if not exc.not_found:
                raise


class _KeysMissing(Exception):
    """The repository's key Secret, or a key in it, is missing (names only)."""


async def _keys(client: Client, cache: Cache, repository: Repository) -> S3Keys:
    keys = await source_keys(client, cache, repository)
    if isinstance(keys, KeysProblem):
        raise _KeysMissing(keys.message)
    return keys
