"""Role and database names no Secret and no spec field may use.

``postgres`` is the only superuser (the instance manager connects as it); ``streaming_replica`` is the replication
role; ``kanri_pooler`` is the role PgBouncer looks users up with (:mod:`kanri.contract.pooler`); ``pg_`` names
belong to PostgreSQL's predefined roles and catalogs; ``public``, ``none`` and the ``current_*``/``session_user``
keywords are not role names at all in GRANT/ALTER ROLE. Letting an application role take one of them merges or
demotes roles the cluster relies on (a ``<cluster>-app`` Secret with ``username: postgres`` once turned the only
superuser into NOSUPERUSER).
"""

from __future__ import annotations

__all__ = [
    "IDENTIFIER_PATTERN",
    "POOLER_ROLE",
    "REPLICATION_USER",
    "RESERVED_DATABASES",
    "RESERVED_PREFIX",
    "RESERVED_ROLES",
    "SUPERUSER",
    "reserved_database",
    "reserved_role",
]

SUPERUSER = "postgres"
REPLICATION_USER = "streaming_replica"
POOLER_ROLE = "kanri_pooler"
"""The login role every pooler of a cluster uses for PgBouncer's ``auth_user`` (kanri.contract.pooler)."""

RESERVED_PREFIX = "pg_"
"""PostgreSQL refuses to create roles with this prefix; catalogs and predefined roles use it."""

RESERVED_ROLES: tuple[str, ...] = (
    SUPERUSER,
    REPLICATION_USER,
    POOLER_ROLE,
    "public",
    "none",
    "current_user",
    "current_role",
    "session_user",
)
"""Exact role names (lower case) that no application role may have."""

RESERVED_DATABASES: tuple[str, ...] = ("postgres", "template0", "template1", "information_schema")
"""Databases PostgreSQL creates itself (or schema names that would confuse every tool); plus any ``pg_`` name."""

IDENTIFIER_PATTERN = r"^[a-z_][a-z0-9_]{0,62}$"
"""An unquoted PostgreSQL identifier in lower case (at most 63 bytes, NAMEDATALEN - 1)."""


def reserved_role(name: str) -> bool:
    """Whether ``name`` (compared case-insensitively) is a role name the operator keeps for itself or PostgreSQL."""
    lowered = name.strip().lower()
    return lowered in RESERVED_ROLES or lowered.startswith(RESERVED_PREFIX)


def reserved_database(name: str) -> bool:
    """Whether ``name`` is a database name an application may not use."""
    lowered = name.strip().lower()
    return lowered in RESERVED_DATABASES or lowered.startswith(RESERVED_PREFIX)
