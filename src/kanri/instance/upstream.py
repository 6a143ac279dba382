"""What a replica last heard of its primary's WAL end, remembered while the operator may be away (issue 29 item 11).

Every message a WAL sender sends (WAL data and keepalives alike) carries the primary's WAL end: the flush position
with WAL data, what it has sent with a keepalive; the receiver keeps the latest in ``pg_stat_wal_receiver``
(``latest_end_lsn``, with ``last_msg_receipt_time``). While the connection streams, the sender is woken by every
flush, so WAL the primary flushed reaches the replica at once: a replica streaming until a moment bounds the
primary's position as of that moment. The row vanishes when the receiver stops (the primary gone, a failover's
pause), so the manager polls it every :data:`INTERVAL` seconds and keeps the highest position per timeline with
when it last heard the primary and last saw the receiver streaming, on its own monotonic clock.

The operator uses it when its own memory of the primary was lost (:mod:`kanri.postgres.ha.position`). Only a
replica reports it (``upstream`` in ``GET /status``); the memory is dropped when this instance becomes a primary.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import structlog
from psycopg.rows import DictRow

from kanri.contract.status import Upstream
from kanri.instance.core import Core
from kanri.instance.db import fetch_one

__all__ = ["CONNECT_TIMEOUT", "INTERVAL", "QUERY", "ConnectWatchdog", "UpstreamMemory", "UpstreamWatch"]

log = structlog.get_logger("kanri.instance")

INTERVAL = 1.0
"""Seconds between two looks at the WAL receiver (the operator probes the primary every 2 s)."""

# The replica's own received position when higher: a keepalive reports what was sent, which WAL in flight can pass.
QUERY = """
SELECT greatest(latest_end_lsn, pg_last_wal_receive_lsn())::text AS position, received_tli AS timeline,
       greatest(extract(epoch FROM clock_timestamp() - last_msg_receipt_time), 0)::float8 AS heard_ago
  FROM pg_stat_wal_receiver
 WHERE status = 'streaming' AND latest_end_lsn IS NOT NULL AND latest_end_lsn > '0/0'::pg_lsn
"""


CONNECT_TIMEOUT_ENV = "KANRI_WAL_RECEIVER_CONNECT_TIMEOUT"
CONNECT_TIMEOUT = 10.0
"""Seconds a WAL receiver may wait for its primary to answer its connection before the manager restarts it.

PostgreSQL's WAL receiver honours no ``connect_timeout``, and ``tcp_user_timeout`` only ends a connection whose
packets go unacknowledged. A frozen primary's kernel still completes the handshake and acknowledges the startup
packet while its postmaster never answers — so a replica resumed towards ``-rw`` a moment before kube-proxy moved
``-rw`` to the promoted primary waited, in ``LibPQWalReceiverConnect``, for as long as the old primary stayed
frozen (seen in a CI run: the synchronous standby never reached the new primary, whose commits then waited). A
restarted receiver connects again (after ``wal_retrieve_retry_interval``) through the Service as it is now."""

CONNECTING = (
    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walreceiver' AND wait_event = 'LibPQWalReceiverConnect'"
)


RETRY_WINDOW = 30.0
"""Seconds after a resume during which a replica whose WAL receiver is not running is woken every
:data:`RETRY_EVERY` instead of waiting out ``wal_retrieve_retry_interval``."""
RETRY_EVERY = 1.0
RESUMED_CONNECT_LIMIT = 2.0
"""During :data:`RETRY_WINDOW`, seconds a WAL receiver may wait for its primary's answer before it is restarted (a
healthy primary answers in milliseconds; a connection begun while ``-rw`` still led to the failed primary's
address waits on an address nobody answers — ARP, a frozen kernel's handshake — for seconds)."""
HURRIED_INTERVAL = 0.25
"""Seconds between looks during :data:`RETRY_WINDOW` (:data:`INTERVAL` otherwise)."""

STARTUP = "SELECT pid FROM pg_stat_activity WHERE backend_type = 'startup'"
RECEIVERS = "SELECT count(*) AS n FROM pg_stat_wal_receiver"


@dataclass
class RetryNudge:
    """When to wake the startup process of a replica just resumed after a failover (pure).

    The operator resumes the surviving replicas right after the promotion, towards ``-rw``; their first connection
    often meets the Service before it has moved (no endpoint yet: refused, or the old primary's address), fails,
    and PostgreSQL then waits ``wal_retrieve_retry_interval`` (5 s) before trying again — in mode Sync, 5 s during
    which the new primary's commits wait for that standby. A SIGHUP ends the startup process's wait at once (its
    handler sets the recovery latch the wait sleeps on), so while the receiver is not running the manager wakes it
    once a second for :data:`RETRY_WINDOW` after a resume: a retry a second instead of every 5 s, only then (a
    primary that stays away is still retried every 5 s, as PostgreSQL's own setting says)."""

    every: float = RETRY_EVERY
    window: float = RETRY_WINDOW
    last: float | None = None

    def due(self, resumed_at: float | None, now: float, *, paused: bool, receiver_running: bool) -> bool:
        """Whether to wake the startup process now (and remember having done so)."""
        if resumed_at is None or paused or receiver_running or now - resumed_at > self.window:
            return False
        if self.last is not None and self.last >= resumed_at and now - self.last < self.every:
            return False
        self.last = now
        return True


@dataclass
class ConnectWatchdog:
    """Which WAL receivers have waited for their primary's answer longer than ``limit`` (pure)."""

    limit: float = CONNECT_TIMEOUT
    since: dict[int, float] = field(default_factory=dict)

    def stuck(self, connecting: list[int], now: float, limit: float | None = None) -> list[int]:
        """``connecting``: the receivers seen waiting in this look; the ones to restart (forgotten once named);
        ``limit``: this look's, instead of :attr:`limit` (shorter right after a resume)."""
        self.since = {pid: self.since.get(pid, now) for pid in connecting}
        wait = self.limit if limit is None else limit
        overdue = [pid for pid, since in self.since.items() if now - since >= wait]
        for pid in overdue:
            del self.since[pid]
        return overdue


