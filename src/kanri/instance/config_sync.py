"""The config loop: every ``config_interval``, the cluster config file and the Secrets → checked → files → reload.

Only user parameters PostgreSQL accepts are written (each candidate ``postgresql.conf`` is checked with PostgreSQL
itself, :mod:`kanri.instance.conf_check`); the others are reported as ``InvalidParameter``. The files are also what
every start of PostgreSQL writes first (:meth:`ConfigSync.write_files`), so a start never reads a stale file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import psycopg
import structlog
from psycopg.rows import DictRow

from kanri.instance import status as status_queries
from kanri.instance.conf import render_hba, render_passfile, render_postgresql_conf, split_parameters, write_if_changed
from kanri.instance.conf_check import Choice, ConfChecker, choose
from kanri.instance.core import Core
from kanri.instance.problems import Problem, one_line
from kanri.instance.tls import enabled as tls_enabled
from kanri.instance.tls import install as install_tls
from kanri.instance.tls import reload_context

log = structlog.get_logger("kanri.instance")


def parameter_problems(refused: dict[str, str], choice: Choice) -> list[Problem]:
    """``InvalidParameter`` for each user parameter refused by name or by PostgreSQL, and for a file that does not
    load at all."""
    problems = [
        Problem("InvalidParameter", f'parameter "{one_line(n)[:63]}": {why}; not written', parameter=n[:63])
        for n, why in refused.items()
    ]
    for name, message in choice.refused.items():
        kept = "keeps its last good value" if name in choice.parameters else "not written"
        problems.append(Problem("InvalidParameter", f"{message}; {kept}", parameter=name))
    for name, message in choice.elsewhere.items():
        problems.append(
            Problem("InvalidParameter", f"{message} (set outside the cluster spec, e.g. ALTER SYSTEM)", parameter=name)
        )
    problems += [Problem("InvalidParameter", f"postgresql.conf does not load: {m}") for m in choice.other]
    return problems


class ConfigSync:
    """Writes ``postgresql.conf``, ``pg_hba.conf`` and the passfile from the config and Secrets, and reloads."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.checker = ConfChecker(core.settings)
        self.parameters: dict[str, str] = {}  # the user parameters last written (each passed the check)
        self._choice: Choice | None = None
        self._choice_key: tuple[str, bytes] | None = None
        self._pending: list[str] = []

    def forget_choice(self) -> None:
        """Ask PostgreSQL again at the next write (something outside the candidate changed: auto.conf, a library)."""
        self._choice = None

    async def _choose_parameters(self, wanted: dict[str, str], render: Callable[[Mapping[str, str]], str]) -> Choice:
        """The user parameters PostgreSQL accepts (asked again only when the candidate or auto.conf changed)."""
        try:
            auto = (self.core.settings.pgdata / "postgresql.auto.conf").read_bytes()
        except FileNotFoundError:
            auto = b""
        key = (render(wanted), auto)
        if self._choice is None or key != self._choice_key:
            self._choice = await choose(self.checker, render, wanted, self.parameters)
            self._choice_key = key
        return self._choice

    async def write_files(self) -> bool:
        """postgresql.conf, pg_hba.conf (in PGDATA) and the passfile for the current role; True if a conf changed.

        Only user parameters PostgreSQL accepts are written; the others are reported."""
        core, settings = self.core, self.core.settings
        replication = core.usable["replication"]
        replica = core.is_replica
        config = core.config
        paused = core.paused
        tls_changed = install_tls(settings)  # a renewed certificate: the reload below makes PostgreSQL use it
        if tls_changed and core.tls_context is not None:
            reload_context(settings, core.tls_context)  # and the HTTP API's next handshakes
        tls = tls_enabled(settings)

        def render(parameters: Mapping[str, str]) -> str:
            return render_postgresql_conf(
                settings, config, parameters, replica=replica, replication=replication, paused=paused, tls=tls
            )

        wanted, refused = split_parameters(config)
        choice = await self._choose_parameters(wanted, render)
        core.problems.report("parameters", parameter_problems(refused, choice))
        changed = write_if_changed(settings.pgdata / "postgresql.conf", render(choice.parameters))
        self.parameters = dict(choice.parameters)
        changed |= write_if_changed(settings.pgdata / "pg_hba.conf", render_hba(replication, tls=tls))
        changed |= tls_changed
        settings.socket_dir.mkdir(parents=True, exist_ok=True)
        write_if_changed(settings.passfile, render_passfile(replication))  # libpq reads it on each connect
        return changed

    async def run(self) -> None:
        """The config loop (forever)."""
        await self.core.repeat("sync", self.sync)

    async def sync(self) -> None:
        """One pass: config and Secrets → checked → files → reload; pending-restart report."""
        core = self.core
        fenced = core.check_fence() is not None  # a marker removed or put there by hand is seen within a pass
        config_changed = core.read_config()
        if core.read_secrets():
            core.roles_ok = False
        async with core.lock:
            if fenced and core.pg.running and core.check_fence() is not None:
                log.warning("fence marker found: stopping postgres", marker=str(core.fence_path))
                await core.pg.stop()
            files_changed = await self.write_files()
            process = core.pg.process
            if not core.pg.running:
                return
        try:
            conn = await core.connect_own(timeout=2, statement_timeout_ms=5_000)
        except psycopg.OperationalError:
            return  # starting up, or stopping: the next pass will do (a lasting failure is PostgresUnreachable)
        async with conn:
            if files_changed:
                await self._reload(conn, config_changed)
            await self._report_pending_restart(conn)
            core.synced = process
        # a full pass reached a running PostgreSQL: an earlier crash no longer holds
        core.problems.clear("postgres")

    async def _reload(self, conn: psycopg.AsyncConnection[DictRow], config_changed: bool) -> None:
        await conn.execute("SELECT pg_reload_conf()")
        log.info("configuration reloaded", config_changed=config_changed)
        if problems := await status_queries.config_errors(conn):
            if self.core.problems.record(
                "conf", "PostgreSQL cannot use parts of its configuration: " + "; ".join(problems)
            ):
                log.error("configuration has errors", problems=problems)
        else:
            self.core.problems.clear("conf")

    async def _report_pending_restart(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        cursor = await conn.execute("SELECT name FROM pg_settings WHERE pending_restart ORDER BY name")
        pending = [row["name"] for row in await cursor.fetchall()]
        if pending != self._pending:
            if pending:
                log.info("parameters wait for a restart", parameters=pending)
            self._pending = pending
