"""The desired state of a PostgresCluster: the contract users keep in Git."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kanri.postgres.api.v1alpha1._base import ApiModel
from kanri.postgres.api.v1alpha1.backup import Backup
from kanri.postgres.api.v1alpha1.bootstrap import Bootstrap, InitDB
from kanri.postgres.api.v1alpha1.pod_template import PodTemplate
from kanri.postgres.api.v1alpha1.postgresql import SUPPORTED_VERSIONS, PostgreSQL
from kanri.postgres.api.v1alpha1.replication import Failover, Replication
from kanri.postgres.api.v1alpha1.storage import Resources, Volume
from kanri.runtime import cel

__all__ = [
    "MAX_REPLICAS",
    "DeletionPolicy",
    "NodeMaintenanceWindow",
    "PostgresClusterSpec",
    "PrimaryUpdateStrategy",
    "Upgrade",
]

DeletionPolicy = Literal["Retain", "Delete"]
PrimaryUpdateStrategy = Literal["Switchover", "InPlace"]
MAX_REPLICAS = 9

_MIN_VERSION, _MAX_VERSION = SUPPORTED_VERSIONS[0], SUPPORTED_VERSIONS[-1]
# syncStandbys is optional; mode Sync without it means one synchronous standby.
_SYNC_STANDBYS = "(has(self.replication.syncStandbys) ? self.replication.syncStandbys : 1)"
# <repository>:<major> or <repository>:<major>.<minor> (no digest: the tag names the release the data runs on).
IMAGE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9._/-]*[a-z0-9])?(:[0-9]+)?(/[a-z0-9._-]+)*:[0-9]{2}([.][0-9]{1,3})?$"
_IMAGE_TAG = "self.imageName.substring(self.imageName.lastIndexOf(':') + 1)"


class NodeMaintenanceWindow(ApiModel):
    """A node maintenance the cluster's owner has agreed to. Default: none (inProgress false)."""

    in_progress: bool = False
    """True: a node drain may evict a single-instance cluster's only pod (its database is down until the pod runs
    again elsewhere or the node returns). False (default): a PodDisruptionBudget keeps a drain from evicting it.
    Clusters with replicas need no window: the operator switches the primary away from a cordoned node first."""


class Upgrade(
    ApiModel,
    validations=[
        # Skipping the pre-upgrade backup is part of one approval, never a standing setting of the cluster.
        cel(
            "!has(self.withoutBackup) || !self.withoutBackup || has(self.approvedVersion)",
            "upgrade.withoutBackup needs upgrade.approvedVersion: it approves one upgrade without a fresh backup",
        ),
    ],
):
    """Approval of a major version upgrade. A rise of version is carried out only when approvedVersion equals the
    new version, so a change of version alone (say, a merged pull request) never upgrades a database. Before
    upgrading, the operator checks compatibility (pg_upgrade --check) and takes a fresh backup itself (a
    PostgresBackup named <cluster>-pre-upgrade-<to>-<approval time>); status.upgrade shows the progress. Default:
    nothing approved."""

    approved_version: Annotated[int, Field(ge=_MIN_VERSION, le=_MAX_VERSION)] | None = None
    """The PostgreSQL major the operator may upgrade to (14 to 18). Setting it to the value of version, together
    with or after raising version, starts the upgrade. Changing it while an upgrade runs does not stop that upgrade."""

    without_backup: bool | None = None
    """Upgrade without the fresh backup (only together with approvedVersion). Needed for a cluster without a backup
    repository, whose upgrade otherwise waits; with a repository it skips the pre-upgrade backup. Default: false."""


