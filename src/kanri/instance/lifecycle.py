"""The life of the data directory and of PostgreSQL: prepare PGDATA (initdb, a clone, or a recovery), check that it
may be started, start PostgreSQL, and supervise it.

Nothing is started that is not proven to start: the data directory's system identifier and major are checked before
each start, and a replica left on an older major by a major upgrade is cloned again from the new primary. The
supervisor restarts a PostgreSQL that exits unexpectedly after a growing pause, and keeps it stopped while the
instance is fenced (:mod:`kanri.instance.fence`).
"""

from __future__ import annotations

import asyncio
import shutil
import time

import structlog

from kanri.contract.status import Restore
from kanri.instance.bootstrap import clone, discard_partial, has_data, initdb, recover
from kanri.instance.config import ClusterConfig
from kanri.instance.config_sync import ConfigSync
from kanri.instance.core import Core
from kanri.instance.identity import binary_version, data_version, start_problems
from kanri.instance.problems import Problem, one_line
from kanri.instance.rejoin import restore_interrupted

log = structlog.get_logger("kanri.instance")

MAX_BACKOFF = 30.0
"""Longest wait before restarting a PostgreSQL that keeps dying."""

STABLE_RUN = 60.0
"""A PostgreSQL that ran this long before dying is restarted after the shortest back-off again."""


