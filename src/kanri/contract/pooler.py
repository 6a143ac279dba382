"""What the pooler's parts agree on: the login role PgBouncer looks users up with, and the instance action that makes
it (``POST /pooler/role``).

PgBouncer never holds the superuser's password nor an application user's: it logs in as :data:`POOLER_ROLE`, whose
only right is to call :data:`LOOKUP_FUNCTION` (``SECURITY DEFINER``, owned by the superuser) in the database a client
asks for; the function answers a login role's SCRAM verifier, so PgBouncer checks the client's own password and then
logs in to PostgreSQL with the keys the client's SCRAM exchange proved (PgBouncer's SCRAM pass-through). It answers
nothing for the superuser, replication roles or the pooler role itself: those cannot log in through a pooler.

The operator sends the role's SCRAM verifier, computed on its side from the password it generated: the plaintext
never reaches the instance, a log or the request body.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from kanri.contract.roles import IDENTIFIER_PATTERN, POOLER_ROLE  # reserved there: no application role may take it
from kanri.contract.wire import Flag, Name, Wire

__all__ = [
    "AUTH_QUERY",
    "LOOKUP_FUNCTION",
    "LOOKUP_SCHEMA",
    "POOLER_ROLE",
    "PRIMARY_CHECK_ENV",
    "SCRAM_VERIFIER_PATTERN",
    "PoolerRoleEnsured",
    "PoolerRoleRequest",
]


LOOKUP_SCHEMA = "kanri_pooler"
LOOKUP_FUNCTION = f"{LOOKUP_SCHEMA}.user_lookup"
"""``user_lookup(name text) -> (usename name, passwd text)``, in each database the pooler serves."""

AUTH_QUERY = f"SELECT usename, passwd FROM {LOOKUP_FUNCTION}($1)"
"""PgBouncer's ``auth_query``: run as :data:`POOLER_ROLE` in the database the client connects to."""

PRIMARY_CHECK_ENV = "KANRI_POOLER_PRIMARY_CHECK"
"""The pooler pods' environment variable with the libpq ``host= port= dbname=`` the agent looks through to follow
the primary (set on ``rw`` poolers only; kanri.postgres.pooler.agent.primary_watch)."""

SCRAM_VERIFIER_PATTERN = r"^SCRAM-SHA-256\$[0-9]{4,7}:[A-Za-z0-9+/=]{4,64}\$[A-Za-z0-9+/=]{44}:[A-Za-z0-9+/=]{44}$"
"""A SCRAM-SHA-256 verifier as PostgreSQL stores it (``SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>``)."""


class PoolerRoleRequest(Wire):
    """``POST /pooler/role``'s body: the role's verifier and the databases that get the lookup function."""

    verifier: Annotated[str, Field(pattern=SCRAM_VERIFIER_PATTERN)]
    databases: Annotated[list[Annotated[str, Field(pattern=IDENTIFIER_PATTERN)]], Field(min_length=1, max_length=16)]


class PoolerRoleEnsured(Wire):
    """``POST /pooler/role``'s answer: the role exists with that verifier, the function in every database named."""

    ensured: Flag = False
    role: Name = None
