"""How a new cluster gets its first data: an empty database, or a restore from another cluster's backups."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field

from kanri.contract.roles import (
    IDENTIFIER_PATTERN,
    POOLER_ROLE,
    REPLICATION_USER,
    RESERVED_DATABASES,
    RESERVED_PREFIX,
    RESERVED_ROLES,
    SUPERUSER,
)
from kanri.postgres.api.v1alpha1._base import ApiModel, cel_list
from kanri.postgres.api.v1alpha1.backup import Repository
from kanri.runtime import cel

__all__ = ["Bootstrap", "InitDB", "Recovery"]

# DNS-1035 label: what a PostgresCluster may be named (see cluster.py).
_CLUSTER_NAME = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


# The identifier pattern requires lower case, so exact comparisons with the contract's lower-case lists suffice.
_RESERVED_ROLE = f"self in {cel_list(RESERVED_ROLES)} || self.startsWith('{RESERVED_PREFIX}')"
_RESERVED_DATABASE = f"self in {cel_list(RESERVED_DATABASES)} || self.startsWith('{RESERVED_PREFIX}')"
_KEYWORDS = ", ".join(name for name in RESERVED_ROLES if name not in (SUPERUSER, REPLICATION_USER, POOLER_ROLE))
_NOT_RESERVED_ROLE = cel(
    f"!({_RESERVED_ROLE})",
    message_expression=f'\'owner "%s" is reserved ({SUPERUSER} is the only superuser, {REPLICATION_USER} '
    f"replicates, {POOLER_ROLE} looks users up for the poolers, {_KEYWORDS} are keywords where a role name goes, "
    f"and {RESERVED_PREFIX} names belong to "
    "PostgreSQL); choose another role name'.format([self])",
    reason="FieldValueForbidden",
)
_NOT_RESERVED_DATABASE = cel(
    f"!({_RESERVED_DATABASE})",
    message_expression=f'\'database "%s" is reserved ({", ".join(RESERVED_DATABASES)} and every {RESERVED_PREFIX} '
    "name belong to PostgreSQL: catalogs, templates, schemas); choose another name'.format([self])",
    reason="FieldValueForbidden",
)


class InitDB(ApiModel):
    """Start from an empty cluster (initdb) with one application database owned by one application role, whose
    password the operator generates and keeps in a Secret."""

    database: Annotated[str, Field(max_length=63, pattern=IDENTIFIER_PATTERN), _NOT_RESERVED_DATABASE] = "app"
    """Name of the application database. Default app. Not postgres, template0, template1, information_schema or a
    pg_ name (PostgreSQL's own)."""

    owner: Annotated[str, Field(max_length=63, pattern=IDENTIFIER_PATTERN), _NOT_RESERVED_ROLE] = "app"
    """Role that owns the application database (not a superuser). Default app. Not postgres, streaming_replica,
    kanri_pooler, public, none, current_user, current_role, session_user or a pg_ name (the operator's or
    PostgreSQL's own)."""


class Recovery(
    ApiModel,
    validations=[
        cel(
            "(has(self.targetTime) ? 1 : 0) + (has(self.targetLSN) ? 1 : 0)"
            " + (has(self.targetImmediate) && self.targetImmediate ? 1 : 0) <= 1",
            "recovery takes at most one of targetTime, targetLSN and targetImmediate",
        ),
    ],
):
    """Start from a backup of another cluster, optionally stopping at a point in time (point-in-time recovery).
    The restored cluster gets a new timeline and never writes into the source's backups."""

    source: Annotated[str, Field(min_length=1, max_length=63, pattern=_CLUSTER_NAME)]
    """Name of the PostgresCluster whose backups to restore. Required. The backups are read from repository when
    it is given, otherwise from the repository of the PostgresCluster with this name in the same namespace."""

    repository: Repository | None = None
    """Where the source's backups are, for a source that no longer exists (its backups were retained). Default: the
    repository named in the source PostgresCluster's spec.backup."""

    backup: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    """The base backup to start from, by its id (as status.backup and PostgresBackup show it). Default: the latest
    one that finished before targetTime or targetLSN (or the latest one without a target)."""

    target_time: datetime | None = None
    """Replay archived WAL up to this moment, RFC 3339 (e.g. 2026-05-01T12:00:00Z), and stop there. Default: replay
    all archived WAL (the latest recoverable state)."""

    target_lsn: Annotated[str | None, Field(alias="targetLSN", pattern=r"^[0-9A-Fa-f]{1,8}/[0-9A-Fa-f]{1,8}$")] = None
    """Replay archived WAL up to this WAL position (e.g. 0/3000060, as pg_current_wal_lsn() shows it) and stop
    there. Default: none."""

    target_immediate: bool | None = None
    """Stop as soon as the base backup is consistent, replaying no WAL beyond its end. Default false."""


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
