"""v1beta1's desired state: v1alpha1's, with the failover settings of v1beta1."""

from __future__ import annotations

from kanri.postgres.api import v1alpha1
from kanri.postgres.api.v1beta1.replication import Failover, Replication

__all__ = ["PostgresClusterSpec"]


class PostgresClusterSpec(v1alpha1.PostgresClusterSpec):
    """The desired state of a PostgreSQL cluster: one primary and its streaming replicas, their storage,
    configuration, backups and the policies for failover, upgrades and deletion."""

    # Every other field (and every CEL rule) is v1alpha1's, inherited: a field added there is here too.
    # A field's type may change between versions; the v1alpha1 class is never used where this one is expected.
    replication: Replication = Replication()  # type: ignore[assignment]
    """Streaming replication between the instances. Default: mode Async."""

    failover: Failover = Failover()  # type: ignore[assignment]
