"""The versions of the PostgreSQL API and the conversion between them: v1beta1 the hub, v1alpha1 a deprecated spoke.

``POSTGRES_CLUSTERS``, ``POSTGRES_BACKUPS`` and ``POSTGRES_POOLERS`` are kanri.runtime ``Conversion``s: what the
operator's conversion webhook will serve, what ``kanri convert`` uses offline, and (``.resources``) what the
two-version CRDs are generated from. The conversion works on the wire form (camelCase dicts), so a field added to
v1alpha1's models and inherited by v1beta1 crosses unchanged without code here; only what differs is touched.
"""

from __future__ import annotations

from typing import Any

from kanri.postgres.api import v1alpha1, v1beta1
from kanri.postgres.api.v1alpha1 import postgres_pooler
from kanri.runtime import Conversion, Conversions, CustomResource

__all__ = [
    "DEPRECATION_WARNING",
    "POSTGRES",
    "POSTGRES_BACKUPS",
    "POSTGRES_CLUSTERS",
    "POSTGRES_POOLERS",
    "REMOVAL_DATE",
    "PostgresBackupV1Alpha1",
    "PostgresClusterV1Alpha1",
    "PostgresPoolerV1Alpha1",
    "backup_from_v1beta1",
    "backup_to_v1beta1",
    "cluster_from_v1beta1",
    "cluster_to_v1beta1",
    "pooler_from_v1beta1",
    "pooler_to_v1beta1",
    "resource_keywords",
]

REMOVAL_DATE = "2027-12-31"
"""The last day kanri.dev/v1alpha1 is served; operator releases after it serve v1beta1 (and later v1) only."""


def _warning(kind: str) -> str:
    return f"kanri.dev/v1alpha1 {kind} is deprecated and will be removed after {REMOVAL_DATE}; use kanri.dev/v1beta1"


DEPRECATION_WARNING = _warning("PostgresCluster")
"""What the API server tells every client that reads or writes a PostgresCluster through v1alpha1."""


def resource_keywords(model: type[CustomResource], *, storage: bool, deprecation_warning: str | None = None
                      ) -> dict[str, Any]:  # fmt: skip
    """``model``'s resource declaration as class keywords, with ``storage`` set (and ``deprecation_warning``, when
    given, instead of the model's own)."""
    info = model.resource
    return {
        "group": info.group,
        "version": info.version,
        "kind": info.kind,
        "plural": info.plural,
        "short_names": info.short_names,
        "categories": info.categories,
        "printer_columns": info.printer_columns,
        "storage": storage,
        "deprecation_warning": deprecation_warning or info.deprecation_warning,
    }


def _spoke_of(model: type[CustomResource]) -> dict[str, Any]:
    """The class keywords of ``model``'s resource, as a deprecated, non-storage version."""
    return resource_keywords(model, storage=False, deprecation_warning=_warning(model.resource.kind))


class PostgresClusterV1Alpha1(v1alpha1.PostgresCluster, **_spoke_of(v1alpha1.PostgresCluster)):
    """A PostgreSQL cluster managed by kanri (deprecated version: use kanri.dev/v1beta1)."""


class PostgresBackupV1Alpha1(v1alpha1.PostgresBackup, **_spoke_of(v1alpha1.PostgresBackup)):
    """A base backup of a PostgresCluster (deprecated version: use kanri.dev/v1beta1)."""


class PostgresPoolerV1Alpha1(postgres_pooler.PostgresPooler, **_spoke_of(postgres_pooler.PostgresPooler)):
    """PgBouncer in front of a PostgresCluster (deprecated version: use kanri.dev/v1beta1)."""


def _wire(model: CustomResource) -> dict[str, Any]:
    data: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    data.pop("apiVersion", None)
    data.pop("metadata", None)
    return data


# v1alpha1 byte counts and the v1beta1 quantities they became: (object in spec, v1alpha1 name, v1beta1 name).
_BYTE_FIELDS = (("failover", "maxDataLossBytes", "maxDataLoss"), ("replication", "maxReadLagBytes", "maxReadLag"))


def cluster_to_v1beta1(old: PostgresClusterV1Alpha1) -> v1beta1.PostgresCluster:
    data = _wire(old)
    for parent, count_name, quantity_name in _BYTE_FIELDS:
        holder = data["spec"][parent]
        if count_name in holder:
            holder[quantity_name] = v1beta1.byte_quantity(holder.pop(count_name))
    return v1beta1.PostgresCluster.model_validate(data)


def cluster_from_v1beta1(new: v1beta1.PostgresCluster) -> PostgresClusterV1Alpha1:
    data = _wire(new)
    for parent, count_name, quantity_name in _BYTE_FIELDS:
        holder = data["spec"][parent]
        if quantity_name in holder:
            holder[count_name] = v1beta1.byte_count(holder.pop(quantity_name))
    return PostgresClusterV1Alpha1.model_validate(data)


def backup_to_v1beta1(old: PostgresBackupV1Alpha1) -> v1beta1.PostgresBackup:
    return v1beta1.PostgresBackup.model_validate(_wire(old))


def backup_from_v1beta1(new: v1beta1.PostgresBackup) -> PostgresBackupV1Alpha1:
    return PostgresBackupV1Alpha1.model_validate(_wire(new))


def pooler_to_v1beta1(old: PostgresPoolerV1Alpha1) -> v1beta1.PostgresPooler:
    return v1beta1.PostgresPooler.model_validate(_wire(old))


def pooler_from_v1beta1(new: v1beta1.PostgresPooler) -> PostgresPoolerV1Alpha1:
    return PostgresPoolerV1Alpha1.model_validate(_wire(new))


POSTGRES_CLUSTERS = Conversion(v1beta1.PostgresCluster)
"""PostgresCluster's versions: v1beta1 the hub (and the storage version once served), v1alpha1 a spoke."""
POSTGRES_CLUSTERS.spoke(PostgresClusterV1Alpha1, to_hub=cluster_to_v1beta1, from_hub=cluster_from_v1beta1)

POSTGRES_BACKUPS = Conversion(v1beta1.PostgresBackup)
"""PostgresBackup's versions: the same shape in both, so only apiVersion changes."""
POSTGRES_BACKUPS.spoke(PostgresBackupV1Alpha1, to_hub=backup_to_v1beta1, from_hub=backup_from_v1beta1)

POSTGRES_POOLERS = Conversion(v1beta1.PostgresPooler)
"""PostgresPooler's versions: the same shape in both (it holds no byte count), so only apiVersion changes."""
POSTGRES_POOLERS.spoke(PostgresPoolerV1Alpha1, to_hub=pooler_to_v1beta1, from_hub=pooler_from_v1beta1)

POSTGRES = Conversions(POSTGRES_CLUSTERS, POSTGRES_BACKUPS, POSTGRES_POOLERS)
"""Every kind of the PostgreSQL API the operator converts: what its conversion webhook and ``kanri convert`` serve."""