class PostgresClusterSpec(
    ApiModel,
    validations=[
        # A synchronous primary with no standby left to confirm commits stops accepting writes; hibernation (0) is fine.
        cel(
            f"self.replication.mode != 'Sync' || self.replicas == 0 || {_SYNC_STANDBYS} < self.replicas",
            # format() rather than string(): the API server's cost estimate of string(int) is unbounded.
            message_expression="'replication mode Sync with %d synchronous standby(s) needs at least %d replicas, not "
            "%d: lower replication.syncStandbys, raise replicas, or use mode Async'"
            f".format([{_SYNC_STANDBYS}, {_SYNC_STANDBYS} + 1, self.replicas])",
        ),
        # Mode Sync promises that an acknowledged commit is on a standby; synchronous_commit off or local would
        # acknowledge commits the standby never confirmed, and a failover would then lose them silently.
        cel(
            "self.replication.mode != 'Sync' || !has(self.postgresql) || !has(self.postgresql.parameters) || "
            "!('synchronous_commit' in self.postgresql.parameters) || "
            "self.postgresql.parameters['synchronous_commit'] in ['on', 'remote_write', 'remote_apply']",
            "replication mode Sync needs synchronous_commit on, remote_write or remote_apply (off and local "
            "acknowledge commits no standby has confirmed)",
        ),
        # The image names the release the data runs on: its major must be version, so raising version (an upgrade)
        # changes or removes imageName in the same edit and the two never disagree.
        cel(
            f"!has(self.imageName) || !self.imageName.matches('{IMAGE_NAME_PATTERN}') || "
            f"int({_IMAGE_TAG}.split('.')[0]) == self.version",
            # format() of ints only: concatenating the image name makes the cost estimate exceed the budget.
            message_expression="'imageName is not of major %d (version): its tag must be %d or %d.<minor>; raise "
            "version and imageName together for a major upgrade'.format([self.version, self.version, self.version])",
            field_path=".imageName",
        ),
    ],
):
    """The desired state of a PostgreSQL cluster: one primary and its streaming replicas, their storage,
    configuration, backups and the policies for failover, upgrades and deletion."""

    version: Annotated[
        int,
        Field(ge=_MIN_VERSION, le=_MAX_VERSION),
        cel(
            "self >= oldSelf",
            message_expression="'version may not go down (from %d to %d): a data directory cannot be downgraded; "
            "restore a backup into a new cluster of the older version instead'.format([oldSelf, self])",
            reason="FieldValueForbidden",
        ),
    ]
    """PostgreSQL major version, 14 to 18. Required. Raising it requests a major upgrade (pg_upgrade), which the
    operator carries out only once upgrade.approvedVersion equals the new version, after a compatibility check and a
    fresh backup. Lowering it is refused by the API server."""

    image_name: (
        Annotated[
            str,
            Field(max_length=255),
            # CEL rather than `pattern`: the API server would quote the whole regular expression back at the user.
            cel(
                f"self.matches('{IMAGE_NAME_PATTERN}')",
                message_expression='\'not an image of a PostgreSQL release: "%s"; use <repository>:<major> or '
                "<repository>:<major>.<minor>, such as kanri.dev/postgres:17.11 (no digest)'.format([self])",
            ),
        ]
        | None
    ) = None
    """The PostgreSQL image, to choose a minor release: kanri.dev/postgres:17.11. Its tag is the major (which must
    be version) or major.minor. Default: the platform's image of that major (the operator's KANRI_POSTGRES_IMAGES,
    set by the Helm chart; kanri.dev/postgres:<version> when unset), its newest minor.
    Changing it is a minor update: the replicas are restarted on the new image one at a time, then the primary's
    role is handed to an updated replica (a switchover, see primaryUpdateStrategy) and the old primary is restarted
    last. While a major upgrade waits or runs, the instances keep the image they have."""

    replicas: Annotated[int, Field(ge=0, le=MAX_REPLICAS)] = 1
    """Number of instances including the primary, 0 to 9. Default 1 (a primary without standby; use 3 for high
    availability). Raising it adds replicas cloned from the primary; lowering it removes replicas, never the
    primary. 0 hibernates the cluster: every pod stops, volumes and backups are kept, and raising it again resumes
    with the same data. With replication mode Sync it must exceed syncStandbys (or be 0)."""

    storage: Volume
    """The data volume of each instance (one PersistentVolumeClaim per instance). Required. size may grow (the
    claims are expanded online) but never shrink; storageClassName is fixed at creation."""

    resources: Resources | None = None
    """CPU and memory for each instance's PostgreSQL container. Default: requests of cpu 100m and memory 256Mi for
    each resource named neither in requests nor in limits (never BestEffort), no limits. Changing them restarts the
    instances one at a time, replicas first and the primary last (after a switchover)."""

    primary_update_strategy: PrimaryUpdateStrategy = "Switchover"
    """How the primary takes a change that restarts it (a new pod template: resources, image settings; or a
    parameter that needs a restart), once its replicas have it. Switchover (default): the role is first handed to a
    ready, streaming replica that already has the change, so writes pause only for the switchover; then the old
    primary is updated as a replica. InPlace: the primary is restarted where it is (writes wait for its restart).
    With one instance, no up-to-date ready replica, or a restart that lowers max_connections or another standby limit
    (the primary must restart first then), the primary is always restarted in place."""

    postgresql: PostgreSQL | None = None

    replication: Replication = Replication()
    """Streaming replication between the instances. Default: mode Async."""

    failover: Failover = Failover()

    node_maintenance_window: NodeMaintenanceWindow | None = None

    backup: Backup | None = None

    upgrade: Upgrade | None = None

    deletion_policy: DeletionPolicy = "Retain"
    """What deleting the PostgresCluster does to its data. Retain (default): the volumes and the backups outlive
    the object, and a new PostgresCluster of the same name adopts the volumes again. Delete: volumes and backups are
    deleted with it, irreversibly. May be changed at any time; the value when the object is deleted counts."""

    bootstrap: Annotated[
        Bootstrap,
        cel(
            "self == oldSelf",
            "bootstrap is used only when the cluster is created and cannot be changed afterwards",
            reason="FieldValueForbidden",
        ),
    ] = Bootstrap(initdb=InitDB())

    pod_template: PodTemplate | None = None
