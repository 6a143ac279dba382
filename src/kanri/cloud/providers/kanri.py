"""The kanri provider: the "cloud database" is a PostgresCluster run by kanri's own PostgreSQL operator in this
Kubernetes cluster, so the DatabaseInstance that asks RDS for a database in the cloud asks for the same on a laptop.

It speaks to the Kubernetes API only (kanri.runtime's Client) and writes the PostgresCluster as a plain dict: one
operator never imports another (the import-linter contract), so the fields come from the PostgresCluster's published
API (docs/postgrescluster.md, deploy/crds). The external ID is ``<namespace>/<name>``; the endpoint is the cluster's
``-rw`` Service; the credentials are the ``<name>-app`` Secret the PostgreSQL operator generates (its own password,
not the one the cloud operator offers).

Like RDS it is asynchronous: a create or modify is a write of the PostgresCluster's spec, and the state is read back
from its status (``phase``, ``observedGeneration``). Deletion follows RDS's rules: Retain (``release``) lets the
cluster go and leaves it running; Delete with a final snapshot first takes a PostgresBackup, and only once that
completed deletes the cluster. The final backup outlives the cluster as an RDS final snapshot outlives its instance:
the cluster is deleted under its ``deletionPolicy: Retain`` (which keeps the backup repository) and its instances'
volumes are deleted by name, so the data goes and the backup stays.
"""

from __future__ import annotations

import hashlib
import math
import re
from base64 import b64decode
from collections.abc import Awaitable, Mapping
from datetime import UTC, datetime
from typing import Any, TypeVar

from kanri.cloud.api import KanriProfile
from kanri.cloud.names import LABELS
from kanri.cloud.providers.base import (
    Capabilities,
    Connection,
    Desired,
    Observed,
    Operation,
    ProviderSetup,
    Retryable,
    Throttled,
    UserMustFix,
)
from kanri.runtime import ApiError, Client, Kind, parse_quantity
from kanri.runtime.kinds import PVC, SECRET

__all__ = ["CAPABILITIES", "POSTGRES_BACKUP", "POSTGRES_CLUSTER", "KanriProvider", "cluster_name", "provider"]

# The PostgreSQL operator's kinds, by their published API (not imported from kanri.postgres: no operator imports
# another).
POSTGRES_CLUSTER = Kind("kanri.dev/v1alpha1", "PostgresCluster", "postgresclusters")
POSTGRES_BACKUP = Kind("kanri.dev/v1alpha1", "PostgresBackup", "postgresbackups")
_PG_CLUSTER_LABEL = "kanri.dev/cluster"
_PG_INSTANCE_LABEL = "kanri.dev/instance"

OWNER_LABEL = LABELS.key("owner-uid")
"""The DatabaseInstance's uid on the PostgresCluster: the proof it is ours (removed when it is let go)."""
FINAL_BACKUP = LABELS.key("final-backup")
"""The PostgresBackup a Delete waits for before the cluster goes (an annotation on the cluster)."""
RELEASED = LABELS.key("released-from")
"""Set when a Retain let the cluster go: which DatabaseInstance it was made for."""
FOR_INSTANCE = LABELS.key("for")

CAPABILITIES = Capabilities(
    # network.access Public: a PostgresCluster has only ClusterIP Services (no address outside the cluster);
    # network.allowedCidrs: it has its own NetworkPolicy, not one per client range; maintenanceWindow: it applies
    # changes when they are made (a rolling restart, a switchover), there is no window to wait for.
    fields=frozenset(
        {
            "engine",
            "version",
            "size",
            "storage",
            "region",
            "backupRetentionDays",
            "highAvailability",
            "finalSnapshot",
            "adoptExternalId",
        }
    ),
    extension_fields=frozenset({"instances", "storageClassName"}),
    # A major upgrade restarts on the new major; new requests restart each instance (the primary after a switchover).
    downtime_fields=frozenset({"version", "size"}),
    immutable_fields=frozenset({"engine", "region", "providers.kanri.storageClassName"}),
)

