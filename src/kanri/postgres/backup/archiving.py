"""Backups, first slice: where a cluster's WAL goes, and whether it is getting there (condition ContinuousArchiving).

Where: ``spec.backup.repository`` when set, else the platform's default repository — the operator's configuration
(``kanri run --default-backup-repository FILE``, an S3 repository whose key Secret lives in the operator's namespace),
so the same manifest works in every environment and users never need to know where backups are kept. The operator
copies the key pair into ``<cluster>-backup-credentials`` in the cluster's namespace (pods can only mount Secrets of
their own namespace), under the file names the instance manager reads, and puts the destination (no secret) into the
instances' ``instance.json``; the instance manager archives (:mod:`kanri.instance.archive`).

Whether: the primary reports ``pg_stat_archiver``; :func:`decide` turns that and the repository into the condition,
``status.backup.lastArchivedWAL``/``lastArchivedTime`` and a metric; an Event is sent when the condition flips. Pure
deciders (:func:`resolve`, :func:`decide`) and a thin executor (:func:`ensure_credentials`, :func:`report`), which the
reconciler calls at the start and the end of a pass. Nothing here requeues: a cluster without a repository is looked
at again only at the ordinary refresh, like any other.
"""

from __future__ import annotations

import base64
import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import urlsplit

import structlog
import yaml
from prometheus_client import CollectorRegistry, Gauge
from pydantic import ValidationError

from kanri.contract.backup import ACCESS_KEY_FILE, SECRET_KEY_FILE
from kanri.contract.instance_config import ArchiveTarget
from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.backup.iam import IamError
from kanri.postgres.backup.s3 import S3Keys
from kanri.postgres.backup.tenant_identity import TenantIdentities, folder, inside
from kanri.postgres.children import child_meta, owned
from kanri.postgres.context import ClusterStep
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import cluster_labels
from kanri.runtime import ApiError, Cache, Client, Kind, get_condition, parse_time, remove_condition, set_condition
from kanri.runtime.kinds import SECRET

if TYPE_CHECKING:
    from kanri.postgres.cluster.instances import InstanceReport

__all__ = [
    "CONDITION",
    "Archiving",
    "BackupMetrics",
    "BackupSettings",
    "DefaultRepository",
    "EndpointNotAllowed",
    "ForeignFolder",
    "KeysProblem",
    "Repository",
    "archive_target",
    "decide",
    "endpoint_allowed",
    "ensure_credentials",
    "foreign_folder",
    "identities_for",
    "load_repository",
    "report",
    "repository_keys",
    "resolve",
    "server_name",
    "source_keys",
    "upgraded_server_name",
    "write_keys",
]

log = structlog.get_logger("kanri.postgres.backup.archiving")
Obj = dict[str, Any]


class Pass(ClusterStep, Protocol):
    """What archiving needs from the reconcile pass."""

    @property
    def backup_settings(self) -> BackupSettings: ...

    async def apply(self, kind: Kind, desired: Obj) -> str: ...


CONDITION = "ContinuousArchiving"


