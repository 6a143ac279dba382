"""The instance manager: prepare the data directory, run PostgreSQL, keep it configured, answer the operator.

One process, PID 1 of the pod, assembled from parts that each hold one concern and share a :class:`Core` (the
settings, the PostgreSQL process, the config, the problems and the lifecycle lock):

- :mod:`kanri.instance.lifecycle`: bootstrap, the start checks, and the supervisor (start; restart with back-off after
  an unexpected exit; nothing while fenced, see :mod:`kanri.instance.fence`);
- :mod:`kanri.instance.config_sync`: the config loop (every ``config_interval``: config file and Secrets → checked →
  files → reload);
- :mod:`kanri.instance.upkeep`: the upkeep loop (roles and slots on a primary);
- :mod:`kanri.instance.actions`, :mod:`kanri.instance.rejoin_action`, :mod:`kanri.instance.backup_actions`: what the
  operator asks over HTTP (:mod:`kanri.instance.http_api`);
- :mod:`kanri.instance.isolation_guard`: a primary that lost contact fences itself;
- :mod:`kanri.instance.status_report`: ``GET /status`` (a :class:`kanri.contract.status.InstanceStatus`) and
  ``/readyz``.

The config loop and the upkeep loop are separate tasks, so a statement blocked in one (a lock, a synchronous-commit
wait) never keeps a config change from applying. Nothing is started that is not proven to start: parameters are
checked with PostgreSQL before they are written, and the data directory's system identifier and major before each
start. SIGTERM/SIGINT → fast shutdown of PostgreSQL → exit 0.
"""

from __future__ import annotations

import asyncio
import signal
import ssl
from typing import Any

import structlog
from aiohttp import web

from kanri.instance.actions import Actions
from kanri.instance.backup_actions import BackupActions
from kanri.instance.config import Settings
from kanri.instance.config_sync import ConfigSync
from kanri.instance.core import Core
from kanri.instance.exporter import InstanceExporter, ManagerState, metrics_port
from kanri.instance.http_api import build_app
from kanri.instance.isolation import IsolationSettings
from kanri.instance.isolation_guard import IsolationGuard
from kanri.instance.lifecycle import Lifecycle
from kanri.instance.pooler_role import PoolerRole
from kanri.instance.rejoin_action import RejoinAction
from kanri.instance.status_report import StatusReport
from kanri.instance.tls import install as install_tls
from kanri.instance.tls import server_context
from kanri.instance.upkeep import Upkeep

log = structlog.get_logger("kanri.instance")


