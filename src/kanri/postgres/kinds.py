"""The Kind of the PostgresCluster resource, for the cache and the client."""

from __future__ import annotations

from kanri.postgres.api.v1alpha1 import PostgresCluster

__all__ = ["POSTGRES_CLUSTER"]

POSTGRES_CLUSTER = PostgresCluster.resource.api_kind
