"""Self-fencing of an isolated primary: a primary that can reach neither the API server nor any standby stops.

The operator fails over a primary it cannot reach; the old primary must not go on acknowledging writes meanwhile (a
partition) or after it is released (a freeze). So while this instance is a running primary, the manager checks once
a second whether it is still in contact with the cluster:

- a TCP connect to the API server (``KUBERNETES_SERVICE_HOST:KUBERNETES_SERVICE_PORT``, 0.5 s timeout), or
- a standby replied since the last check: ``max(reply_time)`` of ``pg_stat_replication`` changed. A change, not a
  comparison with the local clock: ``reply_time`` is stamped by the standby's clock, and a skewed clock must neither
  fence a healthy primary nor keep an isolated one alive. Standbys reply every second
  (``wal_receiver_status_interval = 1s``, set in :mod:`kanri.instance.conf`).

If neither has succeeded for the window (:data:`ISOLATION_WINDOW`), the primary fences itself like ``POST /fence``.
And if two passes of the check are further apart than the window, the manager itself did not run (SIGSTOP, a cgroup
freezer, a VM pause): a failover has probably happened meanwhile, so it fences itself at once, before it checks
anything. The decisions are :class:`IsolationWatch` (pure, fed with times); :class:`Probe` does the I/O.

A starved manager is not a frozen one (issue 33: another tenant's pods saturating the CPU). Time the manager spent
runnable but waiting for a CPU (the kernel's run-queue delay, ``/proc/self/schedstat``'s second field:
:func:`run_queue_wait`) does not count as a gap between passes: a frozen or stopped process is not on a run queue, so
its gap stays whole. While checks fail, that wait is credited too (a check's 0.5 s timeout fires late and wrongly
when the event loop itself waits for a CPU), but at most :data:`MAX_STARVED_CREDIT`: a primary both starved and cut
off still stops itself within ``window + MAX_STARVED_CREDIT`` (5.5 s), before the operator's detection window (6 s).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

import psycopg
from psycopg.rows import DictRow

from kanri.instance.config import Settings
from kanri.instance.db import connect, fetch_one

__all__ = [
    "ISOLATION_WINDOW",
    "MAX_STARVED_CREDIT",
    "IsolationSettings",
    "IsolationWatch",
    "Probe",
    "Via",
    "run_queue_wait",
]

ISOLATION_WINDOW = 4.0
"""Seconds without contact after which a primary fences itself (``KANRI_ISOLATION_WINDOW`` overrides it)."""

INTERVAL = 1.0
"""Seconds between two checks."""

CONNECT_TIMEOUT = 0.5
"""The API server's TCP connect must succeed within this."""

MAX_STARVED_CREDIT = 1.5
"""Seconds of run-queue wait that may extend the no-contact window: ``ISOLATION_WINDOW + MAX_STARVED_CREDIT`` stays
below the operator's ``UNREACHABLE_WINDOW`` (6 s), so an isolated primary has stopped before a replica is promoted."""

SCHEDSTAT = Path("/proc/self/schedstat")


