"""The cloud operator's kinds: ``DatabaseInstance`` (what a developer asks for, in business terms) and
``DatabaseClass`` (cluster-scoped, the platform team's provider profile, guardrails and request budget).

Common fields are the same for every provider; what only one provider understands goes into
``spec.providers.<name>``. ``kanri crds`` renders ``CUSTOM_RESOURCES`` into deploy/crds/ (docs/cloud.md).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kanri import kit
from kanri import runtime as kr

__all__ = [
    "CUSTOM_RESOURCES",
    "AwsExtension",
    "AwsProfile",
    "DatabaseClass",
    "DatabaseClassSpec",
    "DatabaseInstance",
    "DatabaseInstanceSpec",
    "DatabaseInstanceStatus",
    "Endpoint",
    "Guardrails",
    "KanriExtension",
    "KanriProfile",
    "KanriSize",
    "NetworkAccess",
    "OperationRecord",
    "ProviderExtensions",
    "RequestBudget",
    "SecretReference",
]

GROUP = "kanri.dev"
VERSION = "v1alpha1"

_QUANTITY_RULE = "isQuantity(string(self)) && isQuantity(string(oldSelf))"
_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_CIDR = r"^[0-9a-fA-F:.]+/[0-9]{1,3}$"


def _immutable(field: str) -> kr.Rule:
    return kr.cel("self == oldSelf", f"{field} is immutable: create a new DatabaseInstance instead",
                  reason="FieldValueForbidden")  # fmt: skip


# --- DatabaseInstance ---------------------------------------------------------------------------------------------


class NetworkAccess(kr.KubeModel):
    """Who may reach the database. Private: only from inside the provider's network."""

    access: Literal["Private", "Public"] = "Private"
    """Public asks for an address reachable from the internet; a class's guardrails may forbid it."""
    allowed_cidrs: Annotated[list[Annotated[str, Field(pattern=_CIDR, max_length=43)]],
                             Field(max_length=32), kr.list_set()] = Field(default_factory=list)  # fmt: skip
    """Client address ranges allowed in (e.g. 10.0.0.0/8); empty means the provider's default for the access."""


class AwsExtension(kr.KubeModel):
    """Fields only the aws provider (RDS) understands."""

    instance_class: str | None = Field(default=None, max_length=63)
    """An RDS DBInstanceClass that overrides the class's mapping of ``size`` (e.g. db.t4g.micro)."""
    storage_type: Literal["gp2", "gp3", "io1", "io2", "standard"] | None = None
    """The RDS storage type; unset leaves RDS's default (which is then never diffed)."""
    iops: int | None = Field(default=None, ge=1000, le=256000)
    """Provisioned IOPS (io1/io2/gp3 only)."""
    parameter_group: str | None = Field(default=None, max_length=255)
    """An existing DB parameter group name."""


class KanriExtension(kr.KubeModel):
    """Fields only the kanri provider (a PostgresCluster of kanri's own operator) understands."""

    instances: int | None = Field(default=None, ge=1, le=9)
    """Instances of the PostgresCluster (primary plus replicas); unset: 2 with highAvailability, else 1."""
    storage_class_name: str | None = Field(default=None, max_length=253)
    """The StorageClass of the cluster's volumes; unset: the class profile's, then the cluster default."""


class ProviderExtensions(kr.KubeModel):
    """Provider-specific extension blocks: only the block of the class's provider is read; any other is named in
    status as Unsupported (never silently ignored)."""

    aws: AwsExtension | None = None
    kanri: KanriExtension | None = None


