"""The roles and the application database a primary must have, with passwords from the mounted Secrets.

Passwords go to the server as SCRAM verifiers computed client-side (libpq's PQencryptPasswordConn), inside a session
that has statement logging switched off: the plaintext never leaves the manager, the verifier never reaches a log.
ALTER ROLE takes no bind parameters, hence ``sql.Literal`` for the verifier.
"""

from __future__ import annotations

import psycopg
import structlog
from psycopg import sql
from psycopg.rows import DictRow

from kanri.instance.config import SUPERUSER, Credentials, Settings, read_credentials

log = structlog.get_logger("kanri.instance.roles")

_QUIET = (
    "SET log_statement = 'none'",
    "SET log_min_duration_statement = -1",
    "SET log_min_error_statement = 'panic'",  # a failed ALTER ROLE would otherwise echo its statement
)


async def _set_password(conn: psycopg.AsyncConnection[DictRow], role: str, password: str) -> None:
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


async def ensure_roles(conn: psycopg.AsyncConnection[DictRow], settings: Settings) -> None:
    """Make the superuser password, the replication role, the application owner and database match the Secrets.

    Idempotent; run on every start of a primary and whenever a Secret's files change. A missing Secret is skipped
    (logged): a cluster without an application database or without replicas is legal."""
    for statement in _QUIET:
        await conn.execute(statement)

    superuser = read_credentials(settings.superuser_dir)
    if superuser is not None:
        if superuser.username != SUPERUSER:
            log.warning(
                "superuser secret names another user; its password is set for postgres", username=superuser.username
            )
        await _set_password(conn, SUPERUSER, superuser.password)

    replication = read_credentials(settings.replication_dir)
    if replication is None:
        log.warning("no replication secret; replicas cannot connect", directory=str(settings.replication_dir))
    elif await _ensure_role(conn, replication, "LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE"):
        log.info("role created", role=replication.username, purpose="replication")

    app = read_credentials(settings.app_dir)
    if app is None:
        log.warning("no application secret; no application database", directory=str(settings.app_dir))
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
