"""The postmaster as a child process: start it, stop it the way PostgreSQL wants, wait until it takes connections.

``postgres -D PGDATA`` runs directly under the manager (not ``pg_ctl start``), so the manager sees it exit and can
restart it. Its stdout and stderr are the manager's stderr: PostgreSQL's own log reaches the container log untouched.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import psycopg
import structlog

from kanri.instance.config import Settings
from kanri.instance.db import connect
from kanri.instance.postgres_log import LineWatcher, LogPipe

log = structlog.get_logger("kanri.instance.postgres")


def remove_stale_pidfile(pgdata: Path) -> bool:
    """Remove ``postmaster.pid`` when the PID in it is not a PostgreSQL process; True if removed.

    After a container restart the recorded PID can belong to an unrelated process of the new container; PostgreSQL
    then refuses to start ("is another postmaster running?"). A live PostgreSQL process keeps its file (two
    postmasters on one data directory would corrupt it), and so does a PID we may not inspect."""
    path = pgdata / "postmaster.pid"
    try:
        first = path.read_text().split("\n", 1)[0].strip()
    except FileNotFoundError:
        return False
    if first.isdigit():
        try:
            argv0 = Path(f"/proc/{first}/cmdline").read_bytes().split(b"\0", 1)[0]
        except FileNotFoundError:
            argv0 = b""
        except OSError:
            return False
        if Path(argv0.decode(errors="replace").split(":", 1)[0]).name in ("postgres", "postmaster"):
            return False
    path.unlink(missing_ok=True)
    log.warning("removed a stale postmaster.pid", recorded_pid=first)
    return True


class PostgresProcess:
    """One postmaster at a time; ``process`` is the current one (a new object after every start)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.process: asyncio.subprocess.Process | None = None
        # kanri:disk-full — PostgreSQL's log passes through the manager so watchers (DiskFull) can read it
        self.log_watchers: list[LineWatcher] = []
        self._log: LogPipe | None = None

    @property
    def running(self) -> bool:
        """A postmaster was started and has not exited."""
        return self.process is not None and self.process.returncode is None

    async def start(self) -> asyncio.subprocess.Process:
        """Spawn the postmaster (it does not wait for it to accept connections; see ``wait_accepting``)."""
        remove_stale_pidfile(self.settings.pgdata)
        pipe = LogPipe(self.log_watchers) if self.log_watchers else None  # kanri:disk-full
        out = pipe.write_fd if pipe is not None else sys.stderr.fileno()
        try:
            self.process = await asyncio.create_subprocess_exec(
                self.settings.binary("postgres"),
                "-D",
                str(self.settings.pgdata),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,  # a terminal's Ctrl-C reaches the manager only; it decides how it stops
            )
        except BaseException:
            if pipe is not None:
                pipe.abandon()
            raise
        if pipe is not None:
            pipe.start()
            self._log = pipe
        log.info("postgres started", pid=self.process.pid)
        return self.process

    async def stop(self, timeout: float = 60.0) -> int | None:
        """Fast shutdown (SIGINT: abort transactions, checkpoint, exit); immediate (SIGQUIT) after ``timeout``.
        Returns the exit code, or None when nothing was running."""
        proc = self.process
        if proc is None or proc.returncode is not None:
            return None if proc is None else proc.returncode
        log.info("postgres stopping", pid=proc.pid, mode="fast")
        proc.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(timeout):
                code = await proc.wait()
        except TimeoutError:
            log.warning("postgres did not stop in time; immediate shutdown", pid=proc.pid, timeout=timeout)
            proc.send_signal(signal.SIGQUIT)
            code = await proc.wait()
        log.info("postgres stopped", pid=proc.pid, exit_code=code)
        return code

    async def wait_accepting(self, timeout: float | None = None) -> None:
        """Return once a connection over the unix socket succeeds; raise RuntimeError if the postmaster exits first.

        No default timeout: crash recovery or reaching consistency on a replica can take as long as it takes."""
        proc = self.process
        if proc is None:
            raise RuntimeError("postgres is not started")
        async with asyncio.timeout(timeout):
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"postgres exited with code {proc.returncode} during startup")
                try:
                    conn = await connect(self.settings, timeout=2)
                except psycopg.OperationalError:
                    await asyncio.sleep(0.2)
                    continue
                await conn.close()
                return
