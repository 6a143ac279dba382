"""PgBouncer's server connections renewed when the primary behind ``-rw`` changed.

A switchover demotes the old primary and restarts it as a hot standby within a second; the ``-rw`` Service stops
routing to it a little later (the endpoints and every node's proxy follow the relabelling asynchronously). A server
connection PgBouncer opens in that window lands on the standby and stays in the pool: every write through it fails
with ``cannot execute … in a read-only transaction`` for as long as the connection lives (an hour by default), and
PgBouncer never drops a connection for that error. The same holds after a failover for any connection made while
the Service still routed to the old primary.

The agent therefore looks through the same Service itself, once a second, on one connection of its own: which
server answers, and is it in recovery. When it sees a writable primary after anything else (no answer, a standby,
a different server), it tells PgBouncer ``RECONNECT``: every server connection is closed once its client releases
it (transaction mode: at the end of the transaction), and new ones are made through the Service, which then routes
to the primary the agent just reached. The decision is :class:`PrimaryWatch` (pure); :func:`watch` is the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from kanri.contract.pooler import POOLER_ROLE, PRIMARY_CHECK_ENV
from kanri.postgres.pooler.agent.metrics import console_session, password_from_auth_file

__all__ = [
    "CHECK",
    "ENDED",
    "PRIMARY_CHECK_ENV",
    "RENEWALS",
    "Ended",
    "Free",
    "PrimaryWatch",
    "Renewals",
    "Seen",
    "checker",
    "look",
    "renewer",
    "rows_within",
    "watch",
]

CHECK = "SELECT host(inet_server_addr()), inet_server_port(), pg_is_in_recovery()"
INTERVAL = 1.0
TIMEOUT = 3.0
"""A look that takes longer counts as no answer (a frozen primary keeps the TCP connection open but never answers)."""


@dataclass(frozen=True)
class Seen:
    """One look through the Service: the server that answered (its address and port) and whether it is in recovery."""

    server: str
    in_recovery: bool


class PrimaryWatch:
    """Says when PgBouncer's server connections may be on a server that is not the primary (pure)."""

    def __init__(self) -> None:
        self.primary: str | None = None
        self.disturbed = False

    def observe(self, seen: Seen | None) -> bool:
        """Take one look (None: nothing answered in time); True when PgBouncer should renew its server connections
        now: a writable primary answers after anything else since the last primary was seen, or a different one.
        Before any primary was seen only a standby disturbs: no answer while the cluster or the lookup role is not
        there yet is the pod starting, and a renewal then would only cost PgBouncer its first connections."""
        if seen is None or seen.in_recovery:
            self.disturbed = self.disturbed or seen is not None or self.primary is not None
            return False
        renew = self.disturbed or (self.primary is not None and seen.server != self.primary)
        self.primary, self.disturbed = seen.server, False
        return renew

    def not_renewed(self) -> None:
        """The renewal did not reach PgBouncer: it is asked again at the next look."""
        self.disturbed = True


class Renewals(Collector):
    """How many times the agent had PgBouncer renew its server connections, as one counter family."""

    def __init__(self) -> None:
        self.count = 0

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("kanri_pgbouncer_server_renewals", "Times the agent told PgBouncer to renew its "
                                  "server connections because the primary behind the Service changed (RECONNECT)",
                                  value=self.count)  # fmt: skip


RENEWALS = Renewals()
"""Registered by the agent's ``__main__`` in its own registry, beside PgBouncer's metrics."""


class Ended(Collector):
    """How many times the agent ended a database's clients because a server connection was left on the old
    primary (:mod:`~kanri.postgres.pooler.agent.stranded`), as one counter family."""

    def __init__(self) -> None:
        self.count = 0

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily("kanri_pgbouncer_stranded_kills", "Times the agent ended a database's clients "
                                  "(KILL, RESUME) because a server connection stayed in use on a server that is no "
                                  "longer the primary", value=self.count)  # fmt: skip


ENDED = Ended()
"""Registered beside :data:`RENEWALS`."""

Free = Callable[[psycopg.AsyncConnection[Any], bool], Awaitable[set[str]]]
"""The step that ends server connections left on the old primary (:func:`.stranded.freer`)."""


def checker(conninfo: str, auth_file: Path, ca_file: Path, sslmode: str = "verify-full"
            ) -> Callable[[], Awaitable[psycopg.AsyncConnection[Any]]]:  # fmt: skip
    """Opens the agent's own connection through the Service PgBouncer uses: as the lookup role, TLS verified
    against the cluster's CA as PgBouncer's own server connections are (``sslmode``: a test's server has no TLS)."""

    async def connect() -> psycopg.AsyncConnection[Any]:
        password = password_from_auth_file(auth_file)
        return await psycopg.AsyncConnection.connect(conninfo, user=POOLER_ROLE, password=password,
                                                     sslmode=sslmode, sslrootcert=str(ca_file),
                                                     connect_timeout=int(TIMEOUT), autocommit=True,
                                                     application_name="kanri-pooler-agent")  # fmt: skip

    return connect


