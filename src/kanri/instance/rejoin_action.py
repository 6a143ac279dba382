"""``POST /rejoin``: a former primary follows the new one (``KANRI_PRIMARY_HOST``), in the background.

pg_rewind first, a fresh clone when rewinding is impossible (:mod:`kanri.instance.rejoin`); the progress is
``/status``'s ``rejoin``. The instance is fenced while it rejoins, so the supervisor never takes the stop for a crash,
and the fence is lifted once the data directory, now a replica's, has passed the start checks and started.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from datetime import UTC, datetime
from typing import Any

import structlog

from kanri.contract.actions import RejoinAccepted
from kanri.contract.status import Rejoin
from kanri.instance.bootstrap import clone
from kanri.instance.core import Core
from kanri.instance.fence import FENCED_STOP_TIMEOUT, lift, write_fence
from kanri.instance.http_api import Accepted, ActionError
from kanri.instance.lifecycle import Lifecycle
from kanri.instance.problems import one_line
from kanri.instance.rejoin import RejoinStatus, move_aside, rewind, source_label
from kanri.instance.replication_pause import clear_pause

log = structlog.get_logger("kanri.instance")


class RejoinAction:
    """The one rejoin that may run at a time, and its progress."""

    def __init__(self, core: Core, lifecycle: Lifecycle) -> None:
        self.core = core
        self.lifecycle = lifecycle
        self.task: asyncio.Task[None] | None = None
        self._status: RejoinStatus | None = None

    def progress(self) -> Rejoin | None:
        """``/status``'s ``rejoin`` (None: never asked)."""
        return self._status.report() if self._status is not None else None

    async def rejoin(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /rejoin``: follow the primary at ``KANRI_PRIMARY_HOST`` (pg_rewind, else a clone), in the
        background; 202. The progress is ``/status``'s ``rejoin``."""
        core = self.core
        if self.task is not None and not self.task.done():
            return Accepted(RejoinAccepted(rejoin="running").as_json())
        if core.shutting_down:
            raise ActionError(503, "shutting down")
        if not core.data_ready:
            raise ActionError(409, "refusing to rejoin: the data directory is not ready yet (bootstrapping)")
        if core.fenced is None and core.pg.running and not core.is_replica:
            raise ActionError(409, "refusing to rejoin: this instance is a running primary; fence it first")
        self._status = RejoinStatus("running", "rewind", f"stopping PostgreSQL to rejoin {source_label(core.settings)}")
        self.task = asyncio.create_task(self._run(self._status), name="rejoin")
        return Accepted(RejoinAccepted(rejoin="started").as_json())

    async def _run(self, status: RejoinStatus) -> None:
        try:
            async with self.core.lock:
                await self._rewind_or_clone(status)
            await self.core.pg.wait_accepting(timeout=600)
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

    async def _rewind_or_clone(self, status: RejoinStatus) -> None:
        """Under the lock: fenced, stopped, rewound (or cloned), started as a replica, the fence lifted."""
        core, settings = self.core, self.core.settings
        if core.fenced is None:  # the supervisor must not take the stop below for a crash
            write_fence(core.fence_path, f"rejoining {source_label(settings)}", datetime.now(UTC))
            core.check_fence()
        await core.pg.stop(timeout=FENCED_STOP_TIMEOUT)  # its data is rewound next: a clean shutdown is not needed
        status.message = f"pg_rewind from {source_label(settings)}"
        result = await rewind(settings, core.usable["superuser"])
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
        (settings.pgdata / "standby.signal").touch(mode=0o600)
        clear_pause(core.pause_path)
        core.paused = False
        core.check_startable()
        await self.lifecycle.start()
        lift(core.fence_path)  # the supervisor adopts the replica just started
        core.check_fence()

    async def _clone_over(self, status: RejoinStatus) -> None:
        """Replace PGDATA by a clone of the primary; the old copy is removed once the clone is in place."""
        aside = move_aside(self.core.settings)

        def note(message: str) -> None:
            status.message = one_line(f"cloning: {message}")[:300]

        await clone(self.core.settings, self.core.replication_credentials, on_error=note)
        await asyncio.to_thread(shutil.rmtree, aside, True)
