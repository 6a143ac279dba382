"""A client that records what it was told: the chaos tests' witness.

:class:`Ledger` writes one row per transaction through a Service (``-rw``) and records every commit the server
acknowledged — its id, which server acknowledged it (``inet_server_addr()``), the WAL position then and when. Every
statement has a client-side deadline, as a real application's would: a connection that hangs (a frozen primary) is
abandoned and a new one opened through the Service, so the ledger follows the Service as clients do.

:class:`RoleWatcher` asks every instance directly, every ``interval`` seconds, whether it is in recovery, and — in
``write_probe`` mode — whether it takes a write: it records each instance that acknowledged a write as primary, so
"never two primaries acknowledging writes at the same time" is checked from the clients' side.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import psycopg

STATEMENT_DEADLINE = 2.0
"""Seconds an insert may take before the client gives up on the connection (the commit's fate is then unknown)."""


@dataclass(frozen=True)
class Ack:
    """One commit the server acknowledged."""

    id: int
    server: str
    lsn: str
    at: float
    """time.monotonic() when the answer arrived."""


def lsn_bytes(lsn: str) -> int:
    high, low = lsn.split("/", 1)
    return (int(high, 16) << 32) + int(low, 16)


async def _connect(host: str, user: str, password: str, database: str, timeout: float) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(
        host=host, port=5432, user=user, password=password, dbname=database, connect_timeout=max(1, int(timeout)),
        autocommit=True,
    )  # fmt: skip


async def _insert(conn: psycopg.AsyncConnection[Any], ident: int) -> tuple[str, str]:
    """One ledger row in its own transaction; the server that acknowledged it and its WAL position then."""
    cursor = await conn.execute(
        "INSERT INTO ledger (id) VALUES (%s) RETURNING host(inet_server_addr()), pg_current_wal_lsn()::text", (ident,)
    )
    row = await cursor.fetchone()
    assert row is not None
    return str(row[0]), str(row[1])


@dataclass
class Ledger:
    """Writes ``INSERT INTO ledger`` through ``host`` until stopped; see the module docstring."""

    host: str
    user: str
    password: str
    database: str = "app"
    pause: float = 0.02
    acks: list[Ack] = field(default_factory=list)
    unknown: list[int] = field(default_factory=list)
    """Ids whose commit was sent but not answered (they may or may not be there)."""
    errors: int = 0
    _next: int = 1
    _stop: asyncio.Event = field(default_factory=asyncio.Event)
    _abandoned: set[asyncio.Task[None]] = field(default_factory=set)

    async def prepare(self) -> None:
        async with await _connect(self.host, self.user, self.password, self.database, 5) as conn:
            await conn.execute(
                "CREATE TABLE IF NOT EXISTS ledger (id bigint PRIMARY KEY, at timestamptz DEFAULT now())"
            )

    async def run(self) -> None:
        conn: psycopg.AsyncConnection[Any] | None = None
        while not self._stop.is_set():
            try:
                if conn is None:
                    conn = await asyncio.wait_for(
                        _connect(self.host, self.user, self.password, self.database, 1), STATEMENT_DEADLINE
                    )
                ident = self._next
                self._next += 1
                insert = asyncio.create_task(_insert(conn, ident))
                done, _ = await asyncio.wait({insert}, timeout=STATEMENT_DEADLINE)
                if not done:
                    # Given up at the deadline, as an application does, and not waited for: psycopg answers a
                    # cancelled query by sending the server a cancel request and waiting for the query to end, up
                    # to 5 + 5 s on a frozen server — a client's artifact that would be counted as the outage.
                    self.unknown.append(ident)
                    self._abandon(insert, conn)
                    conn = None
                    self.errors += 1
                    continue
                try:
                    server, lsn = insert.result()
                except (psycopg.Error, OSError):
                    self.unknown.append(ident)
                    raise
                self.acks.append(Ack(ident, server, lsn, time.monotonic()))
            except (psycopg.Error, OSError, TimeoutError):
                self.errors += 1
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), 0.5)
                conn = None
                await asyncio.sleep(0.1)
                continue
            await asyncio.sleep(self.pause)
        if conn is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 1)
        if self._abandoned:  # each ends within psycopg's 10 s of cancel handling
            await asyncio.wait(set(self._abandoned), timeout=15)

    def _abandon(self, insert: asyncio.Task[tuple[str, str]], conn: psycopg.AsyncConnection[Any]) -> None:
        """Cancel ``insert`` in the background and close ``conn`` once it ended (closing it earlier would free its
        socket's descriptor for a new connection while the cancelled query still waits on it)."""

        async def finish() -> None:
            insert.cancel()
            with contextlib.suppress(BaseException):
                await insert
            with contextlib.suppress(Exception):
                await asyncio.wait_for(conn.close(), 1)

        task = asyncio.create_task(finish())
        self._abandoned.add(task)
        task.add_done_callback(self._abandoned.discard)

    def stop(self) -> None:
        self._stop.set()

    def acked_ids(self) -> set[int]:
        return {a.id for a in self.acks}

    def first_ack_after(self, moment: float, server: str | None = None) -> Ack | None:
        return next((a for a in self.acks if a.at > moment and (server is None or a.server == server)), None)

    def servers_overlap(self) -> list[tuple[str, str]]:
        """Pairs of servers whose acknowledgements interleave in time (two primaries acknowledging at once):
        once another server has acknowledged, an earlier one must never acknowledge again."""
        spans: dict[str, tuple[float, float]] = {}
        for ack in self.acks:
            first, last = spans.get(ack.server, (ack.at, ack.at))
            spans[ack.server] = (min(first, ack.at), max(last, ack.at))
        ordered = sorted(spans.items(), key=lambda item: item[1][0])
        return [(a, b) for i, (a, (_, a_last)) in enumerate(ordered) for b, (b_first, _) in ordered[i + 1 :]
                if b_first < a_last]  # fmt: skip