class BackupMetrics:
    """``kanri_postgres_archiving_failing`` (1 while the condition is False for a cluster that asks for backups)
    and ``kanri_postgres_last_archived_timestamp_seconds``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ("namespace", "cluster")
        self.failing = Gauge("kanri_postgres_archiving_failing", "1 while WAL archiving does not work (condition "
                             "ContinuousArchiving=False).", labels, registry=registry)  # fmt: skip
        self.last_archived = Gauge("kanri_postgres_last_archived_timestamp_seconds", "Unix time the primary last "
                                   "archived a WAL file.", labels, registry=registry)  # fmt: skip


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class BackupSettings:
    """The operator's backup configuration: the platform's default repository (None: none) and the namespace its
    credentials Secret is in (the operator's own)."""

    default_repository: S3Repository | None = None
    default_namespace: str = "kanri-system"
    metrics: BackupMetrics | None = None
    now: Callable[[], datetime] = field(default=utc_now)
    """"Now" for base backups' schedule, retention and timeouts (tests age backups with it)."""
    allowed_endpoints: tuple[str, ...] = ()
    """The S3 endpoints a cluster may name (``kanri run --allowed-backup-endpoint``): a URL (scheme, host and port
    must match) or a host / ``host:port``; empty: any. The default repository's endpoint is always allowed."""
    identities: TenantIdentities | None = None
    """Each namespace's own identity in the default repository (:mod:`kanri.postgres.backup.tenant_identity`): what pods
    get instead of the platform's keys. None only with ``tenantIsolation: Shared`` (one tenant: every namespace gets
    the platform's keys)."""


@dataclass(frozen=True)
class Repository:
    """The repository a cluster archives into, and where its key Secret is."""

    s3: S3Repository
    secret_namespace: str
    default: bool
    tenant: str | None = None
    """The platform's default repository is shared by every namespace: the cluster's namespace, a folder of its own
    under the repository's path. Without it two clusters of one name in two namespaces would archive into one
    folder, and a namespace user could restore another namespace's cluster by naming it in bootstrap.recovery."""

    @property
    def destination(self) -> str:
        parts = [p for p in (self.s3.path, self.tenant) if p]
        return f"s3://{self.s3.bucket}" + "".join(f"/{p}" for p in parts)

    def describe(self, cluster: str) -> str:
        return f"{self.destination}/{cluster}" + (" (default)" if self.default else "")


class DefaultRepository(S3Repository):
    """The platform's default repository: the fields of ``backup.repository.s3`` and how namespaces are kept apart in
    it."""

    tenant_isolation: Literal["IAMUser", "Shared"] = "IAMUser"
    """``IAMUser`` (default): each namespace gets an identity of its own, confined by the store to its folder
    (:mod:`kanri.postgres.backup.tenant_identity`); the platform's keys never leave the operator's namespace.
    ``Shared``:
    every cluster gets the platform's keys — only for a platform with one tenant."""
    iam_endpoint: str | None = None
    """Where the store's IAM API answers; default the S3 endpoint (SeaweedFS, Ceph RGW). AWS:
    ``https://iam.amazonaws.com``."""


def identities_for(repository: S3Repository | None, operator_namespace: str) -> TenantIdentities | None:
    """The namespace identities of the default repository, unless it is declared ``Shared`` (or there is none)."""
    if repository is None or getattr(repository, "tenant_isolation", "IAMUser") == "Shared":
        return None
    endpoint = getattr(repository, "iam_endpoint", None) or repository.endpoint
    return TenantIdentities(endpoint, repository.bucket, repository.path, operator_namespace,
                            repository.region or "us-east-1")  # fmt: skip


def load_repository(path: Path) -> DefaultRepository:
    """The platform's default repository from a YAML file holding the fields of ``backup.repository.s3`` (plus
    ``tenantIsolation``, ``iamEndpoint``); ValueError with a short reason."""
    try:
        return DefaultRepository.model_validate(yaml.safe_load(path.read_text()) or {})
    except yaml.YAMLError as exc:
        raise ValueError(f"{path} is not YAML: {exc}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise ValueError(f"{path}: {where}: {first['msg']}") from None


class EndpointNotAllowed(str):
    """Why a repository cannot be used: its endpoint is not in the operator's allow-list. A ``str`` equal to the
    reason, as the other :data:`Unresolved` values are, that also names the endpoint for the message."""

    endpoint: str

    def __new__(cls, endpoint: str) -> EndpointNotAllowed:
        reason = super().__new__(cls, "EndpointNotAllowed")
        reason.endpoint = endpoint
        return reason

    def message(self, field_path: str) -> str:
        return (f"{field_path} {self.endpoint} is not an endpoint this operator may call (SSRF guard): the platform "
                "allows only those given with kanri run --allowed-backup-endpoint (Helm value "
                "backup.allowedEndpoints); name one of them, or ask the platform team to add this one")  # fmt: skip


class ForeignFolder(str):
    """Why a repository cannot be used: it names the platform's default repository outside the namespace's own folder
    (another namespace's backups). A ``str`` equal to the reason, as :class:`EndpointNotAllowed`."""

    path: str
    own: str

    def __new__(cls, path: str, own: str) -> ForeignFolder:
        reason = super().__new__(cls, "ForeignRepositoryFolder")
        reason.path, reason.own = path, own
        return reason

    def message(self, field_path: str) -> str:
        return (f"{field_path} names the platform's default repository at path {self.path or '/'!r}, outside this "
                f"namespace's folder {self.own!r}: a namespace may use only its own folder of the default repository "
                "(and the store refuses its keys anywhere else); name a path under it, or leave the repository out "
                "to use the default")  # fmt: skip


Unresolved = Literal["NoRepository", "VolumeRepositoryNotSupported"] | EndpointNotAllowed | ForeignFolder


def foreign_folder(named: S3Repository, namespace: str, settings: BackupSettings) -> ForeignFolder | None:
    """A repository a cluster names itself that is the platform's default repository (same endpoint and bucket) but
    outside ``namespace``'s folder: refused with a clear reason before the store refuses the keys. (A different
    spelling of the same endpoint passes this check and is then refused by the store's access control.)"""
    default = settings.default_repository
    if default is None or settings.identities is None:
        return None
    if _origin(named.endpoint) != _origin(default.endpoint) or named.bucket != default.bucket:
        return None
    own = folder(default.path, namespace)
    return None if inside(own, named.path) else ForeignFolder((named.path or "").strip("/"), own)


def _origin(url: str) -> tuple[str, str, int | None]:
    """Scheme, lower-case host and port (the scheme's default when absent) of ``url``; ``//host:port`` has no
    scheme and no default port."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        port = -1  # an invalid port matches nothing
    return scheme, (parts.hostname or "").lower(), port or {"http": 80, "https": 443}.get(scheme)


def endpoint_allowed(endpoint: str, settings: BackupSettings) -> bool:
    """Whether a cluster may name ``endpoint``: the allow-list is empty, or the endpoint is the default
    repository's, or an entry matches (a URL: same scheme, host and port; ``host`` or ``host:port``: same host, and
    port when given). Exact host names only: no wildcard, so a look-alike host never passes."""
    if not settings.allowed_endpoints:
        return True
    scheme, host, port = _origin(endpoint)
    if not host:
        return False
    allowed = list(settings.allowed_endpoints)
    if settings.default_repository is not None:
        allowed.append(settings.default_repository.endpoint)
    for entry in allowed:
        if "://" in entry:
            if _origin(entry) == (scheme, host, port):
                return True
            continue
        _, name, wanted = _origin(f"//{entry}")
        if name == host and wanted in (None, port):
            return True
    return False


def resolve(spec: PostgresClusterSpec, namespace: str, settings: BackupSettings) -> Repository | Unresolved | None:
    """The cluster's repository: its own (wins), else the platform default; a reason when there is none it can use
    (its own names an endpoint outside the operator's allow-list: :class:`EndpointNotAllowed`); None when the
    cluster asks for no backups."""
    if spec.backup is None:
        return None
    own = spec.backup.repository
    if own is not None:
        if own.s3 is None:
            return "VolumeRepositoryNotSupported"
        if not endpoint_allowed(own.s3.endpoint, settings):
            return EndpointNotAllowed(own.s3.endpoint)
        if foreign := foreign_folder(own.s3, namespace, settings):
            return foreign
        return Repository(own.s3, namespace, default=False)
    if settings.default_repository is None:
        return "NoRepository"
    return Repository(settings.default_repository, settings.default_namespace, default=True, tenant=namespace)


def server_name(cluster: Obj) -> str:
    """Where in the repository this cluster's current PostgreSQL system archives: ``status.backup.serverName``,
    else the cluster's name (the system it was created with)."""
    recorded = ((cluster.get("status") or {}).get("backup") or {}).get("serverName")
    return str(recorded) if recorded else str(cluster["metadata"]["name"])


def upgraded_server_name(cluster: str, major: int) -> str:
    """The server name of the system a major upgrade to ``major`` makes (``<cluster>.pg<major>``).

    pg_upgrade makes a new system (its own identifier, timeline 1 again): archived under the old name its timeline
    history files would overwrite the old system's, and a recovery of a pre-upgrade backup following the latest
    timeline would step into the new system's WAL. A first system's server name has no dot (the instance refuses
    one: a cluster named so could not name its Services either), so this name is never another cluster's."""
    return f"{cluster}.pg{major}"


def archive_target(repository: Repository | Unresolved | None, server: str) -> Obj | None:
    """The ``archive`` entry of ``instance.json`` (:class:`kanri.contract.instance_config.ArchiveTarget`, as the
    contract serialises it); ``server`` is :func:`server_name`."""
    if not isinstance(repository, Repository):
        return None
    # constructed, not validated: a repository the instance would refuse is refused there, as before, not raised here
    target = ArchiveTarget.model_construct(destination=repository.destination, endpoint=repository.s3.endpoint,
                                           server_name=server, region=repository.s3.region or None)  # fmt: skip
    return target.model_dump(mode="json", by_alias=True)


@dataclass(frozen=True)
class Archiving:
    """What :func:`decide` concluded: the condition, and the last archived WAL to record (None: keep)."""

    ok: bool
    reason: str
    message: str
    last_wal: str | None = None
    last_time: str | None = None


def _newer(failed: str | None, archived: str | None) -> bool:
    if failed is None:
        return False
    if archived is None:
        return True
    return parse_time(failed) > parse_time(archived)


def decide(
    repository: Repository | Unresolved | None,
    cluster: str,
    primary: InstanceReport | None,
    credentials: KeysProblem | None,
) -> Archiving | None:
    """The ContinuousArchiving condition from the repository, the primary's report and the credentials problem
    (None: the key Secret was copied). None when the cluster asks for no backups (no condition at all)."""
    if repository is None:
        return None
    if repository == "NoRepository":
        return Archiving(False, "NoRepository", "spec.backup is set but there is no repository: neither "
                         "spec.backup.repository nor a platform default (kanri run --default-backup-repository); "
                         "no WAL is archived")  # fmt: skip
    if repository == "VolumeRepositoryNotSupported":
        return Archiving(False, "VolumeRepositoryNotSupported", "backup.repository.volume is not implemented by this "
                         "operator version; use backup.repository.s3 or the platform default")  # fmt: skip
    if isinstance(repository, EndpointNotAllowed):
        return Archiving(False, "EndpointNotAllowed", repository.message("spec.backup.repository.s3.endpoint") +
                         "; no WAL is archived")  # fmt: skip
    if isinstance(repository, ForeignFolder):
        return Archiving(False, "ForeignRepositoryFolder", repository.message("spec.backup.repository.s3") +
                         "; no WAL is archived")  # fmt: skip
    if credentials is not None:
        return Archiving(False, credentials.reason, credentials.message)
    where = repository.describe(cluster)
    archiver = primary.archiver if primary is not None else None
    if primary is None or archiver is None:
        return Archiving(False, "WaitingForPrimary", f"no primary reports its archiver yet; WAL goes to {where}")
    if archiver.mode != "on":
        return Archiving(False, "Starting", f"archive_mode is {archiver.mode!r} on {primary.name} until it "
                         "restarts with archiving on")  # fmt: skip
    wal, when = archiver.last_archived_wal, archiver.last_archived_time
    if _newer(archiver.last_failed_time, when):
        return Archiving(False, "ArchiveFailing", f"{primary.name} cannot archive {archiver.last_failed_wal} to "
                         f"{where} (WAL is kept in pg_wal until it succeeds); see the "
                         "instance's log", wal, when)  # fmt: skip
    if wal is None:
        return Archiving(True, "Archiving", f"archiving to {where}; no WAL file finished yet")
    return Archiving(True, "Archiving", f"archiving to {where}; last {wal}", wal, when)


# --- executor ----------------------------------------------------------------------------------------------------


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _value(secret: Obj, key: str) -> str | None:
    raw = (secret.get("data") or {}).get(key)
    return base64.b64decode(raw).decode() if isinstance(raw, str) and raw else None


@dataclass(frozen=True)
class KeysProblem:
    """Why a cluster's pods cannot get a key pair for its repository (names only, never a value)."""

    reason: str
    message: str


async def repository_keys(client: Client, cache: Cache, repository: Repository, identities: TenantIdentities | None,
                          namespace: str) -> S3Keys | KeysProblem:  # fmt: skip
    """The key pair the pods of a cluster in ``namespace`` get for ``repository``: for the platform's default
    repository its namespace's own identity (the platform's keys never leave the operator's namespace), else the
    repository's own Secret's; or the problem."""
    keys = await source_keys(client, cache, repository)
    if isinstance(keys, KeysProblem) or not repository.default or identities is None:
        return keys
    try:
        return await identities.keys(client, cache, keys, namespace)
    except IamError as exc:
        return KeysProblem("TenantIdentityFailing", f"cannot give namespace {namespace} its own identity in the "
                           f"default repository through the store's IAM API ({exc}); its pods get no keys until "
                           "then (the platform's keys are never handed out)")  # fmt: skip
    except ApiError as exc:
        return KeysProblem("TenantIdentityFailing", f"cannot keep namespace {namespace}'s backup identity in the "
                           f"operator's namespace: {exc.status} {exc.reason}")  # fmt: skip


async def source_keys(client: Client, cache: Cache, repository: Repository) -> S3Keys | KeysProblem:
    """The repository's own key pair, read from its Secret (the cache first, then the API); or the problem (names
    only). The operator's own jobs (deleting a cluster's backups) use it as it is; a cluster's pods get
    :func:`repository_keys`."""
    ref = repository.s3.credentials_secret
    where = f"Secret {repository.secret_namespace}/{ref.name}"
    source = cache.get(SECRET, ref.name, repository.secret_namespace)
    if source is None:
        try:
            source = await client.get(SECRET, ref.name, repository.secret_namespace)
        except ApiError as exc:
            if exc.not_found:
                return KeysProblem("CredentialsMissing", f"{where} (the repository's credentials) does not exist")
            return KeysProblem("CredentialsMissing", f"{where} cannot be read: {exc.status}")
    access, secret = _value(source, ref.access_key_id_key), _value(source, ref.secret_access_key_key)
    if access is None or secret is None:
        missing = ref.access_key_id_key if access is None else ref.secret_access_key_key
        return KeysProblem("CredentialsMissing", f"{where} has no key {missing!r}")
    return S3Keys(access, secret)


async def ensure_credentials(step: Pass, repository: Repository | Unresolved | None) -> KeysProblem | None:
    """Put the key pair the cluster's pods use (:func:`repository_keys`) into ``<cluster>-backup-credentials``; the
    problem or None when written or not needed."""
    if not isinstance(repository, Repository):
        return None
    return await write_keys(step, repository, names.backup_secret(step.name))


async def write_keys(step: Pass, repository: Repository, secret: str) -> KeysProblem | None:
    """Apply the key pair the cluster's pods get for ``repository`` (:func:`repository_keys`) as the cluster's Secret
    ``secret`` (the files :mod:`kanri.contract.backup` names); the problem, or None when it is written. Archiving
    writes ``<cluster>-backup-credentials`` with it, a recovery ``<cluster>-recovery-credentials``."""
    keys = await repository_keys(step.client, step.cache, repository, step.backup_settings.identities, step.namespace)
    if isinstance(keys, KeysProblem):
        return keys
    meta = child_meta(step.cluster, secret, cluster_labels(step.name))
    data = {ACCESS_KEY_FILE: _b64(keys.access_key_id), SECRET_KEY_FILE: _b64(keys.secret_access_key)}
    await step.apply(SECRET, owned("v1", "Secret", meta, type="Opaque", data=data))
    return None


async def report(step: Pass, settings: BackupSettings, verdict: Archiving | None) -> None:
    """Write the condition and ``status.backup``'s archive fields when they changed (re-reading the cluster first:
    the status step of this pass may have written conditions), send an Event when the condition flips, set the
    metrics."""
    key = (step.namespace, step.name)
    if settings.metrics is not None:
        if verdict is None:
            for gauge in (settings.metrics.failing, settings.metrics.last_archived):
                with contextlib.suppress(KeyError):  # never set for this cluster
                    gauge.remove(*key)
        else:
            settings.metrics.failing.labels(*key).set(0 if verdict.ok else 1)
            if verdict.last_time is not None:
                settings.metrics.last_archived.labels(*key).set(parse_time(verdict.last_time).timestamp())
    generation = int(step.cluster["metadata"].get("generation", 0))
    old_condition = get_condition(step.status.get("conditions") or [], CONDITION)
    backup = step.status.get("backup") or {}
    wanted = dict(backup)
    if verdict is not None and verdict.last_wal is not None:
        wanted.update(lastArchivedWAL=verdict.last_wal, lastArchivedTime=verdict.last_time)
    if wanted == backup and _same(old_condition, verdict, generation):
        return  # converged: no write
    # A merge patch replaces the whole conditions list: start from the object as it is now.
    fresh = await step.client.get(POSTGRES_CLUSTER, step.name, step.namespace)
    conditions = copy.deepcopy((fresh.get("status") or {}).get("conditions") or [])
    if verdict is None:
        remove_condition(conditions, CONDITION)
    else:
        set_condition(conditions, type=CONDITION, status=verdict.ok, reason=verdict.reason, message=verdict.message,
                      observed_generation=generation)  # fmt: skip
    patch: Obj = {"conditions": conditions}
    if wanted != backup:
        patch["backup"] = {k: wanted[k] for k in ("lastArchivedWAL", "lastArchivedTime")}
    await step.client.patch_status(POSTGRES_CLUSTER, step.name, {"status": patch}, step.namespace)
    if verdict is None or (old_condition is not None and old_condition.get("reason") == verdict.reason):
        return
    log.info("archiving condition changed", cluster=step.name, namespace=step.namespace, ok=verdict.ok,
             reason=verdict.reason)  # fmt: skip
    if verdict.ok:
        await step.events.normal(step.cluster, "ArchivingWorks", verdict.message)
    else:
        await step.events.warning(step.cluster, verdict.reason, verdict.message)


def _same(condition: Obj | None, verdict: Archiving | None, generation: int) -> bool:
    if verdict is None or condition is None:
        return verdict is None and condition is None
    return (
        condition.get("status") == ("True" if verdict.ok else "False")
        and condition.get("reason") == verdict.reason
        and condition.get("message") == verdict.message
        and condition.get("observedGeneration") == generation
    )
