"""The PostgresCluster resource in kanri.dev/v1beta1: the hub of its conversions."""

from __future__ import annotations

from kanri.postgres.api import v1alpha1
from kanri.postgres.api.v1beta1._version import v1beta1_of
from kanri.postgres.api.v1beta1.spec import PostgresClusterSpec

__all__ = ["PostgresCluster"]


class PostgresCluster(
    v1alpha1.PostgresCluster,  # the name rule, printer columns and status are v1alpha1's
    **v1beta1_of(v1alpha1.PostgresCluster),
):
    """A PostgreSQL cluster managed by kanri: one primary, streaming replicas, their volumes and backups. The
    operator keeps pods, volumes, Services (<name>-rw for writes, <name>-ro for replicas, <name>-r for any) and
    backups in line with spec, and reports what it observes in status."""

    spec: PostgresClusterSpec