def renewer(port: int, auth_file: Path, ca_file: Path) -> Callable[[], None]:
    """``RECONNECT`` on the local PgBouncer's admin console (the lookup role is an ``admin_users`` for it)."""

    def renew() -> None:
        with console_session(port, auth_file, ca_file) as conn:
            conn.execute("RECONNECT")

    return renew


async def look(connection: psycopg.AsyncConnection[Any]) -> Seen:
    """The server behind ``connection`` and whether it is in recovery, within :data:`TIMEOUT`. Past it the
    connection is abandoned (closed, then TimeoutError): cancelling the query would have psycopg ask the silent
    server to cancel it and wait for that too, 5 s more (measured: 8 s a look instead of 3)."""

    rows = await rows_within(connection, CHECK)
    if not rows:
        raise psycopg.OperationalError("the check returned no row")
    return Seen(f"{rows[0][0]}:{rows[0][1]}", bool(rows[0][2]))


async def rows_within(connection: psycopg.AsyncConnection[Any], query: str) -> list[tuple[Any, ...]]:
    """``query``'s rows within :data:`TIMEOUT`; past it ``connection`` is closed and TimeoutError raised (see
    :func:`look` for why it is not cancelled)."""

    async def run() -> list[tuple[Any, ...]]:
        cursor = await connection.execute(query)
        return [tuple(row) for row in await cursor.fetchall()]

    task = asyncio.ensure_future(run())
    done, _ = await asyncio.wait({task}, timeout=TIMEOUT)
    if not done:
        connection.pgconn.finish()  # no longer ACTIVE: psycopg sends no cancel request when cancelled now
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, psycopg.Error, OSError):
            await task
        raise TimeoutError(f"no answer within {TIMEOUT} s")
    return task.result()


async def watch(connect: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]], renew: Callable[[], None],
                interval: float = INTERVAL, stop: asyncio.Event | None = None,
                decision: PrimaryWatch | None = None, free: Free | None = None) -> None:  # fmt: skip
    """Look every ``interval`` through one connection (``connect`` opens it through the Service) and call ``renew``
    (PgBouncer's ``RECONNECT``) when ``decision`` (a new :class:`PrimaryWatch`) says so, until ``stop`` is set.
    After no answer or a standby the connection is dropped, so the next look goes through the Service afresh.
    After each look that reached a writable primary, ``free`` (:func:`~kanri.postgres.pooler.agent.stranded.freer`)
    ends what stayed in use on the old one, given that connection and whether PgBouncer renewed just now."""
    decision = decision or PrimaryWatch()
    connection: psycopg.AsyncConnection[Any] | None = None
    stop = stop or asyncio.Event()
    while not stop.is_set():
        seen: Seen | None = None
        try:
            if connection is None:
                connection = await asyncio.wait_for(connect(), TIMEOUT + 1)
            seen = await look(connection)
        except (psycopg.Error, OSError, TimeoutError):
            seen = None
        if (seen is None or seen.in_recovery) and connection is not None:
            await _close(connection)
            connection = None
        renewed = False
        if decision.observe(seen):
            assert seen is not None
            try:
                await asyncio.to_thread(renew)
            except (psycopg.Error, OSError) as exc:
                decision.not_renewed()
                print(f"pooler agent: the primary is {seen.server}; RECONNECT failed: {type(exc).__name__}",
                      file=sys.stderr, flush=True)  # fmt: skip
            else:
                renewed = True
                RENEWALS.count += 1
                print(f"pooler agent: the primary is {seen.server}; PgBouncer renews its server connections",
                      file=sys.stderr, flush=True)  # fmt: skip
        if free is not None and connection is not None and seen is not None and not seen.in_recovery:
            await _free(free, connection, renewed, seen)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval)
    if connection is not None:
        await _close(connection)


async def _free(free: Free, connection: psycopg.AsyncConnection[Any], renewed: bool, seen: Seen) -> None:
    try:
        ended = await asyncio.wait_for(free(connection, renewed), TIMEOUT)
    except (psycopg.Error, OSError, TimeoutError) as exc:
        print(f"pooler agent: looking for server connections left on the old primary failed: {type(exc).__name__}",
              file=sys.stderr, flush=True)  # fmt: skip
        return
    for database in sorted(ended):
        ENDED.count += 1
        print(f"pooler agent: the primary is {seen.server}; a server connection of database {database} stayed in "
              "use on another server: PgBouncer ended the database's clients (KILL, RESUME)",
              file=sys.stderr, flush=True)  # fmt: skip


async def _close(connection: psycopg.AsyncConnection[Any]) -> None:
    with contextlib.suppress(psycopg.Error, OSError, TimeoutError):
        await asyncio.wait_for(connection.close(), TIMEOUT)
