"""bootstrap.recovery on the operator's side: where the source's backups are, the key pair the instances need to
read them, the ``recovery`` entry of ``instance.json`` and condition ``Restored``.

Where (:func:`resolve`): ``recovery.repository`` when given (the source cluster may be gone, its backups retained);
else the repository the source PostgresCluster of that name in the namespace resolves to (its own or the platform's
default, as :func:`kanri.postgres.backup.archiving.resolve` decides for it); else — the source is gone and no repository
is
named — the platform's default, where a deleted cluster with ``deletionPolicy: Retain`` left its backups. The
backups are read under ``<destination>/<source>/``; the new cluster archives under its OWN name, and a restore whose
source path is the new cluster's own archive path is refused (it would write into the backups it restores).

The key pair is copied into ``<cluster>-recovery-credentials`` (the source's repository may have other keys than the
cluster's own), mounted at ``/etc/kanri/recovery``. Until the repository is resolved no instance is created (an
instance without the ``recovery`` entry would initdb an empty database instead). Once the primary has reported a
system identifier the restore is over: ``Restored=True`` stays, and nothing is resolved again.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from pydantic import ValidationError

from kanri.contract.instance_config import ArchiveTarget, RecoveryPlan
from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.api.v1alpha1.bootstrap import Recovery
from kanri.postgres.backup.archiving import (
    BackupSettings,
    EndpointNotAllowed,
    ForeignFolder,
    KeysProblem,
    Repository,
    endpoint_allowed,
    foreign_folder,
    write_keys,
)
from kanri.postgres.backup.archiving import resolve as resolve_own
from kanri.postgres.context import ClusterStep
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Kind, get_condition, set_condition

__all__ = ["CONDITION", "Restore", "entry", "resolve", "verdict"]

log = structlog.get_logger("kanri.postgres.recovery.bootstrap")
Obj = dict[str, Any]


class Pass(ClusterStep, Protocol):
    """What bootstrap.recovery needs from the reconcile pass."""

    @property
    def spec(self) -> PostgresClusterSpec: ...

    @property
    def backup_settings(self) -> BackupSettings: ...

    async def apply(self, kind: Kind, desired: Obj) -> str: ...


CONDITION = "Restored"


@dataclass(frozen=True)
class Problem:
    """Why the restore cannot start (the condition's reason and message)."""

    reason: str
    message: str


def _source_spec(source: Obj | None) -> PostgresClusterSpec | None:
    if source is None:
        return None
    try:
        return PostgresClusterSpec.model_validate(source.get("spec") or {})
    except ValidationError:
        return None


def resolve(recovery: Recovery, source: Obj | None, namespace: str, settings: BackupSettings) -> Repository | Problem:
    """The repository holding the source's backups (see the module docstring); ``source`` is the source
    PostgresCluster as the cache has it (None: not there)."""
    named = recovery.repository
    if named is not None:
        if named.s3 is None:
            return Problem("VolumeRepositoryNotSupported", "bootstrap.recovery.repository.volume is not implemented "
                           "by this operator version; use repository.s3")  # fmt: skip
        if not endpoint_allowed(named.s3.endpoint, settings):
            refused = EndpointNotAllowed(named.s3.endpoint)
            return Problem("EndpointNotAllowed", refused.message("bootstrap.recovery.repository.s3.endpoint"))
        if foreign := foreign_folder(named.s3, namespace, settings):
            return Problem("ForeignRepositoryFolder", foreign.message("bootstrap.recovery.repository.s3"))
        return Repository(named.s3, namespace, default=False)
    if source is not None:
        spec = _source_spec(source)
        if spec is None:
            return Problem("SourceInvalid", f"the source PostgresCluster {recovery.source} has a spec this operator "
                           "cannot read; name the repository in bootstrap.recovery.repository")  # fmt: skip
        found = resolve_own(spec, namespace, settings)
        if found is None:
            return Problem("SourceHasNoBackups", f"the source PostgresCluster {recovery.source} has no spec.backup: "
                           "it has no backups to restore")  # fmt: skip
        if isinstance(found, EndpointNotAllowed):
            where = f"the source PostgresCluster {recovery.source}'s repository endpoint"
            return Problem("EndpointNotAllowed", found.message(where))
        if isinstance(found, ForeignFolder):
            return Problem("ForeignRepositoryFolder", found.message(f"the source PostgresCluster {recovery.source}'s "
                           "spec.backup.repository.s3"))  # fmt: skip
        if isinstance(found, str):
            return Problem("SourceHasNoRepository", f"the source PostgresCluster {recovery.source} has no usable "
                           f"repository ({found}); name one in bootstrap.recovery.repository")  # fmt: skip
        return found
    if settings.default_repository is not None:
        # the default repository's folder of THIS namespace: a source elsewhere is not reachable so
        return Repository(settings.default_repository, settings.default_namespace, default=True, tenant=namespace)
    return Problem("SourceNotFound", f"there is no PostgresCluster {recovery.source} in this namespace, no "
                   "bootstrap.recovery.repository and no platform default repository: nowhere to find its "
                   "backups")  # fmt: skip


def entry(recovery: Recovery, repository: Repository) -> Obj:
    """The ``recovery`` entry of ``instance.json`` (:class:`kanri.contract.instance_config.RecoveryPlan`, as the
    contract serialises it: optional keys only when set)."""
    # constructed, not validated: a plan the instance would refuse is refused there, as before, not raised here
    s3 = repository.s3
    source = ArchiveTarget.model_construct(destination=repository.destination, endpoint=s3.endpoint,
                                           server_name=recovery.source, region=s3.region or None)  # fmt: skip
    plan = RecoveryPlan.model_construct(source=source, backup=recovery.backup, target_time=recovery.target_time,
                                        target_lsn=recovery.target_lsn,
                                        target_immediate=bool(recovery.target_immediate))  # fmt: skip
    document: Obj = plan.model_dump(mode="json", by_alias=True)
    return document


def describe(recovery: Recovery, repository: Repository) -> str:
    """Which backup and where replay stops, for the condition and Events."""
    backup = f"backup {recovery.backup}" if recovery.backup else "the latest backup"
    if recovery.target_time is not None:
        until = f"up to {recovery.target_time.isoformat()}"
    elif recovery.target_lsn is not None:
        until = f"up to LSN {recovery.target_lsn}"
    elif recovery.target_immediate:
        until = "to the backup's consistent end"
    else:
        until = "to the end of the archived WAL"
    return f"{backup} of {repository.describe(recovery.source)}, {until}"


def same_path(repository: Repository, source: str, own: Obj | None) -> bool:
    """Whether the cluster would archive exactly where it restores from."""
    if own is None:
        return False
    return bool(own.get("destination") == repository.destination and own.get("serverName") == source
                and own.get("endpointURL") == repository.s3.endpoint)  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    """Condition ``Restored``."""

    ok: bool
    reason: str
    message: str


def verdict(
    recovery: Recovery, resolved: Repository | Problem, initialised: bool, credentials: KeysProblem | None
) -> Verdict:
    """The condition from the resolution, the key pair copy and whether the primary has reported its data."""
    if isinstance(resolved, Problem):
        return Verdict(False, resolved.reason, resolved.message)
    what = describe(recovery, resolved)
    if credentials is not None:
        return Verdict(False, credentials.reason, f"cannot restore {what}: {credentials.message}")
    if initialised:
        return Verdict(True, "Restored", f"restored {what}")
    return Verdict(False, "Restoring", f"restoring {what}; the primary promotes itself at the end and reports "
                   "Ready (its /status shows the progress)")  # fmt: skip


@dataclass
class Restore:
    """This pass's recovery: the ``instance.json`` entry (None: none), whether instances may be created, and the
    condition to write (None: no bootstrap.recovery, or the restore ended in an earlier pass)."""

    entry: Obj | None = None
    blocked: bool = False
    verdict: Verdict | None = None


async def prepare(step: Pass, settings: BackupSettings, own_archive: Obj | None, initialised: bool) -> Restore:
    """Resolve, check, copy the key pair; what the rest of the pass needs (see :class:`Restore`)."""
    recovery = step.spec.bootstrap.recovery
    if recovery is None:
        return Restore()
    done = get_condition(step.status.get("conditions") or [], CONDITION)
    if done is not None and done.get("status") == "True":
        return Restore()  # restored: the data is this cluster's now; the source may be gone
    source = step.cache.get(POSTGRES_CLUSTER, recovery.source, step.namespace)
    resolved = resolve(recovery, source, step.namespace, settings)
    if isinstance(resolved, Repository) and same_path(resolved, recovery.source, own_archive):
        where = resolved.describe(recovery.source)
        resolved = Problem("SameRepositoryPath", f"the cluster would archive into {where}, the very backups it "
                           "restores from; give it another name or another repository")  # fmt: skip
    if isinstance(resolved, Problem):
        return Restore(blocked=not initialised, verdict=verdict(recovery, resolved, initialised, None))
    credentials = await copy_credentials(step, resolved)
    return Restore(entry=entry(recovery, resolved), blocked=not initialised and credentials is not None,
                   verdict=verdict(recovery, resolved, initialised, credentials))  # fmt: skip


async def copy_credentials(step: Pass, repository: Repository) -> KeysProblem | None:
    """The key pair for the source repository (:func:`kanri.postgres.backup.archiving.repository_keys`: the namespace's
    own identity for the default repository) into ``<cluster>-recovery-credentials``; the problem or None."""
    return await write_keys(step, repository, names.recovery_secret(step.name))


async def report(step: Pass, restore: Restore) -> None:
    """Write condition ``Restored`` when it changed (re-reading the cluster first, as backup.report does) and send
    an Event when its reason changes."""
    wanted = restore.verdict
    if wanted is None:
        return
    generation = int(step.cluster["metadata"].get("generation", 0))
    old = get_condition(step.status.get("conditions") or [], CONDITION)
    if old is not None and (old.get("reason"), old.get("message"), old.get("status")) == (
        wanted.reason, wanted.message, "True" if wanted.ok else "False"):  # fmt: skip
        return
    fresh = await step.client.get(POSTGRES_CLUSTER, step.name, step.namespace)
    conditions = copy.deepcopy((fresh.get("status") or {}).get("conditions") or [])
    set_condition(conditions, type=CONDITION, status=wanted.ok, reason=wanted.reason, message=wanted.message,
                  observed_generation=generation)  # fmt: skip
    await step.client.patch_status(POSTGRES_CLUSTER, step.name, {"status": {"conditions": conditions}}, step.namespace)
    if old is not None and old.get("reason") == wanted.reason:
        return
    log.info("restore condition changed", cluster=step.name, namespace=step.namespace, reason=wanted.reason)
    if wanted.ok or wanted.reason == "Restoring":
        await step.events.normal(step.cluster, wanted.reason, wanted.message)
    else:
        await step.events.warning(step.cluster, wanted.reason, wanted.message)
