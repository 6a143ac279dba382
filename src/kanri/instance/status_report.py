"""What the instance says about itself: the ``GET /status`` body (a :class:`kanri.contract.status.InstanceStatus`)
and the reason ``GET /readyz`` fails.

The manager's own view (role, fencing, the pause, problems, the last error, a rejoin's or a restore's progress)
is always there; what PostgreSQL reports (positions, timeline, replication, the archiver) is added while it answers.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import DictRow

from kanri.contract.status import InstanceStatus
from kanri.instance import status as status_queries
from kanri.instance.core import Core
from kanri.instance.identity import data_version
from kanri.instance.lifecycle import Lifecycle
from kanri.instance.problems import UNREACHABLE
from kanri.instance.rejoin_action import RejoinAction
from kanri.instance.upstream import UpstreamWatch


class StatusReport:
    """Builds ``/status`` and ``/readyz``'s answer from the manager's parts."""

    def __init__(self, core: Core, lifecycle: Lifecycle, rejoin: RejoinAction) -> None:
        self.core = core
        self.lifecycle = lifecycle
        self.rejoin = rejoin
        self.upstream = UpstreamWatch(core)
        """A replica's evidence of its primary's WAL end; its loop is started by the manager."""

    async def not_ready_reason(self) -> str | None:
        """Why ``/readyz`` fails, or None when ready."""
        conn = await self.core.try_connect()
        if conn is None:
            return await self._not_ready(None)
        async with conn:
            return await self._not_ready(conn)

    async def _not_ready(self, conn: psycopg.AsyncConnection[DictRow] | None) -> str | None:
        core = self.core
        if core.shutting_down:
            return "shutting down"
        if (fence := core.fenced) is not None:
            return f"fenced: {fence.reason}"
        if not core.data_ready:
            return f"bootstrapping ({core.settings.bootstrap})"
        if identity := core.problems.board.get("identity"):
            return identity[0].message
        if not core.pg.running or conn is None:
            if core.pg.running and (unreachable := core.problems.board.get(UNREACHABLE)):
                return f"postgres unreachable: {unreachable[0].message}"
            return "postgres is not running" if not core.pg.running else "postgres does not accept connections"
        if core.paused and core.is_replica:  # no receiver on purpose; still kept out of -ro while it lasts
            return "replication paused"
        if reason := await status_queries.readiness(conn):
            return reason
        if not core.is_replica and not core.roles_ok:
            return "roles are not in place yet"
        return None

    def _manager_view(self) -> dict[str, Any]:
        """The fields the manager knows without asking PostgreSQL (each always sent, even when None)."""
        core = self.core
        if self.lifecycle.recloning:  # its data directory is gone while it clones: never mistaken for a primary
            role: str = "replica"
        elif not core.data_ready:
            role = core.settings.bootstrap
        else:
            role = "replica" if core.is_replica else "primary"
        fence = core.fenced
        view: dict[str, Any] = {
            "name": core.settings.name, "role": role, "in_recovery": None, "timeline": None,
            "system_identifier": None, "postgres_version": None, "connections": None, "pending_restart": None,
            "config_errors": None, "archiver": None, "running": core.pg.running, "ready": False,
            "restart_count": self.lifecycle.restart_count, "last_error": core.problems.last_error,
            "data_version": data_version(core.settings.pgdata), "binary_version": core.binary_version,
            "problems": core.problems.board.all(), "fenced": fence is not None, "replication_paused": core.paused,
            "rejoin": self.rejoin.progress(), "isolation": core.watch.as_json() if core.isolation.enabled else None,
            "restore": self.lifecycle.restore,
        }  # fmt: skip
        if fence is not None:
            view.update(fenced_since=fence.since or None, fence_reason=fence.reason)
        return view

    async def status(self) -> InstanceStatus:
        """``GET /status``: the manager's view plus what PostgreSQL reports when it is up."""
        core = self.core
        view = self._manager_view()
        conn = await core.try_connect()
        # that connection may have raised or cleared PostgresUnreachable: report what holds now
        view.update(last_error=core.problems.last_error, problems=core.problems.board.all())
        if conn is not None:
            async with conn:
                try:
                    view.update(await status_queries.collect(conn))
                    if view.get("in_recovery"):
                        await self.upstream.observe(conn)
                    view["ready"] = await self._not_ready(conn) is None
                except psycopg.Error as exc:
                    view["last_error"] = f"status query failed: {exc}"
        if view.get("role") == "replica" and (upstream := self.upstream.report()) is not None:
            view["upstream"] = upstream  # only when known: an instance that heard nothing sends no key
        return InstanceStatus(**view)
