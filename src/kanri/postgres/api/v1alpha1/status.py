"""The observed state of a PostgresCluster, written only by the operator (through the status subresource)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal, get_args

from pydantic import Field

from kanri.postgres.api.v1alpha1._base import ApiModel
from kanri.runtime import Conditions, list_map

__all__ = [
    "CONDITION_TYPES",
    "PHASES",
    "BackupStatus",
    "FailoverCandidate",
    "FailoverPhase",
    "FailoverProgress",
    "FailoverRecord",
    "InstanceRole",
    "InstanceStatus",
    "Phase",
    "PostgresClusterStatus",
    "PrimaryUpdateRecord",
    "RestoreTestRecord",
    "RestoreTestResult",
    "SplitBrainInstance",
    "SplitBrainRecord",
    "TlsStatus",
    "UpgradePhase",
    "UpgradeStatus",
]

Phase = Literal[
    "Pending",
    "Provisioning",
    "Ready",
    "Degraded",
    "Scaling",
    "Upgrading",
    "FailingOver",
    "SwitchingOver",
    "Hibernated",
    "Deleting",
]
PHASES: tuple[Phase, ...] = get_args(Phase)
InstanceRole = Literal["Primary", "Replica", "Fenced"]
KeptBy = Literal["LastPrimary", "CurrentPrimary", "HighestPosition"]
UpgradePhase = Literal["WaitingForApproval", "WaitingForPreconditions", "Checking", "Upgrading", "Succeeded", "Failed"]
RestoreTestResult = Literal["Succeeded", "Failed"]
FailoverPhase = Literal["Fencing", "Electing", "Blocked", "Demoting", "Promoting"]
PositionSource = Literal["Memory", "Replicas"]  # kanri:upstream-evidence

CONDITION_TYPES = ("Ready", "Progressing", "Degraded")
"""Condition types every PostgresCluster carries once the operator has seen it."""

# A WAL location as PostgreSQL prints it (pg_lsn): two hexadecimal halves.
_LSN = r"^[0-9A-F]{1,8}/[0-9A-F]{1,8}$"

Lsn = Annotated[str, Field(pattern=_LSN)]
NonNegative = Annotated[int, Field(ge=0)]
Name = Annotated[str, Field(max_length=253)]


class InstanceStatus(ApiModel):
    """One instance (pod) of the cluster as the operator last observed it."""

    name: Name
    """Name of the instance (its pod)."""
    role: InstanceRole
    """Primary, Replica, or Fenced (its PostgreSQL is kept stopped after a split brain; no Service routes to it)."""
    ready: bool = False
    """Whether PostgreSQL accepts connections on this instance."""
    received_lsn: Lsn | None = Field(default=None, alias="receivedLSN")
    """Last WAL location this replica received from the primary (for the primary: its current write location)."""
    replayed_lsn: Lsn | None = Field(default=None, alias="replayedLSN")
    """Last WAL location this replica replayed."""
    lag_bytes: NonNegative | None = None
    """How far this replica has replayed behind the primary's current WAL position, in bytes (whole MiB), as the
    primary's pg_stat_replication shows it; absent when the operator cannot tell (the primary does not list it)."""


class FailoverRecord(ApiModel):
    """The last failover (or switchover): who was primary, who is now, and what may have been lost."""

    time: datetime
    """When the new primary was promoted."""
    from_: Name = Field(alias="from")
    """The instance that was primary."""
    to: Name
    """The instance promoted to primary."""
    timeline: Annotated[int, Field(ge=1)] | None = None
    """The PostgreSQL timeline the new primary started."""
    lsn_gap_bytes: NonNegative | None = None
    """WAL the old primary had written beyond what the promoted replica had received, as far as the operator could
    tell at the promotion (its position as last seen: a lower bound); absent when it could not tell. Raised to
    divergedBytes once that is measured."""
    diverged_bytes: NonNegative | None = None
    """Measured when the old primary rejoined, before pg_rewind or a clone discarded anything: the WAL it had written
    on its timeline past divergedAt — exactly what the failover left behind (0: nothing). Absent until then."""
    diverged_at: Lsn | None = Field(default=None, alias="divergedAt")
    """Where the new primary's timeline branched off the old one (its timeline history's switchpoint)."""
    data_loss_possible: bool
    """Whether committed transactions may have been lost (an asynchronous replica was promoted with a gap, or the
    gap could not be measured)."""
    reason: Annotated[str, Field(max_length=1024)] | None = None
    """Why it happened, e.g. PrimaryUnreachable or Switchover."""
    duration_seconds: Annotated[float, Field(ge=0)] | None = None
    """From the start of the failover (the detection window had passed) to the promotion, in seconds."""
    approved_by: Annotated[str, Field(max_length=64)] | None = None
    """Set when a blocked failover was approved with kanri.dev/approve-failover (the annotation's value)."""
    primary_lsn_source: PositionSource | None = Field(default=None, alias="primaryLSNSource")  # kanri:upstream-evidence
    """Where the old primary's position that lsnGapBytes is measured from came from: Memory (the operator's last
    healthy answer from it) or Replicas (what the replicas' WAL receivers last heard, after an operator restart)."""