_NAME_LIMIT = 40  # a PostgresCluster's name: a DNS-1035 label of at most 40 characters (its children add suffixes)
_NOT_ALLOWED = re.compile(r"[^a-z0-9-]+")
_GIB = 1 << 30
_PORT = 5432
_DEFAULT_DATABASE = _DEFAULT_OWNER = "app"
T = TypeVar("T")

Obj = dict[str, Any]


def cluster_name(namespace: str, name: str, *, shared_namespace: bool) -> str:
    """The PostgresCluster's name for a DatabaseInstance: its own name when the cluster goes into the instance's
    namespace, ``<namespace>-<name>`` in a shared one; a DNS-1035 label, cut to 40 characters with a hash of the full
    name when too long (two instances never share a cluster)."""
    base = f"{namespace}-{name}" if shared_namespace else name
    clean = re.sub(r"-{2,}", "-", _NOT_ALLOWED.sub("-", base.lower())).strip("-")
    if not clean or not clean[0].isalpha():
        clean = f"db-{clean}".rstrip("-")
    if len(clean) <= _NAME_LIMIT and clean == base:
        return clean
    digest = hashlib.sha256(f"{namespace}/{name}".encode()).hexdigest()[:8]
    return f"{clean[: _NAME_LIMIT - len(digest) - 1].rstrip('-')}-{digest}"


def size_text(cpu: str, memory: str) -> str:
    """The provider's own size: the requests of each instance (compared as text with ``Observed.size``)."""
    return f"cpu={cpu},memory={memory}"


def instances_for(desired: Desired) -> int:
    """How many instances (primary + replicas): the extension's count, else 2 with highAvailability, else 1."""
    count = desired.extension.get("instances")
    want_ha = desired.high_availability
    if count is None:
        return 2 if want_ha else 1
    if (int(count) >= 2) != want_ha:
        raise UserMustFix(f"providers.kanri.instances {count} contradicts highAvailability {str(want_ha).lower()} "
                          "(a standby needs at least 2 instances)", field="providers.kanri.instances",
                          reason="Contradiction")  # fmt: skip
    return int(count)


def backup_spec(days: int) -> Obj | None:
    """``spec.backup``: retention in days into the platform's default repository; None turns backups off (0 days)."""
    return {"retentionDays": days} if days > 0 else None


def manifest(desired: Desired, name: str, namespace: str, requests: Mapping[str, str], storage_class: str | None) \
        -> Obj:  # fmt: skip
    """The PostgresCluster a create writes."""
    storage: Obj = {"size": f"{desired.storage_gib}Gi"}
    if storage_class:
        storage["storageClassName"] = storage_class
    spec: Obj = {
        "version": desired.version,
        "replicas": instances_for(desired),
        "storage": storage,
        "resources": {"requests": dict(requests)},
        # The cluster's own policy stays Retain: deleting the PostgresCluster by hand never deletes data; a Delete
        # of the DatabaseInstance goes through this provider's delete.
        "deletionPolicy": "Retain",
        "bootstrap": {"initdb": {"database": _DEFAULT_DATABASE, "owner": _DEFAULT_OWNER}},
    }
    backup = backup_spec(desired.backup_retention_days)
    if backup is not None:
        spec["backup"] = backup
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {OWNER_LABEL: desired.owner_uid},
            "annotations": {FOR_INSTANCE: f"{desired.namespace}/{desired.name}"},
        },
        "spec": spec,
    }