class DatabaseInstanceSpec(
    kr.KubeModel,
    validations=[
        kr.cel(
            "!has(oldSelf.adoptExternalId) || (has(self.adoptExternalId) && self.adoptExternalId == "
            "oldSelf.adoptExternalId)",
            "adoptExternalId cannot change or be removed once set",
            reason="FieldValueForbidden",
        ),
        kr.cel(
            "!has(self.region) || !has(oldSelf.region) || self.region == oldSelf.region",
            "region is immutable: a database cannot move region in place",
            reason="FieldValueForbidden",
        ),
    ],
):
    """A database in business terms; the DatabaseClass named by ``className`` decides where and how."""

    class_name: Annotated[str, Field(min_length=1, max_length=253, pattern=_NAME), _immutable("className")]
    """The DatabaseClass (provider profile and guardrails) to use."""
    engine: Annotated[Literal["postgres"], _immutable("engine")] = "postgres"
    """The database engine."""
    version: Annotated[
        int,
        Field(ge=12, le=99),
        kr.cel("self >= oldSelf", "version cannot go down: a major downgrade is not possible in place"),
    ]
    """The engine's major version (e.g. 16). Raising it is a major upgrade (downtime; see the Planned condition)."""
    size: str = Field(default="small", min_length=1, max_length=63, pattern=_NAME)
    """A size class: small, medium, large, or a name the DatabaseClass defines."""
    storage: Annotated[
        kr.Quantity,
        kr.cel(
            "!isQuantity(string(self)) || quantity(string(self)).compareTo(quantity('1Gi')) >= 0",
            "storage must be at least 1Gi",
        ),
        kr.cel(
            f"!({_QUANTITY_RULE}) || quantity(string(self)).compareTo(quantity(string(oldSelf))) >= 0",
            "storage cannot shrink: providers only grow volumes",
        ),
    ] = "20Gi"
    """Allocated storage. It may grow, never shrink."""
    region: str | None = Field(default=None, max_length=63)
    """Where the database runs; unset: the class's default region."""
    network: NetworkAccess = Field(default_factory=NetworkAccess)
    backup_retention_days: int = Field(default=7, ge=0, le=35)
    """Days of automated backups kept (0 turns them off; a class may demand a minimum)."""
    high_availability: bool = False
    """A standby in another zone (RDS Multi-AZ; replicas for kanri)."""
    maintenance_window: str | None = Field(default=None, max_length=32,
                                           pattern=r"^(mon|tue|wed|thu|fri|sat|sun):[0-2][0-9]:[0-5][0-9]-"
                                                   r"(mon|tue|wed|thu|fri|sat|sun):[0-2][0-9]:[0-5][0-9]$")  # fmt: skip
    """When the provider may apply changes that need downtime (ddd:hh:mm-ddd:hh:mm, UTC)."""
    deletion_policy: Literal["Retain", "Delete"] = "Retain"
    """What deleting this object does to the database: Retain leaves it running (let go of), Delete deletes it."""
    final_snapshot: bool = True
    """With Delete: take a final snapshot before the database goes."""
    management_policy: Literal["Manage", "ObserveOnly"] = "Manage"
    """ObserveOnly reads the database into status and never writes to the provider."""
    adopt_external_id: str | None = Field(default=None, min_length=1, max_length=253)
    """Adopt an existing database by its provider ID instead of creating one."""
    providers: ProviderExtensions = Field(default_factory=ProviderExtensions)


class OperationRecord(kr.KubeModel):
    """A provider operation: on record before it is started (the intent) and until it ends, so a restarted operator
    resumes polling it instead of starting it again."""

    kind: Literal["Create", "Modify", "Delete"]
    id: str
    """The provider's request/job ID, or the idempotency token the call was made with."""
    target_state: str
    """The state the database reaches when the operation is done (``available``, ``deleted``)."""
    started: kr.Time
    fields: list[str] = Field(default_factory=list)
    """The common fields a Modify changes."""
    generation: int | None = None
    """The DatabaseInstance's metadata.generation the operation was started for."""
    outcome: Literal["Pending", "InProgress", "Succeeded", "Failed"] = "Pending"
    """Pending: recorded, the call not known to have been accepted yet."""
    message: str | None = None


class Endpoint(kr.KubeModel):
    host: str
    port: int


class DatabaseInstanceStatus(kit.KitStatus):
    provider: str | None = None
    """The provider of the class in use."""
    external_id: str | None = None
    """The database's ID at the provider (RDS DBInstanceIdentifier; namespace/name of a PostgresCluster)."""
    state: str | None = None
    """The provider's state of the database (creating, available, modifying, deleting...)."""
    endpoint: Endpoint | None = None
    engine_version: str | None = None
    operation: OperationRecord | None = None
    """The operation in flight."""
    last_operation: OperationRecord | None = None
    """The last operation that ended, with its outcome."""
    connection_secret: str | None = None
    """The Secret holding host, port, dbname, username, password (and ca.crt with TLS) for applications."""
    unsupported: list[str] = Field(default_factory=list)
    """Fields set that the provider cannot honour (also the Unsupported condition)."""
    planned: list[str] = Field(default_factory=list)
    """Changes waiting for the maintenance window or needing downtime (also the Planned condition)."""


class DatabaseInstance(kr.CustomResource, group=GROUP, version=VERSION, kind="DatabaseInstance",
                       plural="databaseinstances", short_names=("dbi",), categories=("kanri",),
                       printer_columns=(kr.PrinterColumn("Class", ".spec.className"),
                                        kr.PrinterColumn("State", ".status.state"),
                                        kr.PrinterColumn("External ID", ".status.externalId"))):  # fmt: skip
    """A database asked for in business terms; a DatabaseClass binds it to a provider."""

    spec: DatabaseInstanceSpec
    status: DatabaseInstanceStatus | None = None


