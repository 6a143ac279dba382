"""Server connections left in use on the old primary after the primary changed, ended by the agent.

``RECONNECT`` (:mod:`~kanri.postgres.pooler.agent.primary_watch`) closes a server connection only once its client
releases it. A client in a query or a transaction on a primary that froze (its processes stopped: the kernel still
acknowledges every packet and keepalive probe) never gets an answer, so it never releases the connection, and no
TCP setting fails it: the client would wait until the frozen server came back. A primary cut off from the network is
failed by the kernel's keepalive and user timeout (pgbouncer.ini, :mod:`kanri.postgres.pooler.config`) within
seconds; this covers the rest.

After a renewal the agent reads ``SHOW SERVERS`` at each of its looks that reach the (new) primary. A server
connection still in use (``active``) and marked ``close_needed`` was made before the renewal; if the backend it
speaks to (``remote_pid``) is not among the primary's backends it is on another server. Seen so at two looks in a
row, its database is ended with ``KILL <db>`` and at once ``RESUME <db>`` (a RESUME that failed is tried again at
the next looks: a killed database keeps new clients waiting until then): PgBouncer 1.18 has no command that ends
one server or client connection (``KILL_CLIENT`` came later), and ``KILL`` drops every client of that database
(never of another), the hung ones with an error and the others to reconnect. The server's address cannot tell: every
server connection goes to the Service's one address. Once no such connection is left, the check stops until the
next renewal. :class:`StrandedServers` is the decision (pure); :func:`freer` the step.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from kanri.postgres.pooler.agent.metrics import console_session
from kanri.postgres.pooler.agent.primary_watch import rows_within

__all__ = ["BACKENDS", "Server", "StrandedServers", "freer", "server_of"]

BACKENDS = "SELECT pid FROM pg_stat_activity"
"""Every backend's pid on the server the agent reached (any role may read them)."""


@dataclass(frozen=True)
class Server:
    """One row of ``SHOW SERVERS``: what the decision needs of a server connection."""

    ptr: str
    database: str
    state: str
    close_needed: bool
    remote_pid: int

    @property
    def key(self) -> tuple[str, int]:
        """PgBouncer's connection object and the backend it speaks to (an object is reused for later connections)."""
        return self.ptr, self.remote_pid


def server_of(row: Mapping[str, Any]) -> Server:
    """A :class:`Server` from a ``SHOW SERVERS`` row (column names as PgBouncer 1.18 gives them)."""
    return Server(ptr=str(row["ptr"]), database=str(row["database"]), state=str(row["state"]),
                  close_needed=bool(int(row["close_needed"] or 0)), remote_pid=int(row["remote_pid"] or 0))  # fmt: skip


class StrandedServers:
    """Says which databases to end because a server connection of theirs is stuck on another server (pure)."""

    def __init__(self) -> None:
        self.armed = False
        self._suspects: frozenset[tuple[str, int]] = frozenset()

    def arm(self) -> None:
        """PgBouncer was just told to renew its server connections: look for stranded ones from now on."""
        self.armed = True

    @staticmethod
    def in_doubt(servers: Iterable[Server]) -> list[Server]:
        """Server connections made before the renewal and still in use by a client."""
        return [s for s in servers if s.state == "active" and s.close_needed]

    def observe(self, servers: Iterable[Server], primary_backends: frozenset[int]) -> set[str]:
        """One look at PgBouncer's server connections and the primary's backends (pids); the databases to end now:
        those with a connection in doubt whose backend is not on the primary, at this look and the one before.
        No connection in doubt left: nothing more to watch until :meth:`arm`."""
        doubtful = self.in_doubt(servers)
        if not doubtful:
            self.armed, self._suspects = False, frozenset()
            return set()
        elsewhere = frozenset(s.key for s in doubtful if s.remote_pid not in primary_backends)
        confirmed = elsewhere & self._suspects
        self._suspects = elsewhere - confirmed
        return {s.database for s in doubtful if s.key in confirmed}


def _quoted(database: str) -> str:
    return '"' + database.replace('"', '""') + '"'


def freer(port: int, auth_file: Path, ca_file: Path, decision: StrandedServers
          ) -> Callable[[psycopg.AsyncConnection[Any], bool], Awaitable[set[str]]]:  # fmt: skip
    """The step, given the agent's connection to the primary it just reached and whether PgBouncer was just told to
    renew (which arms ``decision``): while ``decision`` is armed, read
    ``SHOW SERVERS`` on the local PgBouncer's console (and the primary's backends when a connection is in doubt),
    and ``KILL`` then ``RESUME`` the databases it names. Returns those databases."""

    def servers() -> list[Server]:
        with console_session(port, auth_file, ca_file) as conn:
            cursor = conn.execute("SHOW SERVERS")
            names = [c.name for c in cursor.description or ()]
            return [server_of(dict(zip(names, row, strict=True))) for row in cursor.fetchall()]

    unresumed: set[str] = set()  # killed and not yet resumed: new clients of theirs would wait until RESUME

    def resume(conn: psycopg.Connection[Any]) -> None:
        for database in sorted(unresumed):
            try:
                conn.execute(f"RESUME {_quoted(database)}")
            except psycopg.errors.ProtocolViolation as exc:  # resumed already, or gone (an automatic database)
                if "is not paused" not in str(exc) and "no such database" not in str(exc):
                    raise
            unresumed.discard(database)

    def end(databases: set[str]) -> None:
        unresumed.update(databases)  # from here on, a failure leaves RESUME to the next look
        with console_session(port, auth_file, ca_file) as conn:
            for database in sorted(databases):
                conn.execute(f"KILL {_quoted(database)}")
            resume(conn)

    def resume_left() -> None:
        with console_session(port, auth_file, ca_file) as conn:
            resume(conn)

    async def free(primary: psycopg.AsyncConnection[Any], renewed: bool) -> set[str]:
        if unresumed:
            await asyncio.to_thread(resume_left)
        if renewed:
            decision.arm()
        if not decision.armed:
            return set()
        found = await asyncio.to_thread(servers)
        backends: frozenset[int] = frozenset()
        if decision.in_doubt(found):
            backends = frozenset(int(row[0]) for row in await rows_within(primary, BACKENDS))
        databases = decision.observe(found, backends)
        if databases:
            await asyncio.to_thread(end, databases)
        return databases

    return free
