"""What the operator asks an instance to do over HTTP (:mod:`kanri.instance.http_api`): promote, restart, fence and
unfence, pause and resume replication, demote, rejoin.

Every action that starts, stops or promotes PostgreSQL holds the lifecycle lock (:attr:`Core.lock`) while it does.
A refusal is an :class:`ActionError` with the HTTP status to answer; an answer is the JSON object the operator reads.
Fencing and demoting are shielded: once PostgreSQL's shutdown has begun it completes, whatever the caller does.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

import psycopg
import structlog
from psycopg.rows import DictRow

from kanri.contract.actions import Demoted, Fenced, FenceRequest, Paused, Promoted, Restarted, Resumed, Unfenced
from kanri.instance import status as status_queries
from kanri.instance.archive_gap import mark_old_timeline_ready
from kanri.instance.config_sync import ConfigSync
from kanri.instance.core import Core
from kanri.instance.db import fetch_one
from kanri.instance.demote import read_controldata
from kanri.instance.fence import FENCED_STOP_TIMEOUT, lift, write_fence
from kanri.instance.http_api import ActionError
from kanri.instance.identity import start_problems
from kanri.instance.lifecycle import Lifecycle
from kanri.instance.problems import one_line
from kanri.instance.replication_pause import clear_pause, read_pause, write_pause
from kanri.instance.upkeep import Upkeep

log = structlog.get_logger("kanri.instance")

MAX_REASON = 200
"""Longest fence reason kept (it is shown in /readyz, /status and the operator's status)."""

PAUSE_WAIT = 10.0
"""How long ``POST /replication/pause`` waits for the WAL receiver to stop."""

# nothing streamed since PostgreSQL started (restarted while paused): what it has is what is in pg_wal, and the
# startup process replays all of it
_PAUSED_AT = (
    "SELECT coalesce(pg_last_wal_receive_lsn(), pg_last_wal_replay_lsn())::text AS receive,"
    " pg_last_wal_replay_lsn()::text AS replay,"
    " (SELECT timeline_id FROM pg_control_checkpoint()) AS checkpoint_tli"
)


class Actions:
    """The HTTP-triggered actions that change PostgreSQL's role or state."""

    def __init__(self, core: Core, sync: ConfigSync, upkeep: Upkeep, lifecycle: Lifecycle) -> None:
        self.core = core
        self.sync = sync
        self.upkeep = upkeep
        self.lifecycle = lifecycle

    async def promote(self) -> dict[str, Any]:
        """``POST /promote``: pg_promote, wait for the end of recovery, switch the files to the primary's."""
        core = self.core
        asked = time.monotonic()
        async with core.lock:
            locked = time.monotonic()
            core.refuse_if_fenced("promote")
            conn = await core.action_connection()
            async with conn:
                if not (await fetch_one(conn, "SELECT pg_is_in_recovery() AS r"))["r"]:
                    raise ActionError(409, "this instance is already a primary")
                log.info("promoting")
                done = (await fetch_one(conn, "SELECT pg_promote(wait => true, wait_seconds => 60) AS done"))["done"]
                promoted = time.monotonic()
                if not done:
                    raise ActionError(504, "promotion did not finish within 60 s")
                state = await self._as_new_primary(conn)
        # Where the time went (the operator's failover waits for this answer): the lock, pg_promote, the upkeep.
        log.info("promoted", timeline=state["timeline"], lsn=state["write_lsn"], lock_wait=round(locked - asked, 3),
                 promote_seconds=round(promoted - locked, 3), total=round(time.monotonic() - asked, 3))  # fmt: skip
        return Promoted(timeline=state["timeline"], lsn=state["write_lsn"]).as_json()

    async def _as_new_primary(self, conn: psycopg.AsyncConnection[DictRow]) -> dict[str, Any]:
        """Right after pg_promote: no pause, roles and slots in place, the old timeline's WAL marked for the archive;
        the database part of ``/status`` then."""
        core = self.core
        if clear_pause(core.pause_path) or core.paused:  # a primary has no replication to pause
            core.paused = False
            log.info("replication pause ended by the promotion")
        # The primary's files (no primary_conninfo) are written by the config loop's next pass, brought forward
        # here: checking them with PostgreSQL takes seconds, and nothing waits on them — synchronous_standby_names
        # is in a replica's file already, so the first commit is synchronous.
        core.synced = None
        async with core.upkeep_lock:  # the upkeep loop sees the new primary too: not both at once
            await self.upkeep.ensure_roles(conn)
            await self.upkeep.reconcile_slots(conn)
        state = await status_queries.collect(conn)
        if core.config.archive is not None and isinstance(state.get("timeline"), int):
            # the old timeline's segments only this instance still has reach the archive too
            marked = mark_old_timeline_ready(core.settings.pgdata, int(state["timeline"]))
            if marked:
                log.info("old timeline marked for archiving", files=len(marked), first=marked[0],
                         last=marked[-1])  # fmt: skip
        return state

    async def restart(self) -> dict[str, Any]:
        """``POST /restart``: fast shutdown and start again with the current files; answer once it takes connections.

        Refused (409) unless the data directory may be started and PostgreSQL accepts the configuration it would
        read: a restart into a file that does not load is an outage on a lone primary."""
        core = self.core
        async with core.lock:
            core.refuse_if_fenced("restart")
            if core.shutting_down or not core.data_ready or core.pg.process is None:
                raise ActionError(503, "postgres is not running yet")
            if problems := start_problems(core.settings.pgdata, core.config, core.binary_version):
                raise ActionError(409, "refusing to restart: " + "; ".join(p.message for p in problems))
            await self._refuse_a_config_that_would_not_load()
            await core.pg.stop()
            await core.pg.start()
        try:
            await core.pg.wait_accepting(timeout=120)
        except (TimeoutError, RuntimeError) as exc:
            raise ActionError(500, f"postgres did not come back: {exc or 'timeout'}") from None
        conn = await core.action_connection()
        async with conn:
            pending = await fetch_one(conn, "SELECT EXISTS (SELECT 1 FROM pg_settings WHERE pending_restart) AS p")
        log.info("postgres restarted on request")
        return Restarted(pending_restart=pending["p"]).as_json()

    async def _refuse_a_config_that_would_not_load(self) -> None:
        await self.sync.write_files()
        current = (self.core.settings.pgdata / "postgresql.conf").read_text()
        check = await self.sync.checker.check(current, self.sync.parameters)
        if not check.loads:
            self.sync.forget_choice()  # the next pass reports what changed (auto.conf, a library gone)
            reasons = [f"{n}: {m}" for n, m in check.by_parameter.items()] + check.other
            raise ActionError(
                409, one_line("refusing to restart: the configuration would not load: " + "; ".join(reasons))
            )

    async def fence(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /fence``: put the marker on the volume, then stop PostgreSQL (fast shutdown) and keep it stopped.

        The marker comes first, so a manager killed halfway comes back fenced. Idempotent: fencing a fenced instance
        keeps the first record and answers the same. Shielded: the operator's request may time out while PostgreSQL
        shuts down; the shutdown goes on regardless."""
        reason = one_line((FenceRequest.read(body).reason or "fenced on request")[:MAX_REASON])
        return await asyncio.shield(self.fence_now(reason))

    async def fence_now(self, reason: str) -> dict[str, Any]:
        """Fence with ``reason`` (``POST /fence``, or the isolation check's self-fencing)."""
        core = self.core
        async with core.lock:
            if core.shutting_down:
                raise ActionError(503, "shutting down")
            record = core.fenced
            already = record is not None
            if record is None:
                record = write_fence(core.fence_path, reason, datetime.now(UTC))
                log.warning("fenced: PostgreSQL stops and stays stopped", reason=reason, marker=str(core.fence_path))
            core.check_fence()
            stopped = core.pg.running  # this call stops it (a fenced instance's PostgreSQL is not running)
            await core.pg.stop(timeout=FENCED_STOP_TIMEOUT)  # never held by a standby that no longer answers
        return Fenced(since=record.since, reason=record.reason, already=already, stopped=stopped).as_json()

    async def unfence(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /unfence``: remove the marker; the supervisor starts PostgreSQL again (with whatever data it has —
        the operator's rejoin decides whether that data may serve)."""
        core = self.core
        async with core.lock:
            removed = lift(core.fence_path)
            core.check_fence()
        if removed:
            log.warning("fence lifted: PostgreSQL starts again")
        return Unfenced(lifted=removed).as_json()

    async def pause_replication(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /replication/pause``: stop the WAL receiver and keep it stopped (no ``primary_conninfo``), then
        answer what this replica has received and replayed. Idempotent; 409 on a primary."""
        core = self.core
        async with core.lock:
            core.refuse_if_fenced("pause replication")
            conn = await core.action_connection()
            async with conn:
                row = await fetch_one(
                    conn,
                    "SELECT pg_is_in_recovery() AS r, (SELECT received_tli FROM pg_stat_wal_receiver) AS tli",
                )
                if not row["r"] or not core.is_replica:
                    raise ActionError(409, "this instance is a primary: there is no replication to pause")
                if read_pause(core.pause_path) is None:
                    write_pause(core.pause_path, datetime.now(UTC), row["tli"])
                    log.warning("replication paused: the WAL receiver stops and stays stopped")
                core.paused = True
                if await self.sync.write_files():
                    await conn.execute("SELECT pg_reload_conf()")
                await self._wait_receiver_stopped(conn)
                state = await fetch_one(conn, _PAUSED_AT)
        record = read_pause(core.pause_path)
        timelines = [t for t in (state["checkpoint_tli"], record.timeline if record else None) if t is not None]
        timeline = max(timelines) if timelines else None
        return Paused(receive_lsn=state["receive"], replay_lsn=state["replay"], timeline=timeline).as_json()

    @staticmethod
    async def _wait_receiver_stopped(conn: psycopg.AsyncConnection[DictRow]) -> None:
        try:
            async with asyncio.timeout(PAUSE_WAIT):
                while True:  # the startup process stops the receiver once it has read the new conf
                    if not (await fetch_one(conn, "SELECT count(*) AS n FROM pg_stat_wal_receiver"))["n"]:
                        break
                    await asyncio.sleep(0.05)
        except TimeoutError:
            raise ActionError(504, f"the WAL receiver did not stop within {PAUSE_WAIT:.0f} s") from None

    async def resume_replication(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /replication/resume``: lift the pause, render ``primary_conninfo`` again, reload. Idempotent, and
        a no-op on a primary."""
        core = self.core
        async with core.lock:
            removed = clear_pause(core.pause_path)
            was = core.paused
            core.paused = False
            if removed or was:
                core.resumed_at = time.monotonic()  # the upstream watch hurries the receiver's first connections
            changed = await self.sync.write_files() if core.data_ready else False
            if changed and core.pg.running:
                conn = await core.action_connection()
                async with conn:
                    await conn.execute("SELECT pg_reload_conf()")
        if removed or was:
            log.info("replication resumed")
        return Resumed(resumed=removed or was).as_json()

    async def demote(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /demote``: a primary becomes a replica for a planned switchover (see :mod:`kanri.instance.demote`).
        Shielded like ``/fence``: once the shutdown has begun it completes, whatever the caller does."""
        return await asyncio.shield(self._demote())

    async def _demote(self) -> dict[str, Any]:
        core = self.core
        async with core.lock:
            core.refuse_if_fenced("demote")
            if core.is_replica:
                raise ActionError(409, "this instance is a replica already")
            conn = await core.action_connection()
            async with conn:
                if (await fetch_one(conn, "SELECT pg_is_in_recovery() AS r"))["r"]:
                    raise ActionError(409, "this instance is a replica already")
                log.warning("demoting: checkpoint, fast shutdown, start as a replica")
                await conn.execute("CHECKPOINT")  # the shutdown checkpoint then has little left to write
            await core.pg.stop()  # fast: the WAL senders send everything up to the shutdown checkpoint first
            control = await read_controldata(core.settings.binary("pg_controldata"), core.settings.pgdata)
            if control.state != "shut down":
                # an immediate stop after the timeout: its last checkpoint is not the end of WAL; stay the primary
                await self.lifecycle.start()
                raise ActionError(500, f"the primary did not shut down cleanly ({control.state}); still the primary")
            (core.settings.pgdata / "standby.signal").touch(mode=0o600)
            # the replica's files: it streams from KANRI_PRIMARY_HOST once that has a new primary
            await self.lifecycle.start()
        log.warning("demoted", checkpoint_lsn=control.checkpoint_lsn, timeline=control.timeline)
        return Demoted(checkpoint_lsn=control.checkpoint_lsn, timeline=control.timeline).as_json()