class Lifecycle:
    """Bootstrap, the start checks, the start itself and the supervisor."""

    def __init__(self, core: Core, sync: ConfigSync) -> None:
        self.core = core
        self.sync = sync
        self.restart_count = 0
        self.restore: Restore | None = None  # bootstrap.recovery's progress, for /status
        self.recloning = False  # a replica cloned again after a major upgrade (_reclone_after_upgrade)

    async def prepare(self) -> None:
        """Everything before PostgreSQL's first start: the config, the Secrets, the fence, the data directory."""
        core = self.core
        core.binary_version = await binary_version(core.settings.binary("postgres"))
        core.read_config()
        core.read_secrets()
        core.check_fence()  # before anything starts PostgreSQL: a fenced instance must never serve again by itself
        if done := restore_interrupted(core.settings):
            log.warning(done, pgdata=str(core.settings.pgdata))
        discard_partial(core.settings)
        if not has_data(core.settings.pgdata):
            await self._bootstrap()
        core.data_ready = True
        await self.wait_startable()

    async def _bootstrap(self) -> None:
        """An empty PGDATA: initdb for a new cluster's primary; otherwise (a replica, or a primary whose cluster was
        initialised already: its data directory was lost) a clone of the primary."""
        core, settings = self.core, self.core.settings
        if settings.bootstrap == "primary" and core.config.system_identifier is None and core.config.recovery:
            await self._recover()
        elif settings.bootstrap == "primary" and core.config.system_identifier is None:
            await initdb(settings, superuser=core.secrets["superuser"].credentials)
        else:
            lost = settings.bootstrap == "primary"
            if lost:  # initdb would serve an empty database as if nothing happened
                message = (f"the data directory is empty but the cluster was initialised (system "
                           f"{core.config.system_identifier}); cloning from {settings.primary_host} instead of "
                           "running initdb")  # fmt: skip
                core.problems.report("bootstrap:lost", [Problem("DataDirectoryLost", message)])
            await clone(settings, core.replication_credentials,
                        on_error=lambda message: core.problems.note("bootstrap", message))  # fmt: skip
            core.problems.report("bootstrap:lost", [])
        log.info("data directory ready", bootstrap=settings.bootstrap)
        core.problems.clear("bootstrap")

    async def _recover(self) -> None:
        """bootstrap.recovery: restore, replay to the target, promote (see :mod:`kanri.instance.restore`). Progress and
        failures show in /status (``restore``, ``lastError``); the roles get this cluster's passwords at the first
        upkeep pass, as after an initdb."""
        core = self.core
        plan = core.config.recovery
        assert plan is not None
        self.restore = Restore(state="running", plan=plan.describe(), message="starting")

        def config() -> ClusterConfig:
            core.read_config()
            return core.config

        def progress(message: str) -> None:
            if self.restore is not None:
                self.restore = self.restore.model_copy(update={"message": one_line(message)[:300]})
            log.info("restore", progress=message)

        await recover(core.settings, config, on_error=lambda message: core.problems.note("bootstrap", message),
                      on_progress=progress)  # fmt: skip
        if self.restore is not None:
            self.restore = self.restore.model_copy(update={"state": "done"})

    async def wait_startable(self) -> None:
        """Return once the data directory may be started: same cluster (system identifier), same major."""
        core = self.core
        while True:
            core.read_config()
            problems = start_problems(core.settings.pgdata, core.config, core.binary_version)
            if problems and self._upgraded_away():
                await self._reclone_after_upgrade()
                continue
            core.problems.report("identity", problems)
            if not problems:
                return
            await asyncio.sleep(core.settings.config_interval)

    def _upgraded_away(self) -> bool:
        """This instance's data is of an older major than the cluster's primary after a major upgrade (the
        operator's ``upgrade`` note names that primary and its new major, the binaries are of that major)."""
        core = self.core
        note = core.config.upgrade
        found = data_version(core.settings.pgdata)
        return (note is not None and note.primary != core.settings.name and core.binary_version == note.to
                and found is not None and found < note.to)  # fmt: skip

    async def _reclone_after_upgrade(self) -> None:
        """A replica left on the old major by a major upgrade: its data is removed and cloned from the new
        primary (pg_upgrade upgrades one data directory; replicas cannot follow it)."""
        core = self.core
        found = data_version(core.settings.pgdata)
        log.warning("the cluster was upgraded: cloning this replica again from the new primary",
                    data_major=found, cluster_major=core.binary_version)  # fmt: skip
        core.problems.note("bootstrap", f"re-cloning: the data is PostgreSQL {found}, the cluster was upgraded to "
                           f"{core.binary_version}")  # fmt: skip
        self.recloning = True
        try:
            shutil.rmtree(core.settings.pgdata)
            await clone(core.settings, core.replication_credentials,
                        on_error=lambda message: core.problems.note("bootstrap", message))  # fmt: skip
        finally:
            self.recloning = False
        core.problems.clear("bootstrap")

    async def start(self) -> asyncio.subprocess.Process:
        """Write the files and start PostgreSQL (the caller holds the lock and has checked the identity)."""
        await self.sync.write_files()
        return await self.core.pg.start()

    async def supervise(self) -> None:
        """Start PostgreSQL; whenever it exits without being asked to, start it again after a growing pause. While the
        instance is fenced it stays stopped; it starts again once the fence is lifted."""
        core = self.core
        delay = 1.0
        proc: asyncio.subprocess.Process | None = None
        while True:
            if not core.unfenced.is_set():
                log.warning("postgres kept stopped: the instance is fenced", marker=str(core.fence_path))
                await core.unfenced.wait()
                await self.wait_startable()
            async with core.lock:
                if core.shutting_down:
                    return
                if core.check_fence() is not None:
                    continue  # fenced meanwhile (or the marker was put there by hand): wait for the fence to lift
                if core.pg.process is not None and core.pg.process is not proc:
                    proc = core.pg.process  # started on purpose (POST /restart)
                else:
                    proc = await self.start()
            started = time.monotonic()
            code = await proc.wait()
            async with core.lock:
                if core.shutting_down:
                    return
                if core.pg.process is not proc or core.check_fence() is not None:
                    continue  # restarted on purpose (POST /restart), or stopped on purpose (POST /fence)
                self.restart_count += 1
                delay = 1.0 if time.monotonic() - started > STABLE_RUN else delay
                core.problems.record("postgres", f"postgres exited unexpectedly with code {code}")
                log.error("postgres exited unexpectedly", exit_code=code, restart_in=delay, restarts=self.restart_count)
            await core.disk.pause(delay)  # kanri:disk-full — a volume that has room again ends the back-off
            delay = min(delay * 2, MAX_BACKOFF)
            await self.wait_startable()