class FailoverCandidate(ApiModel):
    """A replica whose WAL receiver was paused for the election, and where it stopped."""

    name: Name
    """The replica."""
    received_lsn: Lsn | None = Field(default=None, alias="receivedLSN")
    """The last WAL location it had received when its receiver stopped."""
    replayed_lsn: Lsn | None = Field(default=None, alias="replayedLSN")
    """The last WAL location it had replayed then."""


class FailoverProgress(ApiModel):
    """A failover or switchover under way (absent otherwise); kept in status so a restarted operator resumes it."""

    phase: FailoverPhase
    """Fencing (the old primary is cut off, the replicas' WAL receivers paused), Electing, Blocked (waiting for
    kanri.dev/approve-failover), Demoting (switchover: the primary shuts down cleanly) or Promoting."""
    from_: Name = Field(alias="from")
    """The primary that failed (or is handed over)."""
    reason: Annotated[str, Field(max_length=64)]
    """PrimaryUnreachable, PrimaryNotRunning, PrimaryRestarting, PrimaryDataLost (its volume came back empty) or
    Switchover."""
    started: datetime
    """When the failover started (the detection window had passed)."""
    primary_lsn: Lsn | None = Field(default=None, alias="primaryLSN")
    """The failed primary's write position as last seen (what the possible loss is measured against)."""
    primary_timeline: Annotated[int, Field(ge=1)] | None = None
    """The failed primary's timeline as last seen."""
    primary_lsn_source: PositionSource | None = Field(default=None, alias="primaryLSNSource")  # kanri:upstream-evidence
    """Where primaryLSN came from: Memory (the operator's last healthy answer from the primary) or Replicas (what
    the replicas' WAL receivers last heard of its WAL end)."""
    primary_lsn_evidence: Annotated[str, Field(max_length=512)] | None = Field(  # kanri:upstream-evidence
        default=None, alias="primaryLSNEvidence"
    )
    """What the replicas reported of the failed primary's WAL end and how old it was."""
    target: Name | None = None
    """The instance being promoted (chosen, approved, or the switchover's target)."""
    checkpoint_lsn: Lsn | None = Field(default=None, alias="checkpointLSN")
    """Switchover: the demoted primary's shutdown checkpoint, which the target must have received."""
    candidates: Annotated[list[FailoverCandidate], Field(max_length=64)] = Field(default_factory=list)
    """The replicas paused for the election."""
    lsn_gap_bytes: NonNegative | None = None
    """WAL the target lacks compared with the failed primary as last seen."""
    data_loss_possible: bool | None = None
    """Whether promoting the target may lose acknowledged commits (decided by the guard)."""
    approved_by: Annotated[str, Field(max_length=64)] | None = None
    """The value of kanri.dev/approve-failover that released a blocked failover."""
    blocked_reason: Annotated[str, Field(max_length=64)] | None = None
    """While Blocked: ManualPolicy, DataLossAboveLimit, DataLossUnknown, NoSynchronousStandby or NoCandidate."""
    message: Annotated[str, Field(max_length=1024)] | None = None
    """Why it is blocked, the best candidate and the possible loss, and how to approve."""


