"""The PostgresPooler resource: PgBouncer in front of one PostgresCluster's ``-rw`` (or ``-ro``) Service.

Its own kind (as CloudNativePG's Pooler), so a cluster can have several (one per mode or Service) and a pooler's
changes never touch the cluster's pods. docs/pooler.md says what it runs and how.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from kanri.postgres.api.v1alpha1._base import ApiModel, cel_list, reflow_descriptions
from kanri.postgres.api.v1alpha1.storage import Resources
from kanri.runtime import Conditions, CustomResource, PrinterColumn, cel

__all__ = [
    "OPERATOR_OWNED",
    "USER_PARAMETERS",
    "PoolMode",
    "PostgresPooler",
    "PostgresPoolerSpec",
    "PostgresPoolerStatus",
    "ServiceType",
]

PoolMode = Literal["transaction", "session"]
ServiceType = Literal["rw", "ro"]

USER_PARAMETERS: tuple[str, ...] = (
    "default_pool_size",
    "min_pool_size",
    "reserve_pool_size",
    "reserve_pool_timeout",
    "max_client_conn",
    "max_db_connections",
    "max_user_connections",
    "server_idle_timeout",
    "server_lifetime",
    "server_connect_timeout",
    "server_login_retry",
    "server_reset_query",
    "server_reset_query_always",
    "server_check_query",
    "server_check_delay",
    "server_round_robin",
    "query_timeout",
    "query_wait_timeout",
    "client_idle_timeout",
    "client_login_timeout",
    "idle_transaction_timeout",
    "ignore_startup_parameters",
    "application_name_add_host",
    "log_connections",
    "log_disconnections",
    "log_pooler_errors",
    "stats_period",
    "tcp_keepalive",
    "dns_max_ttl",
    "pkt_buf",
    "sbuf_loopcnt",
)
"""PgBouncer 1.18 settings a PostgresPooler may set in ``spec.parameters``; everything else is refused by the API."""

OPERATOR_OWNED: tuple[str, ...] = (
    "listen_addr",
    "listen_port",
    "unix_socket_dir",
    "auth_type",
    "auth_file",
    "auth_user",
    "auth_query",
    "pool_mode",
    "client_tls_sslmode",
    "server_tls_sslmode",
    "admin_users",
    "stats_users",
    "logfile",
    "pidfile",
)
"""Examples of the settings the operator owns (named in the API's refusal): ports, auth, TLS, users, files."""


class PostgresPoolerSpec(ApiModel):
    """Which cluster and Service to pool, how, and with how many PgBouncer pods."""

    cluster: Annotated[
        str,
        Field(min_length=1, max_length=40, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$"),
        cel(
            "self == oldSelf", "spec.cluster is immutable: create another PostgresPooler", reason="FieldValueForbidden"
        ),
    ]
    """Name of the PostgresCluster in the same namespace. Required; fixed at creation."""
    type: ServiceType = "rw"
    """The cluster's Service the pooler sends connections to: rw (the primary) or ro (the replicas that serve reads)."""
    instances: Annotated[int, Field(ge=0, le=16)] = 2
    """PgBouncer pods (the Deployment's replicas), spread across zones and nodes. 0 stops the pooler."""
    mode: PoolMode = "transaction"
    """PgBouncer's pool_mode: transaction (a server connection per transaction; session state such as SET, advisory
    locks or WITH HOLD cursors does not survive between transactions) or session (a server connection per client
    connection)."""
    parameters: Annotated[
        dict[str, Annotated[str, Field(max_length=256, pattern=r"^[^\n\r\x00]*$")]],
        Field(max_length=32),
        cel(
            f"self.all(k, k in {cel_list(USER_PARAMETERS)})",
            "spec.parameters may set only PgBouncer's pool, limit and timeout settings (docs/pooler.md); the "
            f"operator owns the others, such as {', '.join(OPERATOR_OWNED)}",
            reason="FieldValueForbidden",
        ),
    ] = Field(default_factory=dict)
    """PgBouncer settings (pgbouncer.ini's [pgbouncer] section), as strings: pool sizes, connection limits and
    timeouts (docs/pooler.md lists them). Listening, authentication, TLS, users and files are the operator's and
    refused. A change rolls the pods one at a time."""
    resources: Resources | None = None
    """Compute resources of each PgBouncer container."""


class PostgresPoolerStatus(ApiModel):
    """What the operator sees, written by it."""

    instances: Annotated[int, Field(ge=0)] | None = None
    """PgBouncer pods wanted."""
    ready_instances: Annotated[int, Field(ge=0)] | None = None
    """PgBouncer pods ready (the Deployment's readyReplicas)."""
    service: Annotated[str, Field(max_length=63)] | None = None
    """The Service clients connect to (port 5432, TLS required)."""
    auth_secret_version: Annotated[str, Field(max_length=128)] | None = None
    """The version of the pooler's auth Secret whose role the primary last confirmed, on which cluster
    (<Secret uid>/<resourceVersion>@<cluster uid>)."""
    config_hash: Annotated[str, Field(max_length=64)] | None = None
    """The hash of pgbouncer.ini the pods run with (the pod template's annotation)."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    conditions: Annotated[Conditions, Field(max_length=16)] = Field(default_factory=list)
    """Ready (with a reason: ClusterNotFound, ClusterNotReady, WaitingForCA, AuthNotConfigured, InstancesNotReady,
    Stopped, Ready) and Degraded."""


class PostgresPooler(
    CustomResource,
    group="kanri.dev",
    version="v1alpha1",
    kind="PostgresPooler",
    plural="postgrespoolers",
    short_names=("pgpooler",),
    categories=("kanri",),
    printer_columns=(
        PrinterColumn("Cluster", ".spec.cluster", description="The PostgresCluster pooled"),
        PrinterColumn("Type", ".spec.type", description="The cluster's Service it fronts"),
        PrinterColumn("Mode", ".spec.mode", description="PgBouncer's pool mode"),
        PrinterColumn("Ready", ".status.readyInstances", type="integer", description="PgBouncer pods ready"),
        PrinterColumn("Service", ".status.service", description="Where clients connect"),
        PrinterColumn("Age", ".metadata.creationTimestamp", type="date", description="When it was made"),
    ),
):
    """PgBouncer in front of a PostgresCluster: a Deployment of PgBouncer pods and a Service named after the pooler.
    Clients connect with TLS (a certificate from the cluster's CA) as the cluster's users with their own passwords;
    PgBouncer looks them up through a dedicated role and verifies the cluster's certificate (verify-full)."""

    model_config = ConfigDict(json_schema_extra=reflow_descriptions)

    spec: PostgresPoolerSpec
    status: PostgresPoolerStatus | None = None
