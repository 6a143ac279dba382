"""The instance manager: prepare the data directory, run PostgreSQL, keep it configured, answer the operator.

Four activities share one lifecycle lock (nothing starts, stops or promotes PostgreSQL concurrently): the supervisor
(start; restart with back-off after an unexpected exit; nothing while fenced, see :mod:`kanri.instance.fence`), the
config loop (every ``config_interval``: config file and
Secrets → checked → files → reload), the upkeep loop (roles and slots on a primary) and the HTTP handlers' actions.
The config loop and the upkeep loop are separate tasks, so a statement blocked in one (a lock, a synchronous-commit
wait) never keeps a config change from applying. Nothing is started that is not proven to start: parameters are
checked with PostgreSQL before they are written, and the data directory's system identifier and major before each
start. SIGTERM/SIGINT → fast shutdown of PostgreSQL → exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import ssl
import time
from datetime import UTC, datetime
from typing import Any, get_args

import psycopg
import structlog
from aiohttp import web
from psycopg.rows import DictRow

from kanri.instance import post_upgrade
from kanri.instance import status as status_queries
from kanri.instance.archive_gap import mark_old_timeline_ready
from kanri.instance.base_backup import BackupError, BaseBackups, state_dir
from kanri.instance.bootstrap import clone, discard_partial, has_data, initdb, recover
from kanri.instance.conf import (
    render_hba,
    render_passfile,
    render_postgresql_conf,
    split_parameters,
    write_if_changed,
)
from kanri.instance.conf_check import Choice, ConfChecker, choose
from kanri.instance.config import ClusterConfig, Credentials, Settings
from kanri.instance.credentials import Checked, Purpose, check_credentials, check_token
from kanri.instance.db import STATEMENT_TIMEOUT_MS, connect, fetch_one
from kanri.instance.demote import read_controldata
from kanri.instance.exporter import InstanceExporter, ManagerState, metrics_port
from kanri.instance.fence import FenceRecord, lift, marker_path, read_fence, write_fence
from kanri.instance.http_api import Accepted, ActionError, build_app
from kanri.instance.identity import binary_version, data_version, start_problems
from kanri.instance.isolation import INTERVAL, IsolationSettings, IsolationWatch, Probe, run_queue_wait
from kanri.instance.postgres_process import PostgresProcess
from kanri.instance.problems import UNREACHABLE, Problem, ProblemBoard, Reachability, one_line
from kanri.instance.rejoin import RejoinStatus, move_aside, restore_interrupted, rewind, source_label
from kanri.instance.replication_pause import clear_pause, read_pause, write_pause
from kanri.instance.replication_pause import marker_path as pause_marker_path
from kanri.instance.roles import ensure_roles
from kanri.instance.slots import reconcile_slots
from kanri.instance.tls import enabled as tls_enabled
from kanri.instance.tls import install as install_tls
from kanri.instance.tls import reload_context, server_context

log = structlog.get_logger("kanri.instance")

MAX_BACKOFF = 30.0
"""Longest wait before restarting a PostgreSQL that keeps dying."""

MAX_REASON = 200
"""Longest fence reason kept (it is shown in /readyz, /status and the operator's status)."""

STABLE_RUN = 60.0
"""A PostgreSQL that ran this long before dying is restarted after the shortest back-off again."""

PAUSE_WAIT = 10.0
"""How long ``POST /replication/pause`` waits for the WAL receiver to stop."""


class InstanceManager:
    """One instance: see the module docstring. ``run()`` is the whole life of the process."""

    def __init__(self, settings: Settings, isolation: IsolationSettings | None = None) -> None:
        self.settings = settings
        self.isolation = isolation or IsolationSettings(enabled=False, host="", port=443)
        self.watch = IsolationWatch(self.isolation.window)
        self.pg = PostgresProcess(settings)
        self.config = ClusterConfig()
        self.problems = ProblemBoard()
        self._reach = Reachability()  # PostgresUnreachable: see _connect_own
        self.checker = ConfChecker(settings)
        self._errors: dict[str, str] = {}  # source → message, oldest first; see last_error
        self.restart_count = 0
        self._lock = asyncio.Lock()
        self._upkeep_lock = asyncio.Lock()  # roles and slots: the upkeep pass or a promotion, one at a time
        self._stop = asyncio.Event()
        self._shutting_down = False
        self._data_ready = False
        self._roles_ok = False  # ensure_roles succeeded since start or the last Secret change
        self._synced: object = None  # the postmaster the config loop last reached (to sync right after a start)
        self._config_raw: bytes | None = None
        self._secrets: dict[Purpose, Checked] = {}
        self._usable: dict[Purpose, Credentials | None] = dict.fromkeys(get_args(Purpose))  # last good, for files
        self._parameters: dict[str, str] = {}  # the user parameters last written (each passed the check)
        self._choice: Choice | None = None
        self._choice_key: tuple[str, bytes] | None = None
        self._pending: list[str] = []
        self._binary_version: int | None = None
        self.fence_path = marker_path(settings.pgdata)
        self._unfenced = asyncio.Event()  # set while no fence marker holds PostgreSQL stopped
        self.pause_path = pause_marker_path(settings.pgdata)
        self._paused = read_pause(self.pause_path) is not None  # memory decides the conf; the marker survives us
        self._rejoin: RejoinStatus | None = None
        self._rejoin_task: asyncio.Task[None] | None = None
        self._tls_context: ssl.SSLContext | None = None
        self._restore: dict[str, str] | None = None  # bootstrap.recovery's progress, for /status
        self._recloning = False  # a replica cloned again after a major upgrade (_reclone_after_upgrade)
        self._post_upgrade: asyncio.Task[dict[str, object]] | None = None  # after a major upgrade (post_upgrade.py)
        self.backups = BaseBackups(settings, state_dir(settings.pgdata))

    # ---- process life -------------------------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve HTTP, bootstrap, run PostgreSQL until SIGTERM/SIGINT; return the exit code (0 after a clean stop)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_shutdown)
        runner = web.AppRunner(build_app(self, self), access_log=None)
        await runner.setup()
        # HTTP first: liveness must answer during a long pg_basebackup
        await web.TCPSite(
            runner, self.settings.http_listen, self.settings.http_port, ssl_context=self._serve_tls()
        ).start()
        port = metrics_port()  # the exporter reads PostgreSQL on its own connection; 0 turns it off
        exporter = InstanceExporter(self.settings, self._exporter_state, port=port) if port else None
        if exporter is not None:
            await exporter.start()
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
            if self._rejoin_task is not None:
                self._rejoin_task.cancel()  # it holds the lock while it rewinds or clones
            await asyncio.gather(main, stop, *filter(None, [self._rejoin_task]), return_exceptions=True)
            await self.backups.close()
            if exporter is not None:
                await exporter.stop()
            async with self._lock:
                await self.pg.stop()
            await runner.cleanup()
        log.info("instance manager stopped", exit_code=code)
        return code

    def _exporter_state(self) -> ManagerState:
        contact = self.watch.last_contact if self.isolation.enabled else None
        last_contact = contact.timestamp() if contact else None
        return ManagerState(self.pg.running, self.fenced is not None, self._paused, last_contact)

    def _serve_tls(self) -> ssl.SSLContext | None:
        """The HTTP API's TLS context (the server certificate, as PostgreSQL's), or None without a certificate."""
        install_tls(self.settings)
        self._tls_context = server_context(self.settings)
        return self._tls_context

    def request_shutdown(self) -> None:
        """Stop: fast shutdown of PostgreSQL, then exit (signal handler)."""
        log.info("shutdown requested")
        self._shutting_down = True
        self._stop.set()

    async def _main(self) -> None:
        self._binary_version = await binary_version(self.settings.binary("postgres"))
        self._read_config()
        self._read_secrets()
        self._check_fence()  # before anything starts PostgreSQL: a fenced instance must never serve again by itself
        if done := restore_interrupted(self.settings):
            log.warning(done, pgdata=str(self.settings.pgdata))
        discard_partial(self.settings)
        if not has_data(self.settings.pgdata):
            await self._bootstrap()
        self._data_ready = True
        await self._wait_startable()
        async with asyncio.TaskGroup() as group:
            group.create_task(self._supervise())
            group.create_task(self._config_loop())
            group.create_task(self._upkeep_loop())
            group.create_task(self._isolation_loop())

    async def _bootstrap(self) -> None:
        """An empty PGDATA: initdb for a new cluster's primary; otherwise (a replica, or a primary whose cluster was
        initialised already: its data directory was lost) a clone of the primary."""
        if self.settings.bootstrap == "primary" and self.config.system_identifier is None and self.config.recovery:
            await self._recover()
        elif self.settings.bootstrap == "primary" and self.config.system_identifier is None:
            await initdb(self.settings, superuser=self._secrets["superuser"].credentials)
        else:
            lost = self.settings.bootstrap == "primary"
            if lost:  # initdb would serve an empty database as if nothing happened
                self._report(
                    "bootstrap:lost",
                    [
                        Problem(
                            "DataDirectoryLost",
                            f"the data directory is empty but the cluster was initialised (system "
                            f"{self.config.system_identifier}); cloning from {self.settings.primary_host} instead of "
                            "running initdb",
                        )
                    ],
                )

            def replication() -> Credentials | None:
                self._read_secrets()
                return self._secrets["replication"].credentials

            await clone(self.settings, replication, on_error=lambda message: self._note("bootstrap", message))
            self._report("bootstrap:lost", [])
        log.info("data directory ready", bootstrap=self.settings.bootstrap)
        self._clear_error("bootstrap")

    async def _recover(self) -> None:
        """bootstrap.recovery: restore, replay to the target, promote (see :mod:`kanri.instance.restore`). Progress and
        failures show in /status (``restore``, ``lastError``); the roles get this cluster's passwords at the first
        upkeep pass, as after an initdb."""
        plan = self.config.recovery
        assert plan is not None
        self._restore = {"state": "running", "plan": plan.describe(), "message": "starting"}

        def config() -> ClusterConfig:
            self._read_config()
            return self.config

        def progress(message: str) -> None:
            self._restore = {**(self._restore or {}), "message": one_line(message)[:300]}
            log.info("restore", progress=message)

        await recover(self.settings, config, on_error=lambda message: self._note("bootstrap", message),
                      on_progress=progress)  # fmt: skip
        self._restore = {**(self._restore or {}), "state": "done"}

    async def _wait_startable(self) -> None:
        """Return once the data directory may be started: same cluster (system identifier), same major."""
        while True:
            self._read_config()
            problems = start_problems(self.settings.pgdata, self.config, self._binary_version)
            if problems and self._upgraded_away():
                await self._reclone_after_upgrade()
                continue
            self._report("identity", problems)
            if not problems:
                return
            await asyncio.sleep(self.settings.config_interval)

    def _upgraded_away(self) -> bool:
        """This instance's data is of an older major than the cluster's primary after a major upgrade (the
        operator's ``upgrade`` note names that primary and its new major, the binaries are of that major)."""
        note = self.config.upgrade
        found = data_version(self.settings.pgdata)
        return (note is not None and note.primary != self.settings.name and self._binary_version == note.to
                and found is not None and found < note.to)  # fmt: skip

    async def _reclone_after_upgrade(self) -> None:
        """A replica left on the old major by a major upgrade: its data is removed and cloned from the new
        primary (pg_upgrade upgrades one data directory; replicas cannot follow it)."""
        found = data_version(self.settings.pgdata)
        log.warning("the cluster was upgraded: cloning this replica again from the new primary",
                    data_major=found, cluster_major=self._binary_version)  # fmt: skip
        self._note("bootstrap", f"re-cloning: the data is PostgreSQL {found}, the cluster was upgraded to "
                   f"{self._binary_version}")  # fmt: skip
        self._recloning = True
        try:
            shutil.rmtree(self.settings.pgdata)

            def replication() -> Credentials | None:
                self._read_secrets()
                return self._secrets["replication"].credentials

            await clone(self.settings, replication, on_error=lambda message: self._note("bootstrap", message))
        finally:
            self._recloning = False
        self._clear_error("bootstrap")

    async def _start(self) -> asyncio.subprocess.Process:
        """Write the files and start PostgreSQL (the caller holds the lock and has checked the identity)."""
        await self._write_files()
        return await self.pg.start()

    async def _supervise(self) -> None:
        """Start PostgreSQL; whenever it exits without being asked to, start it again after a growing pause. While the
        instance is fenced it stays stopped; it starts again once the fence is lifted."""
        delay = 1.0
        proc: asyncio.subprocess.Process | None = None
        while True:
            if not self._unfenced.is_set():
                log.warning("postgres kept stopped: the instance is fenced", marker=str(self.fence_path))
                await self._unfenced.wait()
                await self._wait_startable()
            async with self._lock:
                if self._shutting_down:
                    return
                if self._check_fence() is not None:
                    continue  # fenced meanwhile (or the marker was put there by hand): wait for the fence to lift
                if self.pg.process is not None and self.pg.process is not proc:
                    proc = self.pg.process  # started on purpose (POST /restart)
                else:
                    proc = await self._start()
            started = time.monotonic()
            code = await proc.wait()
            async with self._lock:
                if self._shutting_down:
                    return
                if self.pg.process is not proc or self._check_fence() is not None:
                    continue  # restarted on purpose (POST /restart), or stopped on purpose (POST /fence)
                self.restart_count += 1
                delay = 1.0 if time.monotonic() - started > STABLE_RUN else delay
                self._record_error("postgres", f"postgres exited unexpectedly with code {code}")
                log.error("postgres exited unexpectedly", exit_code=code, restart_in=delay, restarts=self.restart_count)
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)
            await self._wait_startable()

    # ---- problems -----------------------------------------------------------------------------------------------

    @property
    def last_error(self) -> str | None:
        """The most recent problem that still holds (None once every source has recovered)."""
        return next(reversed(self._errors.values()), None)

    def _record_error(self, source: str, message: str) -> bool:
        """Set ``source``'s error; True when it is new (the caller logs only then)."""
        new = self._errors.get(source) != message
        self._errors.pop(source, None)  # re-insert: the newest comes last
        self._errors[source] = message
        return new

    def _note(self, source: str, message: str) -> None:
        self._record_error(source, one_line(message))

    def _clear_error(self, source: str) -> None:
        self._errors.pop(source, None)

    def _report(self, source: str, problems: list[Problem] | tuple[Problem, ...]) -> None:
        """The problems of ``source`` for ``problems`` in /status (logged once per change) and for ``lastError``."""
        if self.problems.set(source, problems):
            if problems:
                self._record_error(source, problems[-1].message)
            else:
                self._clear_error(source)

    # ---- fence --------------------------------------------------------------------------------------------------

    @property
    def fenced(self) -> FenceRecord | None:
        """The fence in force (read from the volume: the marker is the truth, not memory)."""
        return read_fence(self.fence_path)

    def _check_fence(self) -> FenceRecord | None:
        """Read the marker and bring the supervisor's gate and the ``Fenced`` problem in line with it."""
        record = self.fenced
        if record is None:
            self._unfenced.set()
            self._report("fence", [])
        else:
            self._unfenced.clear()
            since = f" since {record.since}" if record.since else ""
            self._report(
                "fence",
                [Problem("Fenced", f"fenced{since}: {record.reason}; PostgreSQL is kept stopped until POST /unfence")],
            )
        return record

    # ---- configuration ------------------------------------------------------------------------------------------

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
            self._report("config", [Problem("InvalidConfig", f"{exc}; keeping the previous config")])
            return False
        self._report("config", [])
        log.info(
            "cluster config loaded" if first else "cluster config changed",
            instances=list(self.config.instances),
            parameters=sorted(self.config.parameters),
            synchronous_standbys=self.config.synchronous_standbys,
        )
        return True

    def _read_secrets(self) -> bool:
        """Check every mounted Secret; True when any changed since the last call (usable or not)."""
        checked = {
            "superuser": check_credentials("superuser", self.settings.superuser_dir),
            "replication": check_credentials("replication", self.settings.replication_dir),
            "app": check_credentials("app", self.settings.app_dir),
        }
        purpose: Purpose
        for purpose, result in checked.items():  # type: ignore[assignment]  # the keys are the Purpose literals
            self._report(f"secret:{purpose}", result.problems)
            if result.credentials is not None:
                self._usable[purpose] = result.credentials
        self._report("secret:api", check_token(self.settings.token_file)[1])
        changed = checked != self._secrets
        self._secrets = checked  # type: ignore[assignment]
        return changed

    @property
    def _is_replica(self) -> bool:
        return (self.settings.pgdata / "standby.signal").exists()

    async def _choose_parameters(self, wanted: dict[str, str], render: Any) -> Choice:
        """The user parameters PostgreSQL accepts (asked again only when the candidate or auto.conf changed)."""
        try:
            auto = (self.settings.pgdata / "postgresql.auto.conf").read_bytes()
        except FileNotFoundError:
            auto = b""
        key = (render(wanted), auto)
        if self._choice is None or key != self._choice_key:
            self._choice = await choose(self.checker, render, wanted, self._parameters)
            self._choice_key = key
        return self._choice

    def _parameter_problems(self, refused: dict[str, str], choice: Choice) -> list[Problem]:
        problems = [
            Problem("InvalidParameter", f'parameter "{one_line(n)[:63]}": {why}; not written', parameter=n[:63])
            for n, why in refused.items()
        ]
        for name, message in choice.refused.items():
            kept = "keeps its last good value" if name in choice.parameters else "not written"
            problems.append(Problem("InvalidParameter", f"{message}; {kept}", parameter=name))
        for name, message in choice.elsewhere.items():
            problems.append(
                Problem(
                    "InvalidParameter", f"{message} (set outside the cluster spec, e.g. ALTER SYSTEM)", parameter=name
                )
            )
        problems += [Problem("InvalidParameter", f"postgresql.conf does not load: {m}") for m in choice.other]
        return problems

    async def _write_files(self) -> bool:
        """postgresql.conf, pg_hba.conf (in PGDATA) and the passfile for the current role; True if a conf changed.

        Only user parameters PostgreSQL accepts are written; the others are reported."""
        replication = self._usable["replication"]
        replica = self._is_replica
        config = self.config

        paused = self._paused
        tls_changed = install_tls(self.settings)  # a renewed certificate: the reload below makes PostgreSQL use it
        if tls_changed and self._tls_context is not None:
            reload_context(self.settings, self._tls_context)  # and the HTTP API's next handshakes
        tls = tls_enabled(self.settings)

        def render(parameters: dict[str, str]) -> str:
            return render_postgresql_conf(
                self.settings, config, parameters, replica=replica, replication=replication, paused=paused, tls=tls
            )

        wanted, refused = split_parameters(config)
        choice = await self._choose_parameters(wanted, render)
        self._report("parameters", self._parameter_problems(refused, choice))
        changed = write_if_changed(self.settings.pgdata / "postgresql.conf", render(choice.parameters))
        self._parameters = dict(choice.parameters)
        changed |= write_if_changed(self.settings.pgdata / "pg_hba.conf", render_hba(replication, tls=tls))
        changed |= tls_changed
        self.settings.socket_dir.mkdir(parents=True, exist_ok=True)
        write_if_changed(self.settings.passfile, render_passfile(replication))  # libpq reads it on each connect
        return changed

    async def _loop(self, name: str, one_pass: Any) -> None:
        """Run ``one_pass`` forever; an error is reported (once per distinct message) and the loop goes on."""
        while True:
            try:
                await one_pass()
            except (psycopg.Error, OSError) as exc:
                if self._record_error(name, one_line(f"{name} failed: {exc}")):
                    log.warning(f"{name} failed", error=one_line(str(exc)))
            except Exception as exc:  # a bug here must not take PostgreSQL down with the manager: report, go on
                if self._record_error(name, one_line(f"{name} failed: {exc!r}")):
                    log.exception(f"{name} failed unexpectedly")
            else:
                self._clear_error(name)
            # right after a start, poll quickly until the new postmaster has been synced once (and, on a primary,
            # its roles are in place: a standby never gets there, and polling it 5 times a second costs a core)
            pending = self._synced is not self.pg.process or (not self._roles_ok and not self._is_replica)
            fast = self.pg.running and pending
            await asyncio.sleep(0.2 if fast else self.settings.config_interval)

    async def _config_loop(self) -> None:
        await self._loop("sync", self._sync)

    async def _upkeep_loop(self) -> None:
        await self._loop("upkeep", self._upkeep)

    async def _sync(self) -> None:
        """One pass: config and Secrets → checked → files → reload; pending-restart report."""
        fenced = self._check_fence() is not None  # a marker removed or put there by hand is seen within a pass
        config_changed = self._read_config()
        if self._read_secrets():
            self._roles_ok = False
        async with self._lock:
            if fenced and self.pg.running and self._check_fence() is not None:
                log.warning("fence marker found: stopping postgres", marker=str(self.fence_path))
                await self.pg.stop()
            files_changed = await self._write_files()
            process = self.pg.process
            if not self.pg.running:
                return
        try:
            conn = await self._connect_own(timeout=2, statement_timeout_ms=5_000)
        except psycopg.OperationalError:
            return  # starting up, or stopping: the next pass will do (a lasting failure is PostgresUnreachable)
        async with conn:
            if files_changed:
                await conn.execute("SELECT pg_reload_conf()")
                log.info("configuration reloaded", config_changed=config_changed)
                if problems := await status_queries.config_errors(conn):
                    if self._record_error(
                        "conf", "PostgreSQL cannot use parts of its configuration: " + "; ".join(problems)
                    ):
                        log.error("configuration has errors", problems=problems)
                else:
                    self._clear_error("conf")
            await self._report_pending_restart(conn)
            self._synced = process
        # a full pass reached a running PostgreSQL: an earlier crash no longer holds
        self._clear_error("postgres")

    async def _upkeep(self) -> None:
        """One pass on a primary: roles after a start or a Secret change, then slots. Its own task and connection:
        a statement stuck here (a lock held by a client) ends at the statement timeout and never delays ``_sync``."""
        if not self.pg.running or self._synced is not self.pg.process:
            return  # the config loop reaches a new postmaster first (files in place, reload done)
        try:
            conn = await self._connect_own(timeout=2)
        except psycopg.OperationalError:
            return
        async with conn, self._upkeep_lock:
            if (await fetch_one(conn, "SELECT pg_is_in_recovery() AS r"))["r"]:
                # a demoted primary keeps its slots; on a standby they would only hold WAL back: drop kanri's
                await reconcile_slots(conn, cluster=self.settings.cluster, name=self.settings.name, instances=())
                return
            if not self._roles_ok:
                await self._ensure_roles(conn)
            await reconcile_slots(
                conn, cluster=self.settings.cluster, name=self.settings.name, instances=self.config.instances
            )
        if self._post_upgrade is None and post_upgrade.pending(self.settings):
            # statistics and extension updates after a major upgrade: in the background, the cluster serves meanwhile
            self._post_upgrade = asyncio.create_task(post_upgrade.run(self.settings, self._binary_version))

    async def _ensure_roles(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        secrets = self._secrets
        await ensure_roles(
            conn,
            self.settings,
            superuser=secrets["superuser"].credentials,
            replication=secrets["replication"].credentials,
            app=secrets["app"].credentials,
        )
        self._roles_ok = True

    async def _report_pending_restart(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        cursor = await conn.execute("SELECT name FROM pg_settings WHERE pending_restart ORDER BY name")
        pending = [row["name"] for row in await cursor.fetchall()]
        if pending != self._pending:
            if pending:
                log.info("parameters wait for a restart", parameters=pending)
            self._pending = pending

    # ---- HTTP backend -------------------------------------------------------------------------------------------

    def api_token(self) -> str | None:
        """The current API token, checked (re-read each time: the Secret may rotate). None: every action is 401."""
        token, problems = check_token(self.settings.token_file)
        self._report("secret:api", problems)
        return token

    async def _not_ready(self, conn: psycopg.AsyncConnection[DictRow] | None) -> str | None:
        if self._shutting_down:
            return "shutting down"
        if (fence := self.fenced) is not None:
            return f"fenced: {fence.reason}"
        if not self._data_ready:
            return f"bootstrapping ({self.settings.bootstrap})"
        if identity := self.problems.get("identity"):
            return identity[0].message
        if not self.pg.running or conn is None:
            if self.pg.running and (unreachable := self.problems.get(UNREACHABLE)):
                return f"postgres unreachable: {unreachable[0].message}"
            return "postgres is not running" if not self.pg.running else "postgres does not accept connections"
        if self._paused and self._is_replica:  # no receiver on purpose; still kept out of -ro while it lasts
            return "replication paused"
        if reason := await status_queries.readiness(conn):
            return reason
        if not self._is_replica and not self._roles_ok:
            return "roles are not in place yet"
        return None

    async def _connect_own(
        self, *, timeout: int, statement_timeout_ms: int = STATEMENT_TIMEOUT_MS
    ) -> psycopg.AsyncConnection[DictRow]:
        """A connection to our own PostgreSQL (the loops' and ``/status``'s). A failure that lasts while the same
        postmaster runs is reported as ``PostgresUnreachable`` with libpq's first line (:class:`Reachability`); any
        connection that works clears it."""
        postmaster = self.pg.process
        try:
            conn = await connect(self.settings, timeout=timeout, statement_timeout_ms=statement_timeout_ms)
        except psycopg.OperationalError as exc:
            # only a postmaster that runs throughout counts: one stopping or restarting is no login problem
            if postmaster is not None and postmaster is self.pg.process and self.pg.running:
                self._report(UNREACHABLE, self._reach.failed(postmaster, exc))
            raise
        self._report(UNREACHABLE, self._reach.reached())
        return conn

    async def _try_connect(self) -> psycopg.AsyncConnection[DictRow] | None:
        if not self.pg.running:
            # nothing to reach (stopped, fenced, restarting): an earlier PostgresUnreachable no longer holds
            self._report(UNREACHABLE, self._reach.reached())
            return None
        try:
            return await self._connect_own(timeout=3, statement_timeout_ms=5_000)
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
            "configErrors": None,
            "archiver": None,
            "running": self.pg.running,
            "ready": False,
            "restartCount": self.restart_count,
            "lastError": self.last_error,
            "dataVersion": data_version(self.settings.pgdata),
            "binaryVersion": self._binary_version,
            "problems": [p.as_json() for p in self.problems.all()],
            "fenced": False,
            "replicationPaused": self._paused,
            "rejoin": self._rejoin.as_json() if self._rejoin is not None else None,
            "isolation": self.watch.as_json() if self.isolation.enabled else None,
            "restore": self._restore,
        }
        if (fence := self.fenced) is not None:
            result.update(fenced=True, fencedSince=fence.since or None, fenceReason=fence.reason)
        if not self._data_ready:
            result["role"] = self.settings.bootstrap
        if self._recloning:  # its data directory is gone while it clones: never mistaken for a primary
            result["role"] = "replica"
        conn = await self._try_connect()
        # that connection may have raised or cleared PostgresUnreachable: report what holds now
        result.update(lastError=self.last_error, problems=[p.as_json() for p in self.problems.all()])
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
        asked = time.monotonic()
        async with self._lock:
            locked = time.monotonic()
            self._refuse_if_fenced("promote")
            conn = await self._action_connection()
            async with conn:
                if not (await fetch_one(conn, "SELECT pg_is_in_recovery() AS r"))["r"]:
                    raise ActionError(409, "this instance is already a primary")
                log.info("promoting")
                done = (await fetch_one(conn, "SELECT pg_promote(wait => true, wait_seconds => 60) AS done"))["done"]
                promoted = time.monotonic()
                if not done:
                    raise ActionError(504, "promotion did not finish within 60 s")
                if clear_pause(self.pause_path) or self._paused:  # a primary has no replication to pause
                    self._paused = False
                    log.info("replication pause ended by the promotion")
                # The primary's files (no primary_conninfo) are written by the config loop's next pass, brought
                # forward here: checking them with PostgreSQL takes seconds, and nothing waits on them —
                # synchronous_standby_names is in a replica's file already, so the first commit is synchronous.
                self._synced = None
                async with self._upkeep_lock:  # the upkeep loop sees the new primary too: not both at once
                    await self._ensure_roles(conn)
                    await reconcile_slots(
                        conn, cluster=self.settings.cluster, name=self.settings.name, instances=self.config.instances
                    )
                state = await status_queries.collect(conn)
                if self.config.archive is not None and isinstance(state.get("timeline"), int):
                    # the old timeline's segments only this instance still has reach the archive too
                    marked = mark_old_timeline_ready(self.settings.pgdata, int(state["timeline"]))
                    if marked:
                        log.info("old timeline marked for archiving", files=len(marked), first=marked[0],
                                 last=marked[-1])  # fmt: skip
        # Where the time went (the operator's failover waits for this answer): the lock, pg_promote, the upkeep.
        log.info("promoted", timeline=state["timeline"], lsn=state["writeLsn"], lock_wait=round(locked - asked, 3),
                 promote_seconds=round(promoted - locked, 3), total=round(time.monotonic() - asked, 3))  # fmt: skip
        return {"promoted": True, "timeline": state["timeline"], "lsn": state["writeLsn"]}

    async def restart(self) -> dict[str, Any]:
        """``POST /restart``: fast shutdown and start again with the current files; answer once it takes connections.

        Refused (409) unless the data directory may be started and PostgreSQL accepts the configuration it would
        read: a restart into a file that does not load is an outage on a lone primary."""
        async with self._lock:
            self._refuse_if_fenced("restart")
            if self._shutting_down or not self._data_ready or self.pg.process is None:
                raise ActionError(503, "postgres is not running yet")
            if problems := start_problems(self.settings.pgdata, self.config, self._binary_version):
                raise ActionError(409, "refusing to restart: " + "; ".join(p.message for p in problems))
            await self._write_files()
            current = (self.settings.pgdata / "postgresql.conf").read_text()
            check = await self.checker.check(current, self._parameters)
            if not check.loads:
                self._choice = None  # the next pass reports what changed (auto.conf, a library gone)
                reasons = [f"{n}: {m}" for n, m in check.by_parameter.items()] + check.other
                raise ActionError(
                    409, one_line("refusing to restart: the configuration would not load: " + "; ".join(reasons))
                )
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

    def _refuse_if_fenced(self, action: str) -> None:
        if (fence := self.fenced) is not None:
            raise ActionError(409, f"refusing to {action}: the instance is fenced ({fence.reason}); unfence it first")

    async def fence(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /fence``: put the marker on the volume, then stop PostgreSQL (fast shutdown) and keep it stopped.

        The marker comes first, so a manager killed halfway comes back fenced. Idempotent: fencing a fenced instance
        keeps the first record and answers the same. Shielded: the operator's request may time out while PostgreSQL
        shuts down; the shutdown goes on regardless."""
        reason = one_line(str(body.get("reason") or "fenced on request")[:MAX_REASON])
        return await asyncio.shield(self._fence(reason))

    async def _fence(self, reason: str) -> dict[str, Any]:
        async with self._lock:
            if self._shutting_down:
                raise ActionError(503, "shutting down")
            record = self.fenced
            already = record is not None
            if record is None:
                record = write_fence(self.fence_path, reason, datetime.now(UTC))
                log.warning("fenced: PostgreSQL stops and stays stopped", reason=reason, marker=str(self.fence_path))
            self._check_fence()
            stopped = self.pg.running  # this call stops it (a fenced instance's PostgreSQL is not running)
            await self.pg.stop()
        return {"fenced": True, "since": record.since, "reason": record.reason, "already": already,
                "stopped": stopped}  # fmt: skip

    async def unfence(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /unfence``: remove the marker; the supervisor starts PostgreSQL again (with whatever data it has —
        the operator's rejoin decides whether that data may serve)."""
        async with self._lock:
            removed = lift(self.fence_path)
            self._check_fence()
        if removed:
            log.warning("fence lifted: PostgreSQL starts again")
        return {"fenced": False, "lifted": removed}

    # ---- high availability: pause, demote, rejoin, isolation ---------------------------------------------------

    async def pause_replication(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /replication/pause``: stop the WAL receiver and keep it stopped (no ``primary_conninfo``), then
        answer what this replica has received and replayed. Idempotent; 409 on a primary."""
        async with self._lock:
            self._refuse_if_fenced("pause replication")
            conn = await self._action_connection()
            async with conn:
                row = await fetch_one(
                    conn,
                    "SELECT pg_is_in_recovery() AS r, (SELECT received_tli FROM pg_stat_wal_receiver) AS tli",
                )
                if not row["r"] or not self._is_replica:
                    raise ActionError(409, "this instance is a primary: there is no replication to pause")
                if read_pause(self.pause_path) is None:
                    write_pause(self.pause_path, datetime.now(UTC), row["tli"])
                    log.warning("replication paused: the WAL receiver stops and stays stopped")
                self._paused = True
                if await self._write_files():
                    await conn.execute("SELECT pg_reload_conf()")
                try:
                    async with asyncio.timeout(PAUSE_WAIT):
                        while True:  # the startup process stops the receiver once it has read the new conf
                            if not (await fetch_one(conn, "SELECT count(*) AS n FROM pg_stat_wal_receiver"))["n"]:
                                break
                            await asyncio.sleep(0.05)
                except TimeoutError:
                    raise ActionError(504, f"the WAL receiver did not stop within {PAUSE_WAIT:.0f} s") from None
                state = await fetch_one(
                    conn,
                    # nothing streamed since PostgreSQL started (restarted while paused): what it has is what
                    # is in pg_wal, and the startup process replays all of it
                    "SELECT coalesce(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::text AS receive,"
                    " pg_last_wal_replay_lsn()::text AS replay,"
                    " (SELECT timeline_id FROM pg_control_checkpoint()) AS checkpoint_tli",
                )
        record = read_pause(self.pause_path)
        timelines = [t for t in (state["checkpoint_tli"], record.timeline if record else None) if t is not None]
        return {
            "paused": True,
            "receiveLsn": state["receive"],
            "replayLsn": state["replay"],
            "timeline": max(timelines) if timelines else None,
        }

    async def resume_replication(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /replication/resume``: lift the pause, render ``primary_conninfo`` again, reload. Idempotent, and
        a no-op on a primary."""
        async with self._lock:
            removed = clear_pause(self.pause_path)
            was = self._paused
            self._paused = False
            changed = await self._write_files() if self._data_ready else False
            if changed and self.pg.running:
                conn = await self._action_connection()
                async with conn:
                    await conn.execute("SELECT pg_reload_conf()")
        if removed or was:
            log.info("replication resumed")
        return {"paused": False, "resumed": removed or was}

    async def demote(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /demote``: a primary becomes a replica for a planned switchover (see :mod:`kanri.instance.demote`).
        Shielded like ``/fence``: once the shutdown has begun it completes, whatever the caller does."""
        return await asyncio.shield(self._demote())

    async def _demote(self) -> dict[str, Any]:
        async with self._lock:
            self._refuse_if_fenced("demote")
            if self._is_replica:
                raise ActionError(409, "this instance is a replica already")
            conn = await self._action_connection()
            async with conn:
                if (await fetch_one(conn, "SELECT pg_is_in_recovery() AS r"))["r"]:
                    raise ActionError(409, "this instance is a replica already")
                log.warning("demoting: checkpoint, fast shutdown, start as a replica")
                await conn.execute("CHECKPOINT")  # the shutdown checkpoint then has little left to write
            await self.pg.stop()  # fast: the WAL senders send everything up to the shutdown checkpoint first
            control = await read_controldata(self.settings.binary("pg_controldata"), self.settings.pgdata)
            if control.state != "shut down":
                # an immediate stop after the timeout: its last checkpoint is not the end of WAL; stay the primary
                await self._start()
                raise ActionError(500, f"the primary did not shut down cleanly ({control.state}); still the primary")
            (self.settings.pgdata / "standby.signal").touch(mode=0o600)
            await self._start()  # the replica's files: streams from KANRI_PRIMARY_HOST once it has a new primary
        log.warning("demoted", checkpoint_lsn=control.checkpoint_lsn, timeline=control.timeline)
        return {"demoted": True, "checkpointLsn": control.checkpoint_lsn, "timeline": control.timeline}

    async def rejoin(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /rejoin``: follow the primary at ``KANRI_PRIMARY_HOST`` (pg_rewind, else a clone), in the
        background; 202. The progress is ``/status``'s ``rejoin``."""
        if self._rejoin_task is not None and not self._rejoin_task.done():
            return Accepted({"rejoin": "running"})
        if self._shutting_down:
            raise ActionError(503, "shutting down")
        if not self._data_ready:
            raise ActionError(409, "refusing to rejoin: the data directory is not ready yet (bootstrapping)")
        if self.fenced is None and self.pg.running and not self._is_replica:
            raise ActionError(409, "refusing to rejoin: this instance is a running primary; fence it first")
        self._rejoin = RejoinStatus("running", "rewind", f"stopping PostgreSQL to rejoin {source_label(self.settings)}")
        self._rejoin_task = asyncio.create_task(self._run_rejoin(), name="rejoin")
        return Accepted({"rejoin": "started"})

    async def _run_rejoin(self) -> None:
        assert self._rejoin is not None
        status = self._rejoin
        try:
            async with self._lock:
                if self.fenced is None:  # the supervisor must not take the stop below for a crash
                    write_fence(self.fence_path, f"rejoining {source_label(self.settings)}", datetime.now(UTC))
                    self._check_fence()
                await self.pg.stop()
                status.message = f"pg_rewind from {source_label(self.settings)}"
                result = await rewind(self.settings, self._usable["superuser"])
                status.divergence = result.divergence
                if result.ok:
                    status.message = result.message
                else:
                    status.method = "clone"
                    status.message = f"{result.message}; cloning instead"
                    log.warning("rejoin: rewind impossible, cloning", reason=result.message)
                    started = time.monotonic()
                    await self._clone_over(status)
                    status.message = f"{result.message}; cloned instead in {time.monotonic() - started:.1f} s"
                (self.settings.pgdata / "standby.signal").touch(mode=0o600)
                clear_pause(self.pause_path)
                self._paused = False
                self._wait_startable_now()
                await self._start()
                lift(self.fence_path)  # the supervisor adopts the replica just started
                self._check_fence()
            await self.pg.wait_accepting(timeout=600)
        except asyncio.CancelledError:
            status.state, status.message = "failed", f"interrupted by a shutdown ({status.message})"
            raise
        except Exception as exc:
            reason = exc.reason if isinstance(exc, ActionError) else one_line(str(exc) or repr(exc))
            status.state, status.message = "failed", f"{status.message}: {reason}"[:300]
            log.error("rejoin failed", method=status.method, reason=status.message)
            return
        status.state = "done"
        log.warning("rejoined as a replica", method=status.method, message=status.message)

    # ---- base backups (kanri.instance.base_backup) -----------------------------------------------------------------

    async def start_backup(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /backups {"id"}``: start a base backup of this instance (primary or standby) in the background
        (202), or answer the known id's record (200)."""
        backup = body.get("id")
        if not isinstance(backup, str):
            raise ActionError(400, "the body needs an id (the backup's idempotency key)")
        try:
            known = self.backups.read(backup)
            if known is not None:
                return known.as_json()
            if self._shutting_down:
                raise ActionError(503, "shutting down")
            if not self.pg.running or self.fenced is not None:
                raise ActionError(503, "postgres is not running; no backup can be taken here now")
            record, _ = self.backups.start(backup, self.config.archive, standby=self._is_replica)
        except BackupError as exc:
            raise ActionError(exc.status, exc.reason) from None
        return Accepted(record.as_json())

    async def backup_record(self, backup: str) -> dict[str, Any]:
        """``GET /backups/{id}``: the record of one backup id; 404 for an id never asked here."""
        try:
            record = self.backups.read(backup)
        except BackupError as exc:
            raise ActionError(exc.status, exc.reason) from None
        if record is None:
            raise ActionError(404, f"no backup {backup} on this instance")
        return record.as_json()

    async def expire_backups(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /backups/expire {"ids", "serverName"?}``: delete these barman backup ids (and the WAL only they
        needed) — of this system, or of the earlier one ``serverName`` names (a major upgrade's predecessor, which
        archived under another server name in the same repository)."""
        ids = body.get("ids")
        target = self.config.archive
        server = body.get("serverName")
        if target is not None and server is not None and server != target.server_name:
            try:  # only a system of this same cluster, never another cluster's folder
                target = target.system(str(server))
            except ValueError:
                raise ActionError(
                    400, "serverName must name a system of this cluster (<cluster>[.pg<major>])"
                ) from None
        try:
            return await self.backups.expire(ids if isinstance(ids, list) else [], target)
        except BackupError as exc:
            raise ActionError(exc.status, exc.reason) from None

    async def switch_wal(self, _: dict[str, Any]) -> dict[str, Any]:
        """``POST /wal/switch``: close the current WAL segment (``pg_switch_wal()``) so that it is archived now.

        The operator asks it after a base backup: the backup's last segment is otherwise archived only once it
        fills or ``archive_timeout`` passes, and until then the backup cannot be restored (its end WAL is missing).
        A primary only: a standby has no WAL of its own to close."""
        if self.config.archive is None:
            raise ActionError(409, "this cluster archives no WAL")
        if not self.pg.running or self._is_replica:
            raise ActionError(409, "not a running primary: only the primary can switch WAL")
        try:
            conn = await connect(self.settings, timeout=3, statement_timeout_ms=10_000)
        except psycopg.OperationalError as exc:
            raise ActionError(503, f"postgres does not answer: {one_line(str(exc))[:200]}") from None
        async with conn:
            row = await fetch_one(conn, "SELECT pg_walfile_name(pg_switch_wal()) AS segment")
        log.info("switched WAL", segment=row["segment"])
        return {"segment": row["segment"]}

    def _wait_startable_now(self) -> None:
        """The identity checks before starting a rejoined data directory (a clone of another system is refused)."""
        self._read_config()
        problems = start_problems(self.settings.pgdata, self.config, self._binary_version)
        self._report("identity", problems)
        if problems:
            raise ActionError(409, "; ".join(p.message for p in problems))

    async def _clone_over(self, status: RejoinStatus) -> None:
        """Replace PGDATA by a clone of the primary; the old copy is removed once the clone is in place."""
        aside = move_aside(self.settings)

        def replication() -> Credentials | None:
            self._read_secrets()
            return self._secrets["replication"].credentials

        def note(message: str) -> None:
            status.message = one_line(f"cloning: {message}")[:300]

        await clone(self.settings, replication, on_error=note)
        await asyncio.to_thread(shutil.rmtree, aside, True)

    def _running_primary(self) -> bool:
        return self._data_ready and self.pg.running and not self._is_replica and self.fenced is None

    async def _isolation_loop(self) -> None:
        """See :mod:`kanri.instance.isolation`: a running primary with no contact for the window fences itself."""
        if not self.isolation.enabled:
            return
        log.info("isolation check on", apiserver=f"{self.isolation.host}:{self.isolation.port}",
                 window=self.isolation.window)  # fmt: skip
        probe = Probe(self.settings, self.isolation)
        try:
            while True:
                await self._isolation_pass(probe)
                await asyncio.sleep(INTERVAL)
        finally:
            await probe.close()

    async def _isolation_pass(self, probe: Probe) -> None:
        # run_queue_wait(): time spent waiting for a CPU is starvation, not a freeze nor isolation (issue 33)
        if not self._running_primary():
            self.watch.idle(time.monotonic(), run_queue_wait())
            await probe.close()
            return
        if (gap := self.watch.frozen(time.monotonic(), run_queue_wait())) is not None:
            await self._self_fence(f"isolated: the manager did not run for {gap:.1f} s (frozen); not checking")
            return
        via = await probe.check()
        if (gap := self.watch.frozen(time.monotonic(), run_queue_wait())) is not None:  # frozen while it was checking
            await self._self_fence(f"isolated: the manager did not run for {gap:.1f} s (frozen); not checking")
            return
        silent = self.watch.observe(time.monotonic(), via, datetime.now(UTC), run_queue_wait())
        if silent is not None and self._running_primary():
            await self._self_fence(f"isolated: neither the API server nor a standby answered for {silent:.1f} s")

    async def _self_fence(self, reason: str) -> None:
        log.error("self-fencing", reason=reason)
        with contextlib.suppress(ActionError):  # shutting down: PostgreSQL stops anyway
            await asyncio.shield(self._fence(reason))

    async def _action_connection(self) -> psycopg.AsyncConnection[DictRow]:
        if self._shutting_down:
            raise ActionError(503, "shutting down")
        if not self.pg.running:
            raise ActionError(503, "postgres is not running or does not accept connections")
        try:
            return await connect(self.settings, timeout=3, statement_timeout_ms=90_000)  # pg_promote waits up to 60 s
        except psycopg.OperationalError:
            raise ActionError(503, "postgres is not running or does not accept connections") from None
