"""The instance manager: prepare the data directory, run PostgreSQL, keep it configured, answer the operator.

Three loops share one lifecycle lock (nothing starts, stops or promotes PostgreSQL concurrently):
the supervisor (start; restart with back-off after an unexpected exit), the config loop (every ``config_interval``:
config file and Secrets → files → reload; roles and slots on a primary) and the HTTP handlers' actions.
SIGTERM/SIGINT → fast shutdown of PostgreSQL → exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import signal
import time
from typing import Any

import psycopg
import structlog
from aiohttp import web
from psycopg.rows import DictRow

from kanri.instance import status as status_queries
from kanri.instance.bootstrap import clone, discard_partial, has_data, initdb
from kanri.instance.conf import (
    rejected_parameters,
    render_hba,
    render_passfile,
    render_postgresql_conf,
    write_if_changed,
)
from kanri.instance.config import ClusterConfig, Settings, read_credentials
from kanri.instance.db import connect, fetch_one
from kanri.instance.http_api import ActionError, build_app
from kanri.instance.postgres_process import PostgresProcess
from kanri.instance.roles import ensure_roles
from kanri.instance.slots import reconcile_slots

log = structlog.get_logger("kanri.instance")

MAX_BACKOFF = 30.0
"""Longest wait before restarting a PostgreSQL that keeps dying."""

STABLE_RUN = 60.0
"""A PostgreSQL that ran this long before dying is restarted after the shortest back-off again."""


class InstanceManager:
    """One instance: see the module docstring. ``run()`` is the whole life of the process."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.pg = PostgresProcess(settings)
        self.config = ClusterConfig()
        self._errors: dict[str, str] = {}  # source → message, oldest first; see last_error
        self.restart_count = 0
        self._lock = asyncio.Lock()
        self._stop = asyncio.Event()
        self._shutting_down = False
        self._data_ready = False
        self._roles_ok = False  # ensure_roles succeeded since start or the last Secret change
        self._synced: object = None  # the postmaster the config loop last reached (to sync right after a start)
        self._config_raw: bytes | None = None
        self._secrets_digest = b""
        self._pending: list[str] = []

    # ---- process life -------------------------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve HTTP, bootstrap, run PostgreSQL until SIGTERM/SIGINT; return the exit code (0 after a clean stop)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_shutdown)
        runner = web.AppRunner(build_app(self), access_log=None)
        await runner.setup()
        # HTTP first: liveness must answer during a long pg_basebackup
        await web.TCPSite(runner, self.settings.http_listen, self.settings.http_port).start()
        log.info("instance manager started", http_port=self.settings.http_port, pgdata=str(self.settings.pgdata))
        code = 0
        main = asyncio.create_task(self._main())
        stop = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait([main, stop], return_when=asyncio.FIRST_COMPLETED)
            if main.done() and not main.cancelled() and (exc := main.exception()) is not None:
                cause = exc
                while isinstance(cause, BaseExceptionGroup):  # from a loop's TaskGroup: name the real error
                    cause = cause.exceptions[0]
                log.error("instance manager failed", error=str(cause), exc_info=exc)
                code = 1
        finally:
            self._shutting_down = True
            main.cancel()
            stop.cancel()
            await asyncio.gather(main, stop, return_exceptions=True)
            async with self._lock:
                await self.pg.stop()
            await runner.cleanup()
        log.info("instance manager stopped", exit_code=code)
        return code

    def request_shutdown(self) -> None:
        """Stop: fast shutdown of PostgreSQL, then exit (signal handler)."""
        log.info("shutdown requested")
        self._shutting_down = True
        self._stop.set()

    async def _main(self) -> None:
        self._read_config()
        discard_partial(self.settings)
        if not has_data(self.settings.pgdata):
            if self.settings.bootstrap == "primary":
                await initdb(self.settings)
            else:
                await clone(self.settings, on_error=lambda message: self._record_error("bootstrap", message))
            log.info("data directory ready", bootstrap=self.settings.bootstrap)
            self._clear_error("bootstrap")
        self._data_ready = True
        async with asyncio.TaskGroup() as group:
            group.create_task(self._supervise())
            group.create_task(self._config_loop())

    async def _supervise(self) -> None:
        """Start PostgreSQL; whenever it exits without being asked to, start it again after a growing pause."""
        async with self._lock:
            self._write_files()
            proc = await self.pg.start()
        delay = 1.0
        while True:
            started = time.monotonic()
            code = await proc.wait()
            async with self._lock:
                if self._shutting_down:
                    return
                if self.pg.process is not proc:  # restarted on purpose (POST /restart)
                    assert self.pg.process is not None
                    proc = self.pg.process
                    continue
                self.restart_count += 1
                delay = 1.0 if time.monotonic() - started > STABLE_RUN else delay
                self._record_error("postgres", f"postgres exited unexpectedly with code {code}")
                log.error("postgres exited unexpectedly", exit_code=code, restart_in=delay, restarts=self.restart_count)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)
            async with self._lock:
                if self.pg.process is not proc and self.pg.running:
                    assert self.pg.process is not None
                    proc = self.pg.process
                    continue
                self._write_files()
                proc = await self.pg.start()

    # ---- configuration ------------------------------------------------------------------------------------------

    @property
    def last_error(self) -> str | None:
        """The most recent problem that still holds (None once every source has recovered)."""
        return next(reversed(self._errors.values()), None)

    def _record_error(self, source: str, message: str) -> None:
        self._errors.pop(source, None)  # re-insert: the newest comes last
        self._errors[source] = message

    def _clear_error(self, source: str) -> None:
        self._errors.pop(source, None)

    def _read_config(self) -> bool:
        """Re-read the config file; True when its content changed and parsed. A bad file keeps the last good one."""
        try:
            raw = self.settings.config_file.read_bytes()
        except FileNotFoundError:
            raw = b""
        if raw == self._config_raw:
            return False
        first = self._config_raw is None
        self._config_raw = raw
        if not raw:
            log.warning("no cluster config file; using defaults", path=str(self.settings.config_file))
        try:
            self.config = ClusterConfig.parse(raw)
        except ValueError as exc:
            self._record_error("config", str(exc))
            log.error("cluster config rejected; keeping the previous one", reason=str(exc))
            return False
        self._clear_error("config")
        if rejected := rejected_parameters(self.config):
            log.warning("parameters managed by the operator are ignored", parameters=rejected)
        log.info(
            "cluster config loaded" if first else "cluster config changed",
            instances=list(self.config.instances),
            parameters=sorted(self.config.parameters),
            synchronous_standbys=self.config.synchronous_standbys,
        )
        return True

    def _read_secrets(self) -> bool:
        """True when any Secret file changed since the last call (compares a digest, keeps no copy)."""
        digest = hashlib.sha256()
        for directory in (self.settings.superuser_dir, self.settings.replication_dir, self.settings.app_dir):
            for name in ("username", "password"):
                with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                    digest.update((directory / name).read_bytes())
                digest.update(b"\0")
        value = digest.digest()
        changed = value != self._secrets_digest
        self._secrets_digest = value
        return changed

    @property
    def _is_replica(self) -> bool:
        return (self.settings.pgdata / "standby.signal").exists()

    def _write_files(self) -> bool:
        """postgresql.conf, pg_hba.conf (in PGDATA) and the passfile for the current role; True if a conf changed."""
        replication = read_credentials(self.settings.replication_dir)
        conf = render_postgresql_conf(self.settings, self.config, replica=self._is_replica, replication=replication)
        changed = write_if_changed(self.settings.pgdata / "postgresql.conf", conf)
        changed |= write_if_changed(self.settings.pgdata / "pg_hba.conf", render_hba(replication))
        self.settings.socket_dir.mkdir(parents=True, exist_ok=True)
        write_if_changed(self.settings.passfile, render_passfile(replication))  # libpq reads it on each connect
        return changed

    async def _config_loop(self) -> None:
        while True:
            try:
                await self._sync()
            except (psycopg.Error, OSError) as exc:
                self._record_error("sync", f"sync failed: {exc}")
                log.warning("sync failed", error=str(exc))
            except Exception as exc:  # a bug here must not take PostgreSQL down with the manager: report, go on
                self._record_error("sync", f"sync failed: {exc!r}")
                log.exception("sync failed unexpectedly")
            # right after a start, poll quickly until the new postmaster has been synced once
            fast = self.pg.running and self._synced is not self.pg.process
            await asyncio.sleep(0.2 if fast else self.settings.config_interval)

    async def _sync(self) -> None:
        """One pass: config and Secrets → files → reload; pending-restart report; roles and slots on a primary."""
        config_changed = self._read_config()
        secrets_changed = self._read_secrets()
        if secrets_changed:
            self._roles_ok = False
        async with self._lock:
            files_changed = self._write_files()
            process = self.pg.process
            if not self.pg.running:
                return
        try:
            conn = await connect(self.settings, timeout=2)
        except psycopg.OperationalError:
            return  # starting up, or stopping: the next pass will do
        async with conn:
            if files_changed:
                await conn.execute("SELECT pg_reload_conf()")
                log.info("configuration reloaded", config_changed=config_changed, secrets_changed=secrets_changed)
                if problems := await status_queries.config_errors(conn):
                    self._record_error("conf", "PostgreSQL cannot use parts of postgresql.conf: " + "; ".join(problems))
                    log.error("configuration has errors", problems=problems)
                else:
                    self._clear_error("conf")
            await self._report_pending_restart(conn)
            in_recovery = (await fetch_one(conn, "SELECT pg_is_in_recovery() AS r"))["r"]
            if not in_recovery:
                if not self._roles_ok:
                    await ensure_roles(conn, self.settings)
                    self._roles_ok = True
                await reconcile_slots(
                    conn, cluster=self.settings.cluster, name=self.settings.name, instances=self.config.instances
                )
            self._synced = process
        # a full pass reached a running PostgreSQL: earlier crash and sync problems no longer hold
        self._clear_error("postgres")
        self._clear_error("sync")

    async def _report_pending_restart(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        cursor = await conn.execute("SELECT name FROM pg_settings WHERE pending_restart ORDER BY name")
        pending = [row["name"] for row in await cursor.fetchall()]
        if pending != self._pending:
            if pending:
                log.info("parameters wait for a restart", parameters=pending)
            self._pending = pending

    # ---- HTTP backend -------------------------------------------------------------------------------------------

    def api_token(self) -> str | None:
        """The current API token (re-read each time: the Secret may rotate)."""
        try:
            return self.settings.token_file.read_text().strip() or None
        except OSError:
            return None

    async def _not_ready(self, conn: psycopg.AsyncConnection[DictRow] | None) -> str | None:
        if self._shutting_down:
            return "shutting down"
        if not self._data_ready:
            return f"bootstrapping ({self.settings.bootstrap})"
        if not self.pg.running or conn is None:
            return "postgres is not running" if not self.pg.running else "postgres does not accept connections"
        if reason := await status_queries.readiness(conn):
            return reason
        if not self._is_replica and not self._roles_ok:
            return "roles are not in place yet"
        return None

    async def _try_connect(self) -> psycopg.AsyncConnection[DictRow] | None:
        if not self.pg.running:
            return None
        try:
            return await connect(self.settings, timeout=3)
        except psycopg.OperationalError:
            return None

    async def not_ready_reason(self) -> str | None:
        """Why ``/readyz`` fails, or None when ready."""
        conn = await self._try_connect()
        if conn is None:
            return await self._not_ready(None)
        async with conn:
            return await self._not_ready(conn)

    async def status(self) -> dict[str, Any]:
        """``GET /status``: the manager's view plus what PostgreSQL reports when it is up."""
        result: dict[str, Any] = {
            "name": self.settings.name,
            "role": "replica" if self._data_ready and self._is_replica else "primary",
            "inRecovery": None,
            "timeline": None,
            "systemIdentifier": None,
            "postgresVersion": None,
            "connections": None,
            "pendingRestart": None,
            "running": self.pg.running,
            "ready": False,
            "restartCount": self.restart_count,
            "lastError": self.last_error,
        }
        if not self._data_ready:
            result["role"] = self.settings.bootstrap
        conn = await self._try_connect()
        if conn is None:
            return result
        async with conn:
            try:
                result.update(await status_queries.collect(conn))
                result["ready"] = await self._not_ready(conn) is None
            except psycopg.Error as exc:
                result["lastError"] = f"status query failed: {exc}"
        return result

    async def promote(self) -> dict[str, Any]:
        """``POST /promote``: pg_promote, wait for the end of recovery, switch the files to the primary's."""
        async with self._lock:
            conn = await self._action_connection()
            async with conn:
                if not (await fetch_one(conn, "SELECT pg_is_in_recovery() AS r"))["r"]:
                    raise ActionError(409, "this instance is already a primary")
                log.info("promoting")
                done = (await fetch_one(conn, "SELECT pg_promote(wait => true, wait_seconds => 60) AS done"))["done"]
                if not done:
                    raise ActionError(504, "promotion did not finish within 60 s")
                if self._write_files():  # standby.signal is gone: no primary_conninfo, sync standbys instead
                    await conn.execute("SELECT pg_reload_conf()")
                await ensure_roles(conn, self.settings)
                self._roles_ok = True
                await reconcile_slots(
                    conn, cluster=self.settings.cluster, name=self.settings.name, instances=self.config.instances
                )
                state = await status_queries.collect(conn)
        log.info("promoted", timeline=state["timeline"], lsn=state["writeLsn"])
        return {"promoted": True, "timeline": state["timeline"], "lsn": state["writeLsn"]}

    async def restart(self) -> dict[str, Any]:
        """``POST /restart``: fast shutdown and start again with the current files; answer once it takes connections."""
        async with self._lock:
            if self._shutting_down or not self._data_ready or self.pg.process is None:
                raise ActionError(503, "postgres is not running yet")
            self._write_files()
            await self.pg.stop()
            await self.pg.start()
        try:
            await self.pg.wait_accepting(timeout=120)
        except (TimeoutError, RuntimeError) as exc:
            raise ActionError(500, f"postgres did not come back: {exc or 'timeout'}") from None
        conn = await self._action_connection()
        async with conn:
            pending = await fetch_one(conn, "SELECT EXISTS (SELECT 1 FROM pg_settings WHERE pending_restart) AS p")
        log.info("postgres restarted on request")
        return {"restarted": True, "pendingRestart": pending["p"]}

    async def _action_connection(self) -> psycopg.AsyncConnection[DictRow]:
        if self._shutting_down:
            raise ActionError(503, "shutting down")
        conn = await self._try_connect()
        if conn is None:
            raise ActionError(503, "postgres is not running or does not accept connections")
        return conn
