"""The first step of the version change: v1alpha1 and v1beta1 served, v1alpha1 still the storage version (the
default of ``KANRI_STORAGE_VERSION``, :mod:`kanri.postgres.versions.storage`).

docs/runtime-versions.md's release rule: a version is first *added* (served, the old storage version kept), and
storage switches only once every replica runs code that knows both versions. During a rolling upgrade from the
release before (v1alpha1 alone, no webhook), the old pods read and write v1alpha1, which needs no conversion while
v1alpha1 is the storage version; only readers of v1beta1 need the webhook the new pods serve.

``kanri.postgres.api.conversion`` holds the second step (v1beta1 the hub *and* the storage version,
``KANRI_STORAGE_VERSION=v1beta1``), whose storage migration rewrites every object in v1beta1. Here the same conversion
functions are registered on copies of each kind's models (PostgresCluster, PostgresBackup, PostgresPooler) whose only
difference is the ``storage`` flag, so the CRDs, the webhook's readiness self-test (it reads a stored object in each
*non-storage* version) and ``crd_for`` all agree on what the API server stores.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from kanri.postgres.api import v1beta1
from kanri.postgres.api.conversion import (
    PostgresBackupV1Alpha1,
    PostgresClusterV1Alpha1,
    PostgresPoolerV1Alpha1,
    backup_from_v1beta1,
    backup_to_v1beta1,
    cluster_from_v1beta1,
    cluster_to_v1beta1,
    pooler_from_v1beta1,
    pooler_to_v1beta1,
    resource_keywords,
)
from kanri.runtime import Conversion, Conversions, CustomResource, crd_for

__all__ = [
    "SERVED",
    "SERVED_BACKUPS",
    "SERVED_CLUSTERS",
    "SERVED_POOLERS",
    "STORAGE_VERSION",
    "ServedPostgresBackupV1Beta1",
    "ServedPostgresClusterV1Beta1",
    "ServedPostgresPoolerV1Beta1",
    "StoredPostgresBackupV1Alpha1",
    "StoredPostgresClusterV1Alpha1",
    "StoredPostgresPoolerV1Alpha1",
    "served_crds",
]

STORAGE_VERSION = "v1alpha1"
"""The version the API server stores PostgresClusters, PostgresBackups and PostgresPoolers in under this release."""

M = TypeVar("M", bound=CustomResource)
Obj = dict[str, Any]


def _keywords(model: type[CustomResource], *, storage: bool) -> dict[str, Any]:
    """``model``'s resource declaration as class keywords, with ``storage`` set."""
    return resource_keywords(model, storage=storage)


class StoredPostgresClusterV1Alpha1(PostgresClusterV1Alpha1, **_keywords(PostgresClusterV1Alpha1, storage=True)):
    """A PostgreSQL cluster managed by kanri (deprecated version: use kanri.dev/v1beta1)."""


class ServedPostgresClusterV1Beta1(v1beta1.PostgresCluster, **_keywords(v1beta1.PostgresCluster, storage=False)):
    """A PostgreSQL cluster managed by kanri: one primary, streaming replicas, their volumes and backups. The
    operator keeps pods, volumes, Services (<name>-rw for writes, <name>-ro for replicas, <name>-r for any) and
    backups in line with spec, and reports what it observes in status."""


class StoredPostgresBackupV1Alpha1(PostgresBackupV1Alpha1, **_keywords(PostgresBackupV1Alpha1, storage=True)):
    """A base backup of a PostgresCluster (deprecated version: use kanri.dev/v1beta1)."""


class ServedPostgresBackupV1Beta1(v1beta1.PostgresBackup, **_keywords(v1beta1.PostgresBackup, storage=False)):
    """A base backup of a PostgresCluster. Create one to back up on demand (kubectl get pgbackup lists them); the
    cluster's spec.backup.schedule creates them too (<cluster>-initial, then <cluster>-<yyyymmddhhmm>). A backup is
    never taken twice for one object, and never two at once per cluster. Together with the archived WAL it allows
    point-in-time recovery. The operator's own backups are owned by the cluster only under deletionPolicy Delete
    (they go with it, as the repository's content does); under Retain they outlive a deleted cluster. Each is
    removed when retention expires it."""


