"""``POST /pooler/role``: the connection pooler's lookup role and function on the primary
(:mod:`kanri.contract.pooler`).

The role gets the verifier the operator sent (never a plaintext password), in a session that neither logs its
statements nor shows them (the same settings as :mod:`kanri.instance.roles`). In each database named, a schema owned
by the superuser holds ``user_lookup``, a ``SECURITY DEFINER`` function that reads ``pg_authid`` for one ordinary
login role; only the pooler role may run it. Idempotent: the operator asks again whenever its Secret changes.
"""

from __future__ import annotations

from typing import Any

import psycopg
import structlog
from psycopg import sql
from pydantic import ValidationError

from kanri.contract.pooler import LOOKUP_SCHEMA, POOLER_ROLE, PoolerRoleEnsured, PoolerRoleRequest
from kanri.contract.roles import SUPERUSER
from kanri.instance.core import Core
from kanri.instance.db import connect
from kanri.instance.http_api import ActionError
from kanri.instance.problems import one_line
from kanri.instance.roles import QUIET

__all__ = ["LOOKUP_SQL", "PoolerRole"]

log = structlog.get_logger("kanri.instance.pooler")

LOOKUP_SQL = """
CREATE OR REPLACE FUNCTION {schema}.user_lookup(name text)
RETURNS TABLE (usename name, passwd text) LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $$
  SELECT rolname, rolpassword FROM pg_catalog.pg_authid
   WHERE rolname = name AND rolcanlogin AND NOT rolsuper AND NOT rolreplication AND NOT rolbypassrls
     AND rolname <> {pooler} AND (rolvaliduntil IS NULL OR rolvaliduntil > now())
$$
"""
"""The lookup: one ordinary login role's verifier (never a superuser's, a replication role's or the pooler's); no
row at all for any other name (a row of NULLs would make PgBouncer answer "bouncer config error")."""


class PoolerRole:
    """The action's backend: needs a running primary."""

    def __init__(self, core: Core) -> None:
        self.core = core

    async def ensure(self, body: dict[str, Any]) -> dict[str, Any]:
        """Create or update the pooler role with the verifier, and the lookup function in each database."""
        try:
            request = PoolerRoleRequest.model_validate(body)
        except ValidationError:
            raise ActionError(400, "the body needs a SCRAM-SHA-256 verifier and the databases") from None
        core = self.core
        if not core.running_primary():
            raise ActionError(409, "not a running primary: only the primary can create roles")
        try:
            await self._role(request.verifier)
            for database in request.databases:
                await self._lookup(database)
        except psycopg.OperationalError as exc:
            raise ActionError(503, f"postgres does not answer: {one_line(str(exc))[:200]}") from None
        log.info("pooler role ensured", role=POOLER_ROLE, databases=request.databases)
        return PoolerRoleEnsured(ensured=True, role=POOLER_ROLE).as_json()

    async def _role(self, verifier: str) -> None:
        async with await connect(self.core.settings, timeout=3) as conn:
            for statement in QUIET:
                await conn.execute(statement)
            role = sql.Identifier(POOLER_ROLE)
            cursor = await conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (POOLER_ROLE,))
            if await cursor.fetchone() is None:
                await conn.execute(sql.SQL("CREATE ROLE {}").format(role))
            attributes = "LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT"
            await conn.execute(sql.SQL("ALTER ROLE {} WITH " + attributes).format(role))
            # ALTER ROLE takes no bind parameters: the verifier as a literal, in this quiet session only
            await conn.execute(sql.SQL("ALTER ROLE {} WITH PASSWORD {}").format(role, sql.Literal(verifier)))

    async def _lookup(self, database: str) -> None:
        async with await connect(self.core.settings, dbname=database, timeout=3) as conn, conn.transaction():
            schema, role = sql.Identifier(LOOKUP_SCHEMA), sql.Identifier(POOLER_ROLE)
            await conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {} AUTHORIZATION {}").format(
                schema, sql.Identifier(SUPERUSER)))  # fmt: skip
            await conn.execute(sql.SQL("REVOKE ALL ON SCHEMA {} FROM PUBLIC").format(schema))
            await conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(schema, role))
            await conn.execute(sql.SQL(LOOKUP_SQL).format(schema=schema, pooler=sql.Literal(POOLER_ROLE)))
            function = sql.SQL("{}.user_lookup(text)").format(schema)
            await conn.execute(sql.SQL("REVOKE ALL ON FUNCTION {} FROM PUBLIC").format(function))
            await conn.execute(sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(function, role))