class PrimaryUpdateRecord(ApiModel):
    """A switchover the operator began itself, to update the primary (a rolling update or a restart), that did not
    happen. The update of the primary waits: it is tried again once the spec changes (a new metadata.generation),
    after a switchover by hand (kanri.dev/switchover-to), or in place with primaryUpdateStrategy InPlace."""

    reason: Annotated[str, Field(max_length=64)]
    """SwitchoverFailed (the primary could not be demoted) or SwitchoverAbandoned (the target did not catch up in
    time; the old primary was promoted back)."""
    generation: Annotated[int, Field(ge=0)]
    """The metadata.generation of the spec the switchover was for."""
    time: datetime
    """When it was given up."""
    message: Annotated[str, Field(max_length=1024)]
    """What happened and what to do."""


class SplitBrainInstance(ApiModel):
    """One side of a split brain, where its history stood when the split was seen."""

    name: Name
    """The instance."""
    timeline: Annotated[int, Field(ge=1)] | None = None
    """Its PostgreSQL timeline."""
    lsn: Lsn | None = None
    """Its write LSN (pg_current_wal_lsn)."""


class SplitBrainRecord(ApiModel):
    """Two or more instances ran as primary at once: which one was kept, which were fenced, and where each stood.
    Kept until every fenced instance is resolved (gone, or back as an unfenced replica)."""

    detected_at: datetime
    """When the operator saw the instances report primary together."""
    kept: SplitBrainInstance
    """The primary that stays behind the -rw Service."""
    kept_by: KeptBy
    """Why it was kept: LastPrimary (the primary the operator recorded on the claims), CurrentPrimary
    (status.currentPrimary), or HighestPosition (no record named one: the highest timeline, then write LSN)."""
    fenced: Annotated[list[SplitBrainInstance], Field(max_length=64)] = Field(default_factory=list)
    """The other primaries: labelled fenced and their PostgreSQL stopped. Their writes after the histories diverged
    exist only on their volumes."""


class RestoreTestRecord(ApiModel):
    """The last restore rehearsal."""

    time: datetime
    """When it finished."""
    duration_seconds: NonNegative
    """How long the restore took until the instance was consistent, in seconds."""
    result: RestoreTestResult
    """Succeeded or Failed."""
    message: Annotated[str, Field(max_length=32768)] | None = None
    """Details, e.g. why it failed."""
    recovered_to: datetime | None = None
    """The commit time of the last transaction the rehearsal replayed: how recent the recoverable data was."""
    request: Annotated[str, Field(max_length=253)] | None = None
    """What asked for it: schedule, or the value of the kanri.dev/restore-test annotation it answered (each new
    value runs one rehearsal)."""


class BackupStatus(ApiModel):
    """Backups and recoverability."""

    last_successful: datetime | None = None
    """When the last base backup completed."""
    last_failed: datetime | None = None
    """When the last base backup failed."""
    first_recoverability_point: datetime | None = None
    """The earliest moment the cluster can be restored to (the end of the oldest completed backup kept)."""
    last_archived_wal: Annotated[str | None, Field(alias="lastArchivedWAL", max_length=64)] = None
    """The newest WAL file the primary archived to the repository."""
    last_archived_time: datetime | None = None
    """When it was archived."""
    last_restore_test: RestoreTestRecord | None = None
    last_scheduled: datetime | None = None
    """The moment the operator last asked for a base backup on its own: the first backup once the cluster was Ready,
    then each slot of spec.backup.schedule. The next scheduled backup is the first slot after it."""
    server_name: Annotated[str, Field(max_length=80)] | None = None
    """Where in the repository the current PostgreSQL system archives WAL and stores base backups: absent for the
    system the cluster was created with (the cluster's name), ``<cluster>.pg<major>`` after a major upgrade (a new
    system: a folder of its own, so the old system's backups stay restorable to before the upgrade)."""