class StoredPostgresPoolerV1Alpha1(PostgresPoolerV1Alpha1, **_keywords(PostgresPoolerV1Alpha1, storage=True)):
    """PgBouncer in front of a PostgresCluster (deprecated version: use kanri.dev/v1beta1)."""


class ServedPostgresPoolerV1Beta1(v1beta1.PostgresPooler, **_keywords(v1beta1.PostgresPooler, storage=False)):
    """PgBouncer in front of a PostgresCluster: a Deployment of PgBouncer pods and a Service named after the pooler.
    Clients connect with TLS (a certificate from the cluster's CA) as the cluster's users with their own passwords;
    PgBouncer looks them up through a dedicated role and verifies the cluster's certificate (verify-full)."""


def _as(model: type[M], value: CustomResource) -> M:
    """``value`` re-validated as ``model``: the same version's data, declared with this release's storage flag."""
    return model.model_validate(value.model_dump(mode="json", by_alias=True, exclude_none=True))


def _cluster_up(old: StoredPostgresClusterV1Alpha1) -> ServedPostgresClusterV1Beta1:
    return _as(ServedPostgresClusterV1Beta1, cluster_to_v1beta1(old))


def _cluster_down(new: ServedPostgresClusterV1Beta1) -> StoredPostgresClusterV1Alpha1:
    return _as(StoredPostgresClusterV1Alpha1, cluster_from_v1beta1(new))


def _backup_up(old: StoredPostgresBackupV1Alpha1) -> ServedPostgresBackupV1Beta1:
    return _as(ServedPostgresBackupV1Beta1, backup_to_v1beta1(old))


def _backup_down(new: ServedPostgresBackupV1Beta1) -> StoredPostgresBackupV1Alpha1:
    return _as(StoredPostgresBackupV1Alpha1, backup_from_v1beta1(new))


def _pooler_up(old: StoredPostgresPoolerV1Alpha1) -> ServedPostgresPoolerV1Beta1:
    return _as(ServedPostgresPoolerV1Beta1, pooler_to_v1beta1(old))


def _pooler_down(new: ServedPostgresPoolerV1Beta1) -> StoredPostgresPoolerV1Alpha1:
    return _as(StoredPostgresPoolerV1Alpha1, pooler_from_v1beta1(new))


SERVED_CLUSTERS = Conversion(ServedPostgresClusterV1Beta1)
"""PostgresCluster as this release serves it: v1beta1 the hub (not stored yet), v1alpha1 the storage version."""
SERVED_CLUSTERS.spoke(StoredPostgresClusterV1Alpha1, to_hub=_cluster_up, from_hub=_cluster_down)

SERVED_BACKUPS = Conversion(ServedPostgresBackupV1Beta1)
"""PostgresBackup as this release serves it: the same shape in both versions, v1alpha1 stored."""
SERVED_BACKUPS.spoke(StoredPostgresBackupV1Alpha1, to_hub=_backup_up, from_hub=_backup_down)

SERVED_POOLERS = Conversion(ServedPostgresPoolerV1Beta1)
"""PostgresPooler as this release serves it: the same shape in both versions, v1alpha1 stored."""
SERVED_POOLERS.spoke(StoredPostgresPoolerV1Alpha1, to_hub=_pooler_up, from_hub=_pooler_down)

SERVED = Conversions(SERVED_CLUSTERS, SERVED_BACKUPS, SERVED_POOLERS)
"""What the operator's conversion webhook serves in this release."""


def served_crds(webhook: Mapping[str, Any]) -> list[Obj]:
    """The two-version CRDs of this release, one per kind, converted by the webhook at ``webhook`` (its
    ``clientConfig``, without ``caBundle``: the operator writes that)."""
    return [crd_for(*conversion.resources, webhook=webhook) for conversion in SERVED]
