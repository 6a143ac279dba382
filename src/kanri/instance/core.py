"""What every part of the instance manager shares: the settings, the PostgreSQL process, the cluster config and the
Secrets as last read, the problems, the lifecycle lock, and the facts the parts decide on (fenced, paused, a
replica, the data directory ready).

One lock (:attr:`Core.lock`) serialises everything that starts, stops or promotes PostgreSQL: the supervisor
(:mod:`kanri.instance.lifecycle`), the config loop (:mod:`kanri.instance.config_sync`) and the HTTP actions
(:mod:`kanri.instance.actions`). Roles and slots have their own (:attr:`Core.upkeep_lock`): the upkeep pass or a
promotion, one at a time.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Awaitable, Callable
from typing import get_args

import psycopg
import structlog
from psycopg.rows import DictRow

from kanri.instance.config import ClusterConfig, Credentials, Settings
from kanri.instance.credentials import Checked, Purpose, check_credentials, check_token
from kanri.instance.db import STATEMENT_TIMEOUT_MS, connect
from kanri.instance.disk_full import DiskWatch
from kanri.instance.fence import FenceRecord, marker_path, read_fence
from kanri.instance.http_api import ActionError
from kanri.instance.identity import start_problems
from kanri.instance.isolation import IsolationSettings, IsolationWatch
from kanri.instance.postgres_process import PostgresProcess
from kanri.instance.problems import UNREACHABLE, Problem, ProblemLog, Reachability, one_line
from kanri.instance.replication_pause import marker_path as pause_marker_path
from kanri.instance.replication_pause import read_pause

log = structlog.get_logger("kanri.instance")


class Core:
    """The shared state of one instance manager and the small checks every part makes on it."""

    def __init__(self, settings: Settings, isolation: IsolationSettings) -> None:
        self.settings = settings
        self.isolation = isolation
        self.watch = IsolationWatch(isolation.window)
        self.pg = PostgresProcess(settings)
        self.disk = DiskWatch(settings.pgdata)  # kanri:disk-full — DiskFull from PostgreSQL's log and statvfs
        self.pg.log_watchers.append(self.disk.saw_line)
        self.config = ClusterConfig()
        self.problems = ProblemLog()
        self.reach = Reachability()  # PostgresUnreachable: see connect_own
        self.lock = asyncio.Lock()
        self.upkeep_lock = asyncio.Lock()  # roles and slots: the upkeep pass or a promotion, one at a time
        self.shutting_down = False
        self.data_ready = False
        self.roles_ok = False  # ensure_roles succeeded since start or the last Secret change
        self.synced: object = None  # the postmaster the config loop last reached (to sync right after a start)
        self.binary_version: int | None = None
        self.secrets: dict[Purpose, Checked] = {}
        self.usable: dict[Purpose, Credentials | None] = dict.fromkeys(get_args(Purpose))  # last good, for files
        self.fence_path = marker_path(settings.pgdata)
        self.unfenced = asyncio.Event()  # set while no fence marker holds PostgreSQL stopped
        self.pause_path = pause_marker_path(settings.pgdata)
        self.paused = read_pause(self.pause_path) is not None  # memory decides the conf; the marker survives us
        self.resumed_at: float | None = None  # monotonic: the last /replication/resume that lifted a pause
        self.tls_context: ssl.SSLContext | None = None  # the HTTP API's, reloaded with a renewed certificate
        self._config_raw: bytes | None = None

    # ---- what was read from the volume ------------------------------------------------------------------------

    def read_config(self) -> bool:
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
            self.problems.report("config", [Problem("InvalidConfig", f"{exc}; keeping the previous config")])
            return False
        self.problems.report("config", [])
        log.info(
            "cluster config loaded" if first else "cluster config changed",
            instances=list(self.config.instances),
            parameters=sorted(self.config.parameters),
            synchronous_standbys=self.config.synchronous_standbys,
        )
        return True

    def read_secrets(self) -> bool:
        """Check every mounted Secret; True when any changed since the last call (usable or not)."""
        checked = {
            "superuser": check_credentials("superuser", self.settings.superuser_dir),
            "replication": check_credentials("replication", self.settings.replication_dir),
            "app": check_credentials("app", self.settings.app_dir),
        }
        purpose: Purpose
        for purpose, result in checked.items():  # type: ignore[assignment]  # the keys are the Purpose literals
            self.problems.report(f"secret:{purpose}", result.problems)
            if result.credentials is not None:
                self.usable[purpose] = result.credentials
        self.problems.report("secret:api", check_token(self.settings.token_file)[1])
        changed = checked != self.secrets
        self.secrets = checked  # type: ignore[assignment]
        return changed

    def replication_credentials(self) -> Credentials | None:
        """The replication Secret as it is now (a clone reads it again before each attempt)."""
        self.read_secrets()
        return self.secrets["replication"].credentials

    def api_token(self) -> str | None:
        """The current API token, checked (re-read each time: the Secret may rotate). None: every action is 401."""
        token, problems = check_token(self.settings.token_file)
        self.problems.report("secret:api", problems)
        return token

    @property
    def is_replica(self) -> bool:
        return (self.settings.pgdata / "standby.signal").exists()

    # ---- fence ------------------------------------------------------------------------------------------------

    @property
    def fenced(self) -> FenceRecord | None:
        """The fence in force (read from the volume: the marker is the truth, not memory)."""
        return read_fence(self.fence_path)

    def check_fence(self) -> FenceRecord | None:
        """Read the marker and bring the supervisor's gate and the ``Fenced`` problem in line with it."""
        record = self.fenced
        if record is None:
            self.unfenced.set()
            self.problems.report("fence", [])
        else:
            self.unfenced.clear()
            since = f" since {record.since}" if record.since else ""
            self.problems.report(
                "fence",
                [Problem("Fenced", f"fenced{since}: {record.reason}; PostgreSQL is kept stopped until POST /unfence")],
            )
        return record

    def refuse_if_fenced(self, action: str) -> None:
        if (fence := self.fenced) is not None:
            raise ActionError(409, f"refusing to {action}: the instance is fenced ({fence.reason}); unfence it first")

    def running_primary(self) -> bool:
        return self.data_ready and self.pg.running and not self.is_replica and self.fenced is None

    def check_startable(self) -> None:
        """The identity checks before starting a data directory now (a clone of another system is refused): 409."""
        self.read_config()
        problems = start_problems(self.settings.pgdata, self.config, self.binary_version)
        self.problems.report("identity", problems)
        if problems:
            raise ActionError(409, "; ".join(p.message for p in problems))

    # ---- connections to our own PostgreSQL --------------------------------------------------------------------

    async def connect_own(
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
                self.problems.report(UNREACHABLE, self.reach.failed(postmaster, exc))
            raise
        self.problems.report(UNREACHABLE, self.reach.reached())
        return conn

    async def try_connect(self) -> psycopg.AsyncConnection[DictRow] | None:
        """:meth:`connect_own` for ``/status`` and ``/readyz``: None when PostgreSQL does not run or answer."""
        if not self.pg.running:
            # nothing to reach (stopped, fenced, restarting): an earlier PostgresUnreachable no longer holds
            self.problems.report(UNREACHABLE, self.reach.reached())
            return None
        try:
            return await self.connect_own(timeout=3, statement_timeout_ms=5_000)
        except psycopg.OperationalError:
            return None

    async def action_connection(self) -> psycopg.AsyncConnection[DictRow]:
        """A connection for an HTTP action; 503 when PostgreSQL is not there to take it."""
        if self.shutting_down:
            raise ActionError(503, "shutting down")
        if not self.pg.running:
            raise ActionError(503, "postgres is not running or does not accept connections")
        try:
            return await connect(self.settings, timeout=3, statement_timeout_ms=90_000)  # pg_promote waits up to 60 s
        except psycopg.OperationalError:
            raise ActionError(503, "postgres is not running or does not accept connections") from None

    # ---- the loops --------------------------------------------------------------------------------------------

    async def repeat(self, name: str, one_pass: Callable[[], Awaitable[None]]) -> None:
        """Run ``one_pass`` forever; an error is reported (once per distinct message) and the loop goes on."""
        while True:
            try:
                await one_pass()
            except (psycopg.Error, OSError) as exc:
                if self.problems.record(name, one_line(f"{name} failed: {exc}")):
                    log.warning(f"{name} failed", error=one_line(str(exc)))
            except Exception as exc:  # a bug here must not take PostgreSQL down with the manager: report, go on
                if self.problems.record(name, one_line(f"{name} failed: {exc!r}")):
                    log.exception(f"{name} failed unexpectedly")
            else:
                self.problems.clear(name)
            # right after a start, poll quickly until the new postmaster has been synced once (and, on a primary,
            # its roles are in place: a standby never gets there, and polling it 5 times a second costs a core)
            pending = self.synced is not self.pg.process or (not self.roles_ok and not self.is_replica)
            fast = self.pg.running and pending
            await asyncio.sleep(0.2 if fast else self.settings.config_interval)