async def ids_on(host: str, user: str, password: str, database: str = "app") -> set[int] | None:
    try:
        async with await _connect(host, user, password, database, 3) as conn:
            cursor = await conn.execute("SELECT id FROM ledger")
            return {int(r[0]) for r in await cursor.fetchall()}
    except psycopg.Error:
        return None


@dataclass
class RoleWatcher:
    """Probes every instance (name -> address, re-read each round) every ``interval`` seconds."""

    addresses: Callable[[], Mapping[str, str]]
    user: str
    password: str
    database: str = "app"
    interval: float = 0.15
    write_probe: bool = False
    rounds: list[dict[str, str]] = field(default_factory=list)
    """Per round: instance -> ``primary`` / ``replica`` / ``down`` (``primary+write`` when it took a write)."""
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def probe(self, address: str) -> str:
        try:
            async with await asyncio.wait_for(_connect(address, self.user, self.password, self.database, 1), 1.0) as c:
                row = await (await asyncio.wait_for(c.execute("SELECT pg_is_in_recovery()"), 0.5)).fetchone()
                if row is None or row[0]:
                    return "replica"
                if not self.write_probe:
                    return "primary"
                await asyncio.wait_for(c.execute("INSERT INTO watcher_probe DEFAULT VALUES"), 0.5)
                return "primary+write"
        except (psycopg.Error, OSError, TimeoutError):
            return "down"

    async def prepare(self, host: str) -> None:
        async with await _connect(host, self.user, self.password, self.database, 5) as conn:
            await conn.execute("CREATE TABLE IF NOT EXISTS watcher_probe (at timestamptz DEFAULT now())")

    async def run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            current = dict(self.addresses())
            states = await asyncio.gather(*(self.probe(a) for a in current.values()))
            self.rounds.append(dict(zip(current, states, strict=True)))
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    def stop(self) -> None:
        self._stop.set()

    def double_writers(self) -> list[dict[str, str]]:
        """Rounds in which two instances acknowledged the probe's write as primaries."""
        return [r for r in self.rounds if sum(1 for s in r.values() if s == "primary+write") > 1]

    def double_primaries(self) -> list[dict[str, str]]:
        return [r for r in self.rounds if sum(1 for s in r.values() if s.startswith("primary")) > 1]