# --- DatabaseClass ------------------------------------------------------------------------------------------------


class SecretReference(kr.KubeModel):
    name: str = Field(min_length=1, max_length=253)
    namespace: str = Field(min_length=1, max_length=63)


def _default_aws_sizes() -> dict[str, str]:
    return {"small": "db.t3.micro", "medium": "db.m5.large", "large": "db.r5.xlarge"}


class AwsProfile(kr.KubeModel):
    """How the aws provider reaches RDS."""

    endpoint_url: str | None = Field(default=None, max_length=2048)
    """Any RDS-compatible endpoint (an emulator, a VPC endpoint); unset: AWS's public endpoint for the region."""
    region: str = Field(min_length=1, max_length=63)
    """The default region of instances that do not name one."""
    account: str = Field(default="default", max_length=63)
    """A label for the account the credentials belong to: the request budget is kept per account and region."""
    credentials_secret: SecretReference | None = None
    """A Secret with keys ``accessKeyId`` and ``secretAccessKey`` (and optionally ``sessionToken``). Unset: the
    SDK's default chain (e.g. the pod's web identity)."""
    sizes: dict[str, str] = Field(default_factory=_default_aws_sizes)
    """Size class -> DBInstanceClass."""
    subnet_group: str | None = Field(default=None, max_length=255)
    """The DB subnet group instances are placed in."""


class KanriSize(kr.KubeModel):
    cpu: kr.Quantity
    memory: kr.Quantity


def _default_kanri_sizes() -> dict[str, KanriSize]:
    return {"small": KanriSize(cpu="500m", memory="1Gi"), "medium": KanriSize(cpu="2", memory="4Gi"),
            "large": KanriSize(cpu="4", memory="16Gi")}  # fmt: skip


class KanriProfile(kr.KubeModel):
    """How the kanri provider places PostgresClusters."""

    namespace: str | None = Field(default=None, max_length=63)
    """Where the PostgresClusters go; unset: the DatabaseInstance's own namespace."""
    sizes: dict[str, KanriSize] = Field(default_factory=_default_kanri_sizes)
    """Size class -> requests of each instance."""
    storage_class_name: str | None = Field(default=None, max_length=253)
    region: str = Field(default="local", max_length=63)
    """The one region this cluster is: an instance asking for another is refused by the guardrails."""


class Guardrails(kr.KubeModel):
    """The platform team's rules; an instance outside them is Ready=False with the rule named, and nothing is done."""

    allowed_sizes: list[str] = Field(default_factory=list)
    """Empty: every size the profile defines."""
    allowed_regions: list[str] = Field(default_factory=list)
    """Empty: only the profile's default region."""
    min_backup_retention_days: int = Field(default=0, ge=0, le=35)
    allow_public_access: bool = False
    allowed_cidrs: list[str] = Field(default_factory=list)
    """Client ranges an instance may open to must lie inside one of these; empty: any private range."""
    allow_deletion_policy_delete: bool = True
    """False: instances of this class can only Retain."""


class RequestBudget(kr.KubeModel):
    """Calls per second to the provider API, shared by every instance of every class using the same account,
    endpoint and region (a token bucket)."""

    requests_per_second: float = Field(default=5.0, gt=0, le=1000)
    burst: int = Field(default=10, ge=1, le=1000)


class DatabaseClassSpec(
    kr.KubeModel,
    validations=[
        kr.cel("self.provider != 'aws' || has(self.aws)", "provider aws needs the aws profile"),
        kr.cel("self.provider != 'kanri' || has(self.kanri)", "provider kanri needs the kanri profile"),
    ],
):
    provider: Annotated[Literal["aws", "kanri"], _immutable("provider")]
    aws: AwsProfile | None = None
    kanri: KanriProfile | None = None
    guardrails: Guardrails = Field(default_factory=Guardrails)
    request_budget: RequestBudget = Field(default_factory=RequestBudget)


class DatabaseClass(kr.CustomResource, group=GROUP, version=VERSION, kind="DatabaseClass",
                    plural="databaseclasses", scope="Cluster", categories=("kanri",),
                    printer_columns=(kr.PrinterColumn("Provider", ".spec.provider"),)):  # fmt: skip
    """A provider profile, its credentials, guardrails and request budget, set by the platform team."""

    spec: DatabaseClassSpec


CUSTOM_RESOURCES: tuple[tuple[type[kr.CustomResource], ...], ...] = ((DatabaseInstance,), (DatabaseClass,))

INSTANCE = DatabaseInstance.resource.api_kind
CLASS = DatabaseClass.resource.api_kind
