"""The PostgresBackup resource: one base backup of a PostgresCluster, on demand or made by the cluster's schedule."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, get_args

from pydantic import ConfigDict, Field

from kanri.postgres.api.v1alpha1._base import ApiModel, reflow_descriptions
from kanri.runtime import CustomResource, PrinterColumn, cel

__all__ = ["BACKUP_PHASES", "BackupPhase", "PostgresBackup", "PostgresBackupSpec", "PostgresBackupStatus"]

BackupPhase = Literal["Pending", "Running", "Completed", "Failed"]
BACKUP_PHASES: tuple[BackupPhase, ...] = get_args(BackupPhase)


class PostgresBackupSpec(ApiModel):
    """Which cluster to back up. The backup is taken from a healthy streaming replica when there is one (else the
    primary), into the cluster's backup repository."""

    cluster: Annotated[
        str,
        Field(min_length=1, max_length=63, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$"),
        cel(
            "self == oldSelf", "spec.cluster is immutable: create another PostgresBackup", reason="FieldValueForbidden"
        ),
    ]
    """Name of the PostgresCluster in the same namespace. Required; fixed at creation."""


class PostgresBackupStatus(ApiModel):
    """What happened to the backup, written by the operator."""

    phase: BackupPhase | None = None
    """Pending (waiting: the cluster is not ready, or another backup of it runs), Running, Completed or Failed."""
    reason: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z]+$")] | None = None
    """Why it is in its phase, in one word: ClusterNotFound, NoBackupConfigured, ClusterNotReady, WaitingForBackup
    (another backup of the cluster runs first), RetryScheduled (an attempt failed; the next one is at nextAttemptAt),
    Started, Completed, InstanceUnreachable, BackupFailed, ..."""
    message: Annotated[str, Field(max_length=4096)] | None = None
    """Why it waits, or why it failed."""
    instance: Annotated[str, Field(max_length=253)] | None = None
    """The instance (pod) the backup was taken from."""
    started_at: datetime | None = None
    """When the backup started."""
    completed_at: datetime | None = None
    """When it completed or failed."""
    backup_id: Annotated[str, Field(max_length=64)] | None = None
    """Barman's id of the backup in the repository (YYYYMMDDThhmmss): what barman-cloud-restore takes."""
    begin_wal: Annotated[str | None, Field(alias="beginWAL", max_length=64)] = None
    """The first WAL file the backup needs."""
    end_wal: Annotated[str | None, Field(alias="endWAL", max_length=64)] = None
    """The last WAL file the backup needs: the backup is consistent once it is replayed."""
    begin_lsn: Annotated[str | None, Field(alias="beginLSN", max_length=32)] = None
    """The WAL location the backup started at."""
    end_lsn: Annotated[str | None, Field(alias="endLSN", max_length=32)] = None
    """The WAL location the backup ended at."""
    timeline: Annotated[int, Field(ge=1)] | None = None
    """The timeline the backup was taken on."""
    size_bytes: Annotated[int, Field(ge=0)] | None = None
    """Size of the data backed up, in bytes."""
    attempts: Annotated[int, Field(ge=0)] | None = None
    """Attempts made so far (the one running included). A failed attempt that may pass (BackupFailed,
    InstanceUnreachable) is tried again with exponential backoff (30 s, doubling, at most 10 min, 5 attempts in all);
    a refused one (BackupRefused) is not."""
    next_attempt_at: datetime | None = None
    """When a failed backup is tried again (phase Pending, reason RetryScheduled)."""
    last_error_reason: Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z]+$")] | None = None
    """The reason of the last failed attempt: BackupFailed, InstanceUnreachable or BackupRefused."""
    last_error: Annotated[str, Field(max_length=4096)] | None = None
    """What the last failed attempt reported."""
    server_name: Annotated[str, Field(max_length=80)] | None = None
    """The folder of the repository it is stored in: the cluster's name, or ``<cluster>.pg<major>`` for a backup of
    the PostgreSQL system a major upgrade made."""


class PostgresBackup(
    CustomResource,
    group="kanri.dev",
    version="v1alpha1",
    kind="PostgresBackup",
    plural="postgresbackups",
    short_names=("pgbackup",),
    categories=("kanri",),
    printer_columns=(
        PrinterColumn("Cluster", ".spec.cluster", description="The PostgresCluster backed up"),
        PrinterColumn("Phase", ".status.phase", description="Pending, Running, Completed or Failed"),
        PrinterColumn("Reason", ".status.reason", description="Why it is in its phase"),
        PrinterColumn("Backup", ".status.backupId", description="Barman's id of the backup in the repository"),
        PrinterColumn("Started", ".status.startedAt", type="date", description="When the backup started"),
        PrinterColumn("Completed", ".status.completedAt", type="date", description="When it completed or failed"),
        PrinterColumn("Age", ".metadata.creationTimestamp", type="date", description="When it was asked for"),
    ),
):
    """A base backup of a PostgresCluster. Create one to back up on demand (kubectl get pgbackup lists them); the
    cluster's spec.backup.schedule creates them too (<cluster>-initial, then <cluster>-<yyyymmddhhmm>). A backup is
    never taken twice for one object, and never two at once per cluster. Together with the archived WAL it allows
    point-in-time recovery. The operator's own backups are owned by the cluster only under deletionPolicy Delete
    (they go with it, as the repository's content does); under Retain they outlive a deleted cluster. Each is
    removed when retention expires it."""

    model_config = ConfigDict(json_schema_extra=reflow_descriptions)

    spec: PostgresBackupSpec
    status: PostgresBackupStatus | None = None