def modify_patch(desired: Desired, fields: tuple[str, ...], requests: Mapping[str, str]) -> Obj:
    """The merge patch of the PostgresCluster's spec for exactly ``fields``."""
    spec: Obj = {}
    for field in fields:
        if field == "version":
            # The cloud operator planned and approved the downtime already: the cluster's own approval follows it.
            spec |= {"version": desired.version, "upgrade": {"approvedVersion": desired.version}}
        elif field == "size":
            spec["resources"] = {"requests": dict(requests)}
        elif field == "storage":
            spec["storage"] = {"size": f"{desired.storage_gib}Gi"}
        elif field == "backupRetentionDays":
            spec["backup"] = backup_spec(desired.backup_retention_days)
        elif field in ("highAvailability", "providers.kanri.instances"):
            spec["replicas"] = instances_for(desired)
        else:
            raise UserMustFix(f"the kanri provider cannot change {field}", field=field, reason="Unsupported")
    return {"spec": spec}


def state_of(cluster: Obj, final_backup_phase: str | None) -> str:
    """The PostgresCluster's state in RDS's words (creating, available, modifying, backing-up, deleting, ...)."""
    meta, status = cluster.get("metadata") or {}, cluster.get("status") or {}
    if meta.get("deletionTimestamp"):
        return "deleting"
    if final_backup_phase in ("Pending", "Running"):
        # The final backup of a Delete runs. Completed, Failed or Missing read as the cluster's own state, so the
        # cloud operator calls delete again: it goes on, names the failure, or asks for the backup again.
        return "backing-up"
    phase = status.get("phase") or "Pending"
    if status.get("observedGeneration") != meta.get("generation") and phase != "Pending":
        return "modifying"  # a spec change the operator has not acted on yet
    return {
        "Pending": "creating",
        "Provisioning": "creating",
        "Ready": "available",
        "Scaling": "modifying",
        "Upgrading": "modifying",
        "FailingOver": "failing-over",
        # a planned switchover (a rolling update, a promote): a short write pause, as an RDS change being applied
        "SwitchingOver": "modifying",
        "Hibernated": "stopped",
        "Deleting": "deleting",
    }.get(phase, phase.lower())


def running_major(cluster: Obj) -> int:
    """The major the cluster runs: the upgrade's ``from`` while one is not done, else ``spec.version``."""
    upgrade = (cluster.get("status") or {}).get("upgrade") or {}
    if upgrade.get("from") is not None and upgrade.get("phase") not in (None, "Succeeded"):
        return int(upgrade["from"])
    return int(cluster["spec"]["version"])


def observed_from(cluster: Obj, final_backup_phase: str | None = None) -> Observed:
    """A PostgresCluster read as the common fields."""
    meta, spec = cluster["metadata"], cluster.get("spec") or {}
    requests = (spec.get("resources") or {}).get("requests") or {}
    initdb = (spec.get("bootstrap") or {}).get("initdb") or {}
    storage = spec.get("storage") or {}
    extension: Obj = {"instances": int(spec.get("replicas", 1))}
    if storage.get("storageClassName"):
        extension["storageClassName"] = storage["storageClassName"]
    size = size_text(requests["cpu"], requests["memory"]) if "cpu" in requests and "memory" in requests else None
    return Observed(
        external_id=f"{meta['namespace']}/{meta['name']}",
        state=state_of(cluster, final_backup_phase),
        owner_uid=(meta.get("labels") or {}).get(OWNER_LABEL),
        host=f"{meta['name']}-rw.{meta['namespace']}.svc",
        port=_PORT,
        engine="postgres",
        engine_version=str(running_major(cluster)),
        size=size,
        storage_gib=math.ceil(parse_quantity(storage["size"]) / _GIB) if storage.get("size") else None,
        public=None,  # never public (ClusterIP only) and not compared: Public is reported Unsupported instead
        backup_retention_days=int((spec.get("backup") or {}).get("retentionDays", 0)),
        high_availability=int(spec.get("replicas", 1)) >= 2,
        extension=extension,
        username=initdb.get("owner", _DEFAULT_OWNER),
        dbname=initdb.get("database", _DEFAULT_DATABASE),
    )