def _bytes(lsn: str) -> int:
    high, _, low = lsn.partition("/")
    return (int(high, 16) << 32) + int(low, 16)


@dataclass
class UpstreamMemory:
    """The last evidence seen (pure; fed rows of :data:`QUERY` and the monotonic time)."""

    position: str | None = None
    timeline: int | None = None
    heard_at: float | None = None
    """When the primary's last message arrived (monotonic)."""
    streaming_at: float | None = None
    """When the receiver was last seen streaming (monotonic)."""

    def observe(self, row: dict[str, Any] | None, now: float) -> None:
        """One look: ``row`` is the streaming receiver's, None when it does not stream."""
        if row is None or not row.get("position"):
            return
        timeline = row.get("timeline")
        position = str(row["position"])
        same = timeline == self.timeline and self.position is not None
        if not same or _bytes(position) > _bytes(self.position or "0/0"):
            self.position = position  # a keepalive may report less than an earlier message: keep the highest
        self.timeline = timeline
        self.heard_at = now - max(float(row.get("heard_ago") or 0.0), 0.0)
        self.streaming_at = now

    def forget(self) -> None:
        """This instance is no replica any more: what it heard was of another primary."""
        self.position = self.timeline = self.heard_at = self.streaming_at = None

    def report(self, now: float) -> Upstream | None:
        """``upstream`` for ``GET /status`` (ages on this clock), None when nothing was heard."""
        if self.position is None or self.heard_at is None or self.streaming_at is None:
            return None
        return Upstream(position=self.position, timeline=self.timeline,
                        heard_seconds=round(max(now - self.heard_at, 0.0), 3),
                        streaming_seconds=round(max(now - self.streaming_at, 0.0), 3))  # fmt: skip


class UpstreamWatch:
    """Polls the WAL receiver every :data:`INTERVAL` on a replica, over one kept connection."""

    def __init__(self, core: Core, clock: Callable[[], float] = time.monotonic) -> None:
        self.core = core
        self.clock = clock
        self.memory = UpstreamMemory()
        self.watchdog = ConnectWatchdog(float(os.environ.get(CONNECT_TIMEOUT_ENV) or CONNECT_TIMEOUT))
        self.nudge = RetryNudge()
        self._conn: psycopg.AsyncConnection[DictRow] | None = None
        self._failed: str | None = None

    async def run(self) -> None:
        """The loop (forever). An unexpected error is logged and the loop goes on: evidence is worth a look every
        second, never the manager (and PostgreSQL with it)."""
        try:
            while True:
                try:
                    await self.look()
                except Exception as exc:
                    if repr(exc) != self._failed:  # once per distinct error, not every second
                        log.exception("upstream evidence: look failed")
                    self._failed = repr(exc)
                    await self._close()
                else:
                    self._failed = None
                await asyncio.sleep(HURRIED_INTERVAL if self.hurrying(self.clock()) else INTERVAL)
        finally:
            await self._close()

    async def look(self) -> None:
        """One look (errors only drop the connection: the next look opens another)."""
        core = self.core
        if not core.data_ready or not core.pg.running:
            await self._close()
            return
        if not core.is_replica:
            self.memory.forget()
            await self._close()
            return
        try:
            if self._conn is None or self._conn.closed:
                self._conn = await core.connect_own(timeout=2)
            cursor = await self._conn.execute(QUERY)
            row = await cursor.fetchone()
            connecting = [int(r["pid"]) for r in await (await self._conn.execute(CONNECTING)).fetchall()]
        except (psycopg.Error, OSError):
            await self._close()
            return
        now = self.clock()
        self.memory.observe(dict(row) if row is not None else None, now)
        limit = RESUMED_CONNECT_LIMIT if self.hurrying(now) else self.watchdog.limit
        for pid in self.watchdog.stuck([] if core.paused else connecting, now, limit):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # PostgreSQL's own way to stop it; the startup process starts another
                log.warning("WAL receiver restarted: its primary did not answer the connection",
                            waited_seconds=limit)  # fmt: skip
        if self._conn is not None:
            try:
                await self.hurry(self._conn, now)
            except (psycopg.Error, OSError):
                await self._close()

    def hurrying(self, now: float) -> bool:
        """Whether a resume happened less than the nudge's window ago."""
        resumed = self.core.resumed_at
        return resumed is not None and now - resumed <= self.nudge.window

    async def hurry(self, conn: psycopg.AsyncConnection[DictRow], now: float) -> None:
        """Wake the startup process when :class:`RetryNudge` says so (a resumed replica with no WAL receiver)."""
        core = self.core
        if not self.hurrying(now):
            return  # nothing to hurry: no extra queries
        running = bool((await fetch_one(conn, RECEIVERS))["n"])
        if not self.nudge.due(core.resumed_at, now, paused=core.paused, receiver_running=running):
            return
        for row in await (await conn.execute(STARTUP)).fetchall():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(row["pid"]), signal.SIGHUP)  # ends its wal_retrieve_retry_interval wait at once

    async def observe(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        """One look over the caller's connection (``GET /status`` on a replica)."""
        with contextlib.suppress(psycopg.Error):
            row = await (await conn.execute(QUERY)).fetchone()
            self.memory.observe(dict(row) if row is not None else None, self.clock())

    def report(self) -> Upstream | None:
        return self.memory.report(self.clock()) if self.core.is_replica else None

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await conn.close()
