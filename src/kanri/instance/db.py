"""Connections from the manager to its own PostgreSQL: unix socket, peer authentication as ``postgres``.

Every manager session commits with ``synchronous_commit = local``: its own writes (roles, the application database,
slots) must never wait for a synchronous standby — on a new cluster none exists yet, and the standby's clone waits
for those very writes. Every statement has a timeout, so one blocked statement cannot stall a loop for good. User
parameters in postgresql.conf apply to every session, the manager's too: the settings that could stop it from doing
its work (a read-only default, a search path, lock and idle timeouts) are pinned for its own sessions."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row

from kanri.instance.config import SUPERUSER, Settings

APPLICATION_NAME = "kanri-instance"
"""Set on every manager connection, so status can leave them out of the client connection count."""


_PINNED = " ".join(
    f"-c {name}={value}"
    for name, value in (
        ("synchronous_commit", "local"),
        ("default_transaction_read_only", "off"),
        ("search_path", "pg_catalog"),
        ("lock_timeout", "0"),
        ("idle_in_transaction_session_timeout", "0"),
    )
)
"""Session settings of every manager connection, whatever the user's parameters say."""

STATEMENT_TIMEOUT_MS = 15_000
"""The default limit of one manager statement (a lock held by a client, a stuck sync wait)."""


async def connect(
    settings: Settings, *, dbname: str = "postgres", timeout: int = 5, statement_timeout_ms: int = STATEMENT_TIMEOUT_MS
) -> psycopg.AsyncConnection[DictRow]:
    """An autocommit connection returning dict rows; ``statement_timeout_ms`` 0 means no limit."""
    return await psycopg.AsyncConnection.connect(
        host=str(settings.socket_dir),
        port=settings.pg_port,
        user=SUPERUSER,
        dbname=dbname,
        application_name=APPLICATION_NAME,
        options=f"{_PINNED} -c statement_timeout={statement_timeout_ms}",
        connect_timeout=timeout,
        autocommit=True,
        row_factory=dict_row,
    )


async def fetch_one(conn: psycopg.AsyncConnection[DictRow], query: Any, params: Any = None) -> DictRow:
    """The first row of ``query`` (which must return one)."""
    cursor = await conn.execute(query, params)
    row = await cursor.fetchone()
    if row is None:
        raise RuntimeError("query returned no row")
    return row
