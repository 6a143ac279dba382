"""The PostgresBackup resource in kanri.dev/v1beta1: v1alpha1's shape, served in the same version as its cluster."""

from __future__ import annotations

from kanri.postgres.api import v1alpha1
from kanri.postgres.api.v1beta1._version import v1beta1_of

__all__ = ["PostgresBackup"]


class PostgresBackup(
    v1alpha1.PostgresBackup,
    **v1beta1_of(v1alpha1.PostgresBackup),
):
    """A base backup of a PostgresCluster. Create one to back up on demand (kubectl get pgbackup lists them); the
    cluster's spec.backup.schedule creates them too (<cluster>-initial, then <cluster>-<yyyymmddhhmm>). A backup is
    never taken twice for one object, and never two at once per cluster. Together with the archived WAL it allows
    point-in-time recovery. The operator's own backups are owned by the cluster only under deletionPolicy Delete
    (they go with it, as the repository's content does); under Retain they outlive a deleted cluster. Each is
    removed when retention expires it."""
