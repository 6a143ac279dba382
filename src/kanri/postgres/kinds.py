"""The Kinds of the PostgresCluster and PostgresBackup resources, for the cache and the client."""

from __future__ import annotations

from kanri.postgres.api.v1alpha1 import PostgresBackup, PostgresCluster

__all__ = ["POSTGRES_BACKUP", "POSTGRES_CLUSTER"]

POSTGRES_CLUSTER = PostgresCluster.resource.api_kind
POSTGRES_BACKUP = PostgresBackup.resource.api_kind
