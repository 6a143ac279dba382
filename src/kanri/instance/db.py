"""Connections from the manager to its own PostgreSQL: unix socket, peer authentication as ``postgres``."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import DictRow, dict_row

from kanri.instance.config import SUPERUSER, Settings

APPLICATION_NAME = "kanri-instance"
"""Set on every manager connection, so status can leave them out of the client connection count."""


async def connect(
    settings: Settings, *, dbname: str = "postgres", timeout: int = 5
) -> psycopg.AsyncConnection[DictRow]:
    """An autocommit connection returning dict rows."""
    return await psycopg.AsyncConnection.connect(
        host=str(settings.socket_dir),
        port=settings.pg_port,
        user=SUPERUSER,
        dbname=dbname,
        application_name=APPLICATION_NAME,
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
