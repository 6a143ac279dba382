"""kanri.dev/v1alpha1: the PostgresCluster API (see docs/postgrescluster.md).

The pydantic models here are the single source of the CRD in deploy/crds/ (``kanri crds``); their docstrings are
its field descriptions (``kubectl explain pgc.spec``). The operator reads objects as raw dicts on its hot path and
builds these models where typed access helps.
"""

from kanri.postgres.api.v1alpha1.backup import (
    CRON_PATTERN,
    Backup,
    Cron,
    Repository,
    RestoreTest,
    S3Credentials,
    S3Repository,
)
from kanri.postgres.api.v1alpha1.bootstrap import Bootstrap, InitDB, Recovery
from kanri.postgres.api.v1alpha1.cluster import MAX_NAME_LENGTH, PostgresCluster
from kanri.postgres.api.v1alpha1.pod_template import OPERATOR_LABEL_PREFIX, PodTemplate, Toleration
from kanri.postgres.api.v1alpha1.postgres_backup import (
    BACKUP_PHASES,
    BackupPhase,
    PostgresBackup,
    PostgresBackupSpec,
    PostgresBackupStatus,
)
from kanri.postgres.api.v1alpha1.postgresql import OPERATOR_OWNED_PARAMETERS, SUPPORTED_VERSIONS, PostgreSQL
from kanri.postgres.api.v1alpha1.replication import (
    DEFAULT_MAX_DATA_LOSS_BYTES,
    DEFAULT_MAX_READ_LAG_BYTES,
    DataDurability,
    Failover,
    FailoverPolicy,
    Replication,
    ReplicationMode,
)
from kanri.postgres.api.v1alpha1.spec import MAX_REPLICAS, DeletionPolicy, PostgresClusterSpec, Upgrade
from kanri.postgres.api.v1alpha1.status import (
    CONDITION_TYPES,
    PHASES,
    BackupStatus,
    FailoverCandidate,
    FailoverPhase,
    FailoverProgress,
    FailoverRecord,
    InstanceRole,
    InstanceStatus,
    Phase,
    PostgresClusterStatus,
    RestoreTestRecord,
    RestoreTestResult,
    SplitBrainInstance,
    SplitBrainRecord,
    UpgradePhase,
    UpgradeStatus,
)
from kanri.postgres.api.v1alpha1.storage import Resources, Volume

__all__ = [
    "BACKUP_PHASES",
    "CONDITION_TYPES",
    "CRON_PATTERN",
    "DEFAULT_MAX_DATA_LOSS_BYTES",
    "DEFAULT_MAX_READ_LAG_BYTES",
    "MAX_NAME_LENGTH",
    "MAX_REPLICAS",
    "OPERATOR_LABEL_PREFIX",
    "OPERATOR_OWNED_PARAMETERS",
    "PHASES",
    "SUPPORTED_VERSIONS",
    "Backup",
    "BackupPhase",
    "BackupStatus",
    "Bootstrap",
    "Cron",
    "DataDurability",
    "DeletionPolicy",
    "Failover",
    "FailoverCandidate",
    "FailoverPhase",
    "FailoverPolicy",
    "FailoverProgress",
    "FailoverRecord",
    "InitDB",
    "InstanceRole",
    "InstanceStatus",
    "Phase",
    "PodTemplate",
    "PostgreSQL",
    "PostgresBackup",
    "PostgresBackupSpec",
    "PostgresBackupStatus",
    "PostgresCluster",
    "PostgresClusterSpec",
    "PostgresClusterStatus",
    "Recovery",
    "Replication",
    "ReplicationMode",
    "Repository",
    "Resources",
    "RestoreTest",
    "RestoreTestRecord",
    "RestoreTestResult",
    "S3Credentials",
    "S3Repository",
    "SplitBrainInstance",
    "SplitBrainRecord",
    "Toleration",
    "Upgrade",
    "UpgradePhase",
    "UpgradeStatus",
    "Volume",
]
