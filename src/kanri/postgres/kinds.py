"""The Kinds of the PostgresCluster, PostgresBackup and PostgresPooler resources, for the cache and the client."""

from __future__ import annotations

from kanri.postgres.api.v1alpha1 import PostgresBackup, PostgresCluster
from kanri.postgres.api.v1alpha1.postgres_pooler import PostgresPooler

__all__ = ["POSTGRES_BACKUP", "POSTGRES_CLUSTER", "POSTGRES_POOLER"]

POSTGRES_CLUSTER = PostgresCluster.resource.api_kind
POSTGRES_BACKUP = PostgresBackup.resource.api_kind
POSTGRES_POOLER = PostgresPooler.resource.api_kind