def _classify(error: ApiError, action: str) -> Exception:
    """A Kubernetes API error in the Provider's terms."""
    if error.status == 429:
        return Throttled(f"{action}: the Kubernetes API throttles: {error.message}", action=action)
    if error.transient or error.conflict:
        return Retryable(f"{action}: {error.status} {error.reason}: {error.message}", action=action)
    if error.not_found and "the server could not find the requested resource" in error.message:
        return UserMustFix(f"{action}: the PostgresCluster API is not installed (kanri's PostgreSQL operator)",
                           reason="PostgresOperatorMissing", action=action)  # fmt: skip
    return UserMustFix(f"{action}: {error.status} {error.reason}: {error.message}", reason=error.reason,
                       action=action)  # fmt: skip


async def _api(action: str, call: Awaitable[T]) -> T:
    try:
        return await call
    except ApiError as error:
        raise _classify(error, action) from None


class KanriProvider:
    """PostgresClusters in one Kubernetes cluster, placed as one DatabaseClass's kanri profile says."""

    name = "kanri"

    def __init__(self, client: Client, profile: KanriProfile) -> None:
        self._client = client
        self.profile = profile

    def __repr__(self) -> str:
        return f"KanriProvider(namespace={self.profile.namespace!r}, region={self.profile.region!r})"

    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def budget_key(self) -> str:
        # One Kubernetes API: every class of this provider shares it (its own limits are the API server's).
        return f"kanri:{self.profile.region}"

    def _requests(self, desired: Desired) -> dict[str, str]:
        size = self.profile.sizes.get(desired.size)
        if size is None:
            known = ", ".join(sorted(self.profile.sizes))
            raise UserMustFix(f"size {desired.size!r} is not defined by the class (it defines {known})",
                              field="size", reason="UnknownSize")  # fmt: skip
        return {"cpu": str(size.cpu), "memory": str(size.memory)}

    def size_for(self, desired: Desired) -> str:
        requests = self._requests(desired)
        return size_text(requests["cpu"], requests["memory"])

    def locate(self, desired: Desired) -> tuple[str, str]:
        """(namespace, name) of the cluster ``desired`` asks for: the adopted ``<namespace>/<name>``, else derived."""
        if "/" in desired.identifier:
            return split_id(desired.identifier)
        namespace = self.profile.namespace or desired.namespace
        shared = self.profile.namespace is not None
        return namespace, cluster_name(desired.namespace, desired.name, shared_namespace=shared)

    async def _read(self, namespace: str, name: str) -> Obj | None:
        try:
            found: Obj = await self._client.get(POSTGRES_CLUSTER, name, namespace)
        except ApiError as error:
            if error.not_found and "could not find the requested resource" not in error.message:
                return None
            raise _classify(error, "get PostgresCluster") from None
        return found

    async def _backup_phase(self, cluster: Obj) -> str | None:
        """The phase of the final backup a Delete asked for ("Missing" when its object is gone), None if none."""
        backup = (cluster["metadata"].get("annotations") or {}).get(FINAL_BACKUP)
        if not backup:
            return None
        try:
            found = await self._client.get(POSTGRES_BACKUP, backup, cluster["metadata"]["namespace"])
        except ApiError as error:
            if error.not_found:
                return "Missing"
            raise _classify(error, "get PostgresBackup") from None
        return str((found.get("status") or {}).get("phase") or "Pending")

    async def _observe(self, namespace: str, name: str) -> Observed | None:
        cluster = await self._read(namespace, name)
        if cluster is None:
            return None
        return observed_from(cluster, await self._backup_phase(cluster))

    async def find(self, desired: Desired) -> Observed | None:
        return await self._observe(*self.locate(desired))

    async def describe(self, external_id: str) -> Observed | None:
        return await self._observe(*split_id(external_id))

    async def create(self, desired: Desired, token: str, password: str) -> Operation:
        """Writes the PostgresCluster (``password`` unused: the PostgreSQL operator generates the app's own)."""
        namespace, name = self.locate(desired)
        storage_class = desired.extension.get("storageClassName") or self.profile.storage_class_name
        body = manifest(desired, name, namespace, self._requests(desired), storage_class)
        try:
            await self._client.create(POSTGRES_CLUSTER, body)
        except ApiError as error:
            if not error.already_exists:
                raise _classify(error, "create PostgresCluster") from None
            # A create already made (the operator died before recording it): ours when it carries our uid.
            found = await self._read(namespace, name)
            if found is None or (found["metadata"].get("labels") or {}).get(OWNER_LABEL) != desired.owner_uid:
                raise UserMustFix(f"a PostgresCluster {namespace}/{name} exists that was not created for this "
                                  "DatabaseInstance (adopt it with spec.adoptExternalId)", reason="NameTaken",
                                  action="create PostgresCluster") from None  # fmt: skip
        return Operation("Create", token, "available", datetime.now(UTC))

    async def modify(self, external_id: str, desired: Desired, fields: tuple[str, ...], *, immediately: bool) \
            -> Operation:  # fmt: skip
        """Patches exactly ``fields``. There is no maintenance window: ``immediately=False`` applies now too (the
        cloud operator holds downtime changes for an approval instead; maintenanceWindow is Unsupported here)."""
        namespace, name = split_id(external_id) if "/" in external_id else self.locate(desired)
        patch = modify_patch(desired, fields, self._requests(desired))
        updated = await _api("patch PostgresCluster", self._client.patch(POSTGRES_CLUSTER, name, patch, namespace))
        generation = updated["metadata"].get("generation")
        return Operation("Modify", f"{namespace}/{name}@{generation}", "available", datetime.now(UTC), fields)

    async def delete(self, external_id: str, final_snapshot_id: str | None) -> Operation:
        """Without a final snapshot: the cluster goes with its volumes and backups (its deletionPolicy Delete). With
        one: a PostgresBackup first; called again once it completed (the state reads ``available`` again), the
        cluster goes under Retain and its instances' volumes are deleted, so the final backup stays."""
        namespace, name = split_id(external_id)
        operation = Operation("Delete", final_snapshot_id or f"delete-{namespace}-{name}", "deleted", datetime.now(UTC))
        cluster = await self._read(namespace, name)
        if cluster is None or cluster["metadata"].get("deletionTimestamp"):
            return operation
        if final_snapshot_id is None:
            await self._delete_cluster(namespace, name, "Delete")
            return operation
        phase = await self._final_backup(cluster, final_snapshot_id)
        if phase == "Failed":
            raise UserMustFix(f"the final backup {final_snapshot_id} of {external_id} failed: the cluster is kept "
                              "(see the PostgresBackup's status)", field="finalSnapshot", reason="FinalBackupFailed",
                              action="delete PostgresCluster")  # fmt: skip
        if phase == "Completed":
            await self._delete_cluster(namespace, name, "Retain")
            await self._delete_instance_volumes(namespace, name)
        return operation

    async def _final_backup(self, cluster: Obj, backup: str) -> str:
        """Asks for the final backup (idempotent: the cluster names it, the object's name is fixed); its phase."""
        meta = cluster["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        if not (cluster.get("spec") or {}).get("backup"):
            raise UserMustFix(f"{namespace}/{name} has no backups (backupRetentionDays 0): no final backup can be "
                              "taken; set finalSnapshot false to delete without one", field="finalSnapshot",
                              reason="NoBackupConfigured", action="delete PostgresCluster")  # fmt: skip
        if (meta.get("annotations") or {}).get(FINAL_BACKUP) != backup:
            patch = {"metadata": {"annotations": {FINAL_BACKUP: backup}}}
            await _api("annotate PostgresCluster", self._client.patch(POSTGRES_CLUSTER, name, patch, namespace))
        body = {"metadata": {"name": backup, "namespace": namespace, "labels": {FOR_INSTANCE: name}},
                "spec": {"cluster": name}}  # fmt: skip
        try:
            found = await self._client.create(POSTGRES_BACKUP, body)
        except ApiError as error:
            if not error.already_exists:
                raise _classify(error, "create PostgresBackup") from None
            found = await _api("get PostgresBackup", self._client.get(POSTGRES_BACKUP, backup, namespace))
        return str((found.get("status") or {}).get("phase") or "Pending")

    async def _delete_cluster(self, namespace: str, name: str, policy: str) -> None:
        patch = {"spec": {"deletionPolicy": policy}}
        await _api("patch PostgresCluster", self._client.patch(POSTGRES_CLUSTER, name, patch, namespace))
        await _api("delete PostgresCluster", self._client.delete(POSTGRES_CLUSTER, name, namespace))

    async def _delete_instance_volumes(self, namespace: str, name: str) -> None:
        """The instances' data claims (not the backups'): each held by its pod until the pod is gone."""
        selector = f"{_PG_CLUSTER_LABEL}={name},{_PG_INSTANCE_LABEL},app.kubernetes.io/name=postgresql"
        claims, _ = await _api("list PVCs", self._client.list(PVC, namespace, label_selector=selector))
        for claim in claims:
            await _api("delete PVC", self._client.delete(PVC, claim["metadata"]["name"], namespace))

    async def release(self, external_id: str) -> None:
        """Retain: the cluster keeps running and is no longer ours (the uid label goes; a note says whose it was)."""
        namespace, name = split_id(external_id)
        cluster = await self._read(namespace, name)
        if cluster is None:
            return
        owner = (cluster["metadata"].get("annotations") or {}).get(FOR_INSTANCE, "")
        patch = {"metadata": {"labels": {OWNER_LABEL: None}, "ownerReferences": None,
                              "annotations": {RELEASED: owner, FINAL_BACKUP: None}}}  # fmt: skip
        await _api("release PostgresCluster", self._client.patch(POSTGRES_CLUSTER, name, patch, namespace))

    async def connection(self, observed: Observed, password: str | None) -> Connection | None:
        """From the ``<name>-app`` Secret (the ``<name>-ca`` CA when the cluster has one); None until they exist."""
        namespace, name = split_id(observed.external_id)
        app = await self._secret(namespace, f"{name}-app")
        if app is None or "password" not in app or not observed.host:
            return None
        ca = await self._secret(namespace, f"{name}-ca")
        return Connection(host=observed.host, port=observed.port or _PORT, dbname=observed.dbname or _DEFAULT_DATABASE,
                          username=app.get("username") or observed.username or _DEFAULT_OWNER,
                          password=app["password"], ca_pem=(ca or {}).get("ca.crt"))  # fmt: skip

    async def _secret(self, namespace: str, name: str) -> dict[str, str] | None:
        try:
            secret = await self._client.get(SECRET, name, namespace)
        except ApiError as error:
            if error.not_found:
                return None
            raise _classify(error, "get Secret") from None
        return {key: b64decode(value).decode() for key, value in (secret.get("data") or {}).items()}


def split_id(external_id: str) -> tuple[str, str]:
    """``<namespace>/<name>`` -> (namespace, name)."""
    namespace, slash, name = external_id.partition("/")
    if not slash or not namespace or not name:
        raise UserMustFix(f"{external_id!r} is not a kanri database ID (<namespace>/<PostgresCluster name>)",
                          field="adoptExternalId", reason="InvalidExternalId")  # fmt: skip
    return namespace, name


def provider(setup: ProviderSetup) -> KanriProvider:
    """The kanri provider a DatabaseClass configures (the registry's entry)."""
    profile = setup.spec.kanri
    if profile is None:
        raise UserMustFix(f"DatabaseClass {setup.class_name} has no kanri profile", reason="NoProfile")
    return KanriProvider(setup.client, profile)
