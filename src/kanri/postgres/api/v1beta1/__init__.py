"""kanri.dev/v1beta1: the PostgresCluster API's next version, the hub its conversions go through.

What changed from v1alpha1 (docs/postgrescluster.md, "v1beta1"): ``spec.failover.maxDataLossBytes`` and
``spec.replication.maxReadLagBytes`` (raw byte counts) became ``maxDataLoss`` and ``maxReadLag``, quantities such as
``16Mi``, like every other size in the API.
Everything else is v1alpha1's models, imported rather than copied, so the two versions cannot drift apart
silently. PostgresBackup and PostgresPooler are unchanged apart from their version (neither holds a byte count).
Served (not stored) by an operator given a conversion webhook (``kanri.postgres.api.served``); deploy/crds/ still
holds v1alpha1 alone, and ``kanri.postgres.api.conversion`` holds both versions and the conversion between them.
"""

from kanri.postgres.api.v1beta1.cluster import PostgresCluster
from kanri.postgres.api.v1beta1.postgres_backup import PostgresBackup
from kanri.postgres.api.v1beta1.postgres_pooler import PostgresPooler
from kanri.postgres.api.v1beta1.replication import (
    DEFAULT_MAX_DATA_LOSS,
    MAX_BYTES,
    Failover,
    Replication,
    byte_count,
    byte_quantity,
)
from kanri.postgres.api.v1beta1.spec import PostgresClusterSpec

__all__ = [
    "DEFAULT_MAX_DATA_LOSS",
    "MAX_BYTES",
    "Failover",
    "PostgresBackup",
    "PostgresCluster",
    "PostgresClusterSpec",
    "PostgresPooler",
    "Replication",
    "byte_count",
    "byte_quantity",
]