def run_queue_wait(path: Path = SCHEDSTAT) -> float:
    """Seconds this process's main thread (the event loop's) has spent runnable but waiting for a CPU since it
    started; 0.0 where the kernel does not report it (then nothing is credited: the windows are wall time)."""
    try:
        return int(path.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


Via = Literal["apiserver", "standby"]


@dataclass(frozen=True)
class IsolationSettings:
    """Whether the check runs, against which API server address, with which window."""

    enabled: bool
    host: str
    port: int
    window: float = ISOLATION_WINDOW

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> IsolationSettings:
        """On inside a cluster (``KUBERNETES_SERVICE_HOST`` set), off outside it; ``KANRI_ISOLATION_CHECK=on|off``
        overrides either. A malformed value disables nothing silently: it raises ValueError."""
        env = os.environ if env is None else env
        host = env.get("KUBERNETES_SERVICE_HOST", "").strip()
        raw_port = env.get("KUBERNETES_SERVICE_PORT", "").strip() or "443"
        switch = env.get("KANRI_ISOLATION_CHECK", "").strip().lower()
        if switch not in ("", "on", "off"):
            raise ValueError(f"KANRI_ISOLATION_CHECK must be 'on' or 'off', not {switch!r}")
        if not raw_port.isdigit() or not 0 < int(raw_port) < 65536:
            raise ValueError(f"KUBERNETES_SERVICE_PORT must be a TCP port, not {raw_port!r}")
        raw_window = env.get("KANRI_ISOLATION_WINDOW", "").strip()
        try:
            window = float(raw_window) if raw_window else ISOLATION_WINDOW
        except ValueError:
            raise ValueError(f"KANRI_ISOLATION_WINDOW must be a number of seconds, not {raw_window!r}") from None
        if not window > INTERVAL:
            raise ValueError(f"KANRI_ISOLATION_WINDOW must be more than {INTERVAL} s")
        enabled = bool(host) if switch == "" else switch == "on"
        if enabled and not host:
            raise ValueError("KANRI_ISOLATION_CHECK=on needs KUBERNETES_SERVICE_HOST")
        return cls(enabled=enabled, host=host, port=int(raw_port), window=window)


class IsolationWatch:
    """The decisions, on monotonic times the caller passes in: when was the last contact, was the process frozen.

    ``waited`` (every method's last argument) is :func:`run_queue_wait` read at ``now``: a cumulative count, so only
    its differences matter; leaving it 0.0 makes every window plain wall time."""

    def __init__(self, window: float) -> None:
        self.window = window
        self._last_ok: float | None = None
        self._last_pass: float | None = None
        self._waited_ok = 0.0
        self._waited_pass = 0.0
        self.last_contact: datetime | None = None
        self.via: Via | None = None

    def idle(self, now: float, waited: float = 0.0) -> None:
        """Not a running primary at ``now``: nothing to check. The window starts anew when it becomes one."""
        self._last_ok = now
        self._last_pass = now
        self._waited_ok = self._waited_pass = waited

    def frozen(self, now: float, waited: float = 0.0) -> float | None:
        """At the start of a pass: the time since the previous pass that the process neither ran nor waited for a
        CPU, when it exceeds the window (the process was stopped; fence at once), else None."""
        previous, self._last_pass = self._last_pass, now
        starved, self._waited_pass = max(waited - self._waited_pass, 0.0), waited
        if self._last_ok is None:
            self._last_ok = now
            self._waited_ok = waited
        if previous is not None and now - previous - starved > self.window:
            return now - previous - starved
        return None

    def observe(self, now: float, via: Via | None, wall: datetime, waited: float = 0.0) -> float | None:
        """After the checks: ``via`` is what answered (None: nothing). Returns the seconds without contact (less the
        run-queue wait meanwhile, at most :data:`MAX_STARVED_CREDIT`) when they reach the window (fence), else None."""
        if via is not None:
            self._last_ok = now
            self._waited_ok = waited
            self.last_contact = wall
            self.via = via
            return None
        if self._last_ok is None:
            self._last_ok = now
            self._waited_ok = waited
        credit = min(max(waited - self._waited_ok, 0.0), MAX_STARVED_CREDIT)
        silent = now - self._last_ok - credit
        return silent if silent >= self.window else None

    def as_json(self) -> dict[str, Any]:
        """``/status``'s ``isolation``."""
        contact = self.last_contact.isoformat(timespec="milliseconds") if self.last_contact else None
        return {"lastContact": contact, "via": self.via}


class Probe:
    """The two checks. Keeps one connection to its own PostgreSQL (a new backend every second would be noise)."""

    def __init__(self, settings: Settings, isolation: IsolationSettings) -> None:
        self.settings = settings
        self.isolation = isolation
        self._conn: psycopg.AsyncConnection[DictRow] | None = None
        self._reply: object = None  # the last max(reply_time) seen

    async def apiserver(self) -> bool:
        """A TCP connection to the API server opens within :data:`CONNECT_TIMEOUT`."""
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, writer = await asyncio.open_connection(self.isolation.host, self.isolation.port)
        except (OSError, TimeoutError):
            return False
        writer.close()
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                await writer.wait_closed()
        except (OSError, TimeoutError):
            pass
        return True

    async def standby(self) -> bool:
        """A standby replied since the last call (``max(reply_time)`` moved). The first call only takes a reading."""
        try:
            async with asyncio.timeout(2 * CONNECT_TIMEOUT):
                if self._conn is None or self._conn.closed:
                    self._conn = await connect(self.settings, timeout=2, statement_timeout_ms=500)
                row = await fetch_one(self._conn, "SELECT max(reply_time) AS t FROM pg_stat_replication")
        except (psycopg.Error, OSError, TimeoutError):
            await self.close()
            return False
        previous, self._reply = self._reply, row["t"]
        return row["t"] is not None and previous is not None and row["t"] != previous

    async def check(self) -> Via | None:
        """Both checks at once (a pass takes at most about a second); what answered, the API server first."""
        apiserver, standby = await asyncio.gather(self.apiserver(), self.standby())
        return "apiserver" if apiserver else "standby" if standby else None

    async def close(self) -> None:
        """Drop the connection (not a primary any more, or it failed); the next check opens a new one."""
        conn, self._conn = self._conn, None
        self._reply = None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                await conn.close()
