"""The roles and the application database a primary must have, with passwords from the checked Secrets.

Passwords go to the server as SCRAM verifiers computed client-side (libpq's PQencryptPasswordConn), inside a session
that neither logs its statements nor shows them in ``pg_stat_activity``: the plaintext never leaves the manager, the
verifier never reaches a log or another session's view (a blocked ``ALTER ROLE`` once showed the superuser's
verifier there). A stored verifier that already verifies the password is kept (same salt: a pooler's SCRAM
pass-through keys stay valid across restarts and failovers). ALTER ROLE takes no bind parameters, hence
``sql.Literal`` for the verifier.
"""

from __future__ import annotations

import psycopg
import structlog
from psycopg import sql
from psycopg.rows import DictRow

from kanri.contract.roles import REPLICATION_USER, reserved_role
from kanri.contract.scram import verifies
from kanri.instance.config import SUPERUSER, Credentials, Settings

log = structlog.get_logger("kanri.instance.roles")

QUIET = (
    "SET log_statement = 'none'",
    "SET log_min_duration_statement = -1",
    "SET log_min_error_statement = 'panic'",  # a failed ALTER ROLE would otherwise echo its statement
    "SET track_activities = off",  # pg_stat_activity.query would show the verifier while a statement runs
    # pg_stat_statements (a preloadable library) keeps utility statements' text, verifier included, on disk — and
    # with track = none not even the catalog read of the stored verifier is recorded; placeholder settings when the
    # library is not loaded
    "SET pg_stat_statements.track_utility = off",
    "SET pg_stat_statements.track = 'none'",
)
"""The session settings of every connection that sends a verifier."""


async def _set_password(conn: psycopg.AsyncConnection[DictRow], role: str, password: str) -> None:
    """A new verifier only when the stored one does not verify ``password``: the same password under a new salt
    would break the keys a connection pooler derived from the old verifier (docs/pooler.md), and it writes the
    catalog for nothing."""
    cursor = await conn.execute("SELECT rolpassword FROM pg_catalog.pg_authid WHERE rolname = %s", (role,))
    row = await cursor.fetchone()
    if row is not None and verifies(row["rolpassword"], password):
        return
    verifier = conn.pgconn.encrypt_password(password.encode(), role.encode(), b"scram-sha-256").decode()
    await conn.execute(sql.SQL("ALTER ROLE {} WITH PASSWORD {}").format(sql.Identifier(role), sql.Literal(verifier)))


async def _ensure_role(conn: psycopg.AsyncConnection[DictRow], creds: Credentials, attributes: str) -> bool:
    """Create the role if missing, then (re)set its attributes and password. True if it was created."""
    cursor = await conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (creds.username,))
    created = await cursor.fetchone() is None
    if created:
        await conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(creds.username)))
    await conn.execute(sql.SQL("ALTER ROLE {} WITH " + attributes).format(sql.Identifier(creds.username)))
    await _set_password(conn, creds.username, creds.password)
    return created


async def ensure_roles(
    conn: psycopg.AsyncConnection[DictRow],
    settings: Settings,
    *,
    superuser: Credentials | None,
    replication: Credentials | None,
    app: Credentials | None,
) -> None:
    """Make the superuser password, the replication role, the application owner and database match the Secrets.

    Each argument is a Secret that passed :mod:`kanri.instance.credentials` (None: absent or refused, reported
    there, and skipped here). Idempotent; run on every start of a primary and whenever a Secret's files change."""
    for statement in QUIET:
        await conn.execute(statement)
    if superuser is not None:
        await _set_password(conn, SUPERUSER, superuser.password)
    if replication is not None and replication.username == REPLICATION_USER:
        attributes = "LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE"
        if await _ensure_role(conn, replication, attributes):
            log.info("role created", role=REPLICATION_USER, purpose="replication")
    # a reserved name is never touched (an app Secret naming postgres once made the only superuser NOSUPERUSER);
    # the credentials check reports it, this is the last line of defence
    if app is None or reserved_role(app.username):
        return
    if await _ensure_role(conn, app, "LOGIN NOSUPERUSER NOCREATEROLE"):
        log.info("role created", role=app.username, purpose="application owner")
    cursor = await conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (settings.app_database,))
    if await cursor.fetchone() is None:
        await conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(settings.app_database), sql.Identifier(app.username)
            )
        )
        log.info("database created", database=settings.app_database, owner=app.username)