class UpgradeStatus(ApiModel):
    """Progress of a major version upgrade."""

    phase: UpgradePhase
    """WaitingForApproval (spec.upgrade.approvedVersion is not spec.version: nothing changes),
    WaitingForPreconditions (the message names each closed gate: cluster Ready, a backup completed after
    approvedAt), Checking (pg_upgrade --check), Upgrading, Succeeded or Failed (the cluster keeps serving on the old
    major; nothing is retried until the spec changes)."""
    from_: Annotated[int, Field(ge=1)] = Field(alias="from")
    """The major version upgraded from."""
    to: Annotated[int, Field(ge=1)]
    """The major version upgraded to."""
    message: Annotated[str, Field(max_length=32768)] | None = None
    """What is happening or what went wrong."""
    approved_at: datetime | None = None
    """When the operator first saw spec.upgrade.approvedVersion equal to the target: a backup must complete after
    it."""
    generation: Annotated[int, Field(ge=0)] | None = None
    """The metadata.generation this record was decided for (a Failed upgrade is tried again only for a newer one)."""
    step: Literal["Stopping", "Upgrading", "Starting"] | None = None
    """Within phase Upgrading: Stopping (every instance stops: the downtime begins), Upgrading (pg_upgrade --link in
    a one-off pod on the primary's volume), Starting (the instances start on the new major; replicas are cloned
    again from the upgraded primary)."""
    primary: Annotated[str, Field(max_length=253)] | None = None
    """The instance whose data directory is upgraded (the primary when the check passed)."""
    stopped_at: datetime | None = None
    """When the instances were asked to stop (the downtime's start)."""
    serving_at: datetime | None = None
    """When the upgraded primary first served again (the downtime's end)."""
    downtime_seconds: Annotated[float, Field(ge=0)] | None = None
    """serving_at - stopped_at: how long the cluster took no connections."""
    pg_upgrade_seconds: Annotated[float, Field(ge=0)] | None = None
    """How long pg_upgrade --link itself took."""
    finished_at: datetime | None = None
    """When every instance was ready on the new major (phase Succeeded)."""


class TlsStatus(ApiModel):
    """The server certificate the instances serve (see docs/security.md)."""

    server_certificate_expires: datetime | None = None
    """When the server certificate expires; a managed one is reissued when a third of its lifetime remains."""


class PostgresClusterStatus(ApiModel):
    """What the operator observed. Written only by the operator."""

    phase: Phase | None = None
    """Lifecycle phase: Pending, Provisioning, Ready, Degraded, Scaling, Upgrading, FailingOver, SwitchingOver (a
    planned switchover, until its former primary serves as a replica), Hibernated or Deleting."""
    conditions: Annotated[Conditions, Field(max_length=32)] = Field(default_factory=list)
    """Ready, Progressing and Degraded (and others as needed), one entry per type."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The metadata.generation of the spec this status describes."""
    current_primary: Name | None = None
    """Name of the instance that is primary now."""
    timeline: Annotated[int, Field(ge=1)] | None = None
    """The primary's PostgreSQL timeline (it increases with every promotion)."""
    instances: Annotated[list[InstanceStatus], list_map("name"), Field(max_length=64)] = Field(default_factory=list)
    """Every instance with its role, readiness and replication position."""
    ready_replicas: Annotated[int, Field(ge=0)] | None = None
    """Instances (primary included) that accept connections."""
    postgres_major: Annotated[int, Field(ge=1)] | None = None
    """The PostgreSQL major of the data (its PG_VERSION, as the instances report it): the image runs this major,
    whatever spec.version says, until a major upgrade is carried out."""
    system_identifier: Annotated[str, Field(pattern=r"^[0-9]{1,20}$")] | None = None
    """The cluster's PostgreSQL system identifier (decimal), recorded once a primary reported it. An instance with
    an empty volume never initialises a new database while it is known: it clones from the primary, or reports
    DataDirectoryLost."""
    failover: FailoverProgress | None = None
    last_failover: FailoverRecord | None = None
    primary_update: PrimaryUpdateRecord | None = None
    split_brain: SplitBrainRecord | None = None
    backup: BackupStatus | None = None
    upgrade: UpgradeStatus | None = None
    tls: TlsStatus | None = None
    one_shot_pods: Annotated[dict[str, Annotated[str, Field(max_length=64)]], Field(max_length=8)] | None = None
    """Pod name -> uid of each one-shot pod the operator created for this cluster (restore rehearsal, upgrade check,
    upgrade): it reads the verdict of, and deletes, only a pod of that name with that uid (see docs/security.md)."""
