"""The PostgresPooler resource in kanri.dev/v1beta1: v1alpha1's shape, served in the same version as its cluster.

Its spec names the cluster, the Service type, instances, pool mode, PgBouncer parameters and resources: none of the
byte counts v1beta1 turned into quantities, so nothing is reshaped and the conversion changes only apiVersion."""

from __future__ import annotations

from kanri.postgres.api.v1alpha1 import postgres_pooler as v1alpha1
from kanri.postgres.api.v1beta1._version import v1beta1_of

__all__ = ["PostgresPooler"]


class PostgresPooler(
    v1alpha1.PostgresPooler,
    **v1beta1_of(v1alpha1.PostgresPooler),
):
    """PgBouncer in front of a PostgresCluster: a Deployment of PgBouncer pods and a Service named after the pooler.
    Clients connect with TLS (a certificate from the cluster's CA) as the cluster's users with their own passwords;
    PgBouncer looks them up through a dedicated role and verifies the cluster's certificate (verify-full)."""
