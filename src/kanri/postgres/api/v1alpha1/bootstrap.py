"""How a new cluster gets its first data: an empty database, or a restore from another cluster's backups."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field

from kanri.postgres.api.v1alpha1._base import ApiModel
from kanri.postgres.api.v1alpha1.backup import Repository
from kanri.runtime import cel

__all__ = ["Bootstrap", "InitDB", "Recovery"]

# An unquoted PostgreSQL identifier in lower case (at most 63 bytes, NAMEDATALEN - 1).
_IDENTIFIER = r"^[a-z_][a-z0-9_]{0,62}$"
# DNS-1035 label: what a PostgresCluster may be named (see cluster.py).
_CLUSTER_NAME = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class InitDB(ApiModel):
    """Start from an empty cluster (initdb) with one application database owned by one application role, whose
    password the operator generates and keeps in a Secret."""

    database: Annotated[
        str,
        Field(max_length=63, pattern=_IDENTIFIER),
        cel(
            "!(self in ['postgres', 'template0', 'template1'])",
            message_expression="'database \"%s\" is created by PostgreSQL itself; choose another name'.format([self])",
        ),
    ] = "app"
    """Name of the application database. Default app."""

    owner: Annotated[
        str,
        Field(max_length=63, pattern=_IDENTIFIER),
        cel(
            "self != 'postgres' && !self.startsWith('pg_')",
            message_expression='\'owner "%s" is reserved (postgres is the superuser, pg_ prefixes belong to '
            "PostgreSQL); choose another role name'.format([self])",
        ),
    ] = "app"
    """Role that owns the application database (not a superuser). Default app."""


class Recovery(ApiModel):
    """Start from a backup of another cluster, optionally stopping at a point in time (point-in-time recovery).
    The restored cluster gets a new timeline and never writes into the source's backups."""

    source: Annotated[str, Field(min_length=1, max_length=63, pattern=_CLUSTER_NAME)]
    """Name of the PostgresCluster whose backups to restore. Required. The backups are read from repository when
    it is given, otherwise from the repository of the PostgresCluster with this name in the same namespace."""

    repository: Repository | None = None
    """Where the source's backups are, for a source that no longer exists (its backups were retained). Default: the
    repository named in the source PostgresCluster's spec.backup."""

    backup: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    """The base backup to start from, by name. Default: the latest one that finished before targetTime (or the
    latest one without targetTime)."""

    target_time: datetime | None = None
    """Replay archived WAL up to this moment, RFC 3339 (e.g. 2026-05-01T12:00:00Z), and stop there. Default: replay
    all archived WAL (the latest recoverable state)."""


class Bootstrap(
    ApiModel,
    validations=[
        cel(
            "has(self.initdb) != has(self.recovery)",
            "bootstrap needs exactly one of initdb or recovery",
        ),
    ],
):
    """How the cluster's data is created: exactly one of initdb (default: database app owned by app) or recovery.
    Used only when the cluster is created, so it cannot be changed afterwards (refused by the API server)."""

    initdb: InitDB | None = None
    recovery: Recovery | None = None