class InstanceManager:
    """One instance: see the module docstring. ``run()`` is the whole life of the process; the other public methods
    are the HTTP API's backend (:class:`kanri.instance.http_api.Backend` and ``BackupBackend``)."""

    def __init__(self, settings: Settings, isolation: IsolationSettings | None = None) -> None:
        self.settings = settings
        self.core = Core(settings, isolation or IsolationSettings(enabled=False, host="", port=443))
        self.sync = ConfigSync(self.core)
        self.upkeep = Upkeep(self.core)
        self.lifecycle = Lifecycle(self.core, self.sync)
        self.actions = Actions(self.core, self.sync, self.upkeep, self.lifecycle)
        self.rejoining = RejoinAction(self.core, self.lifecycle)
        self.backups = BackupActions(self.core)
        self.pooler = PoolerRole(self.core)
        self.guard = IsolationGuard(self.core, self.actions)
        self.report = StatusReport(self.core, self.lifecycle, self.rejoining)
        self._stop = asyncio.Event()

    # ---- process life -------------------------------------------------------------------------------------------

    async def run(self) -> int:
        """Serve HTTP, bootstrap, run PostgreSQL until SIGTERM/SIGINT; return the exit code (0 after a clean stop)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_shutdown)
        runner = web.AppRunner(build_app(self, self, self), access_log=None)
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
        main = asyncio.create_task(self._main())
        stop = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait([main, stop], return_when=asyncio.FIRST_COMPLETED)
            code = self._exit_code(main)
        finally:
            await self._shut_down(main, stop)
            if exporter is not None:
                await exporter.stop()
            async with self.core.lock:
                await self.core.pg.stop()
            await runner.cleanup()
        log.info("instance manager stopped", exit_code=code)
        return code

    @staticmethod
    def _exit_code(main: asyncio.Task[None]) -> int:
        """1 when the manager's work failed (logged with the real error), else 0."""
        if main.done() and not main.cancelled() and (exc := main.exception()) is not None:
            cause = exc
            while isinstance(cause, BaseExceptionGroup):  # from a loop's TaskGroup: name the real error
                cause = cause.exceptions[0]
            log.error("instance manager failed", error=str(cause), exc_info=exc)
            return 1
        return 0

    async def _shut_down(self, main: asyncio.Task[None], stop: asyncio.Task[Any]) -> None:
        self.core.shutting_down = True
        main.cancel()
        stop.cancel()
        rejoin = self.rejoining.task
        if rejoin is not None:
            rejoin.cancel()  # it holds the lock while it rewinds or clones
        await asyncio.gather(main, stop, *filter(None, [rejoin]), return_exceptions=True)
        await self.backups.close()

    async def _main(self) -> None:
        await self.lifecycle.prepare()
        async with asyncio.TaskGroup() as group:
            group.create_task(self.lifecycle.supervise())
            group.create_task(self.sync.run())
            group.create_task(self.upkeep.run())
            group.create_task(self.guard.run())
            group.create_task(self.core.disk.run(self.core.problems))  # kanri:disk-full
            group.create_task(self.report.upstream.run())  # kanri:upstream-evidence

    def _exporter_state(self) -> ManagerState:
        core = self.core
        contact = core.watch.last_contact if core.isolation.enabled else None
        last_contact = contact.timestamp() if contact else None
        return ManagerState(
            core.pg.running, core.fenced is not None, core.paused, last_contact, disk_full=core.disk.full
        )  # kanri:disk-full

    def _serve_tls(self) -> ssl.SSLContext | None:
        """The HTTP API's TLS context (the server certificate, as PostgreSQL's), or None without a certificate."""
        install_tls(self.settings)
        self.core.tls_context = server_context(self.settings)
        return self.core.tls_context

    def request_shutdown(self) -> None:
        """Stop: fast shutdown of PostgreSQL, then exit (signal handler)."""
        log.info("shutdown requested")
        self.core.shutting_down = True
        self._stop.set()

    # ---- the HTTP API's backend ---------------------------------------------------------------------------------

    def api_token(self) -> str | None:
        """The current API token (re-read each time: the Secret may rotate). None: every action is 401."""
        return self.core.api_token()

    async def status(self) -> dict[str, Any]:
        """``GET /status``'s body (see :mod:`kanri.instance.status_report`)."""
        return (await self.report.status()).as_json()

    async def not_ready_reason(self) -> str | None:
        """Why ``/readyz`` fails, or None when ready."""
        return await self.report.not_ready_reason()

    async def promote(self) -> dict[str, Any]:
        return await self.actions.promote()

    async def restart(self) -> dict[str, Any]:
        return await self.actions.restart()

    async def fence(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.actions.fence(body)

    async def unfence(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.actions.unfence(body)

    async def pause_replication(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.actions.pause_replication(body)

    async def resume_replication(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.actions.resume_replication(body)

    async def demote(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.actions.demote(body)

    async def rejoin(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.rejoining.rejoin(body)

    async def start_backup(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.backups.start_backup(body)

    async def backup_record(self, backup: str) -> dict[str, Any]:
        return await self.backups.backup_record(backup)

    async def expire_backups(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.backups.expire_backups(body)

    async def backup_catalogue(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.backups.backup_catalogue(body)

    async def switch_wal(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.backups.switch_wal(body)

    async def ensure_pooler_role(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.pooler.ensure(body)
