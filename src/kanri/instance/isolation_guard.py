"""The isolation loop (:mod:`kanri.instance.isolation`): a running primary that has heard from neither the API
server nor a standby for the window, or whose manager was frozen, fences itself."""

from __future__ import annotations

import asyncio
import contextlib
import time
from datetime import UTC, datetime

import structlog

from kanri.instance.actions import Actions
from kanri.instance.core import Core
from kanri.instance.http_api import ActionError
from kanri.instance.isolation import INTERVAL, Probe, run_queue_wait

log = structlog.get_logger("kanri.instance")


class IsolationGuard:
    """Checks contact every :data:`~kanri.instance.isolation.INTERVAL` while the instance is a running primary."""

    def __init__(self, core: Core, actions: Actions) -> None:
        self.core = core
        self.actions = actions

    async def run(self) -> None:
        """The loop (forever; returns at once when the isolation check is off)."""
        isolation = self.core.isolation
        if not isolation.enabled:
            return
        log.info("isolation check on", apiserver=f"{isolation.host}:{isolation.port}",
                 window=isolation.window)  # fmt: skip
        probe = Probe(self.core.settings, isolation)
        try:
            while True:
                await self._check(probe)
                await asyncio.sleep(INTERVAL)
        finally:
            await probe.close()

    async def _check(self, probe: Probe) -> None:
        # run_queue_wait(): time spent waiting for a CPU is starvation, not a freeze nor isolation (issue 33)
        core, watch = self.core, self.core.watch
        if not core.running_primary():
            watch.idle(time.monotonic(), run_queue_wait())
            await probe.close()
            return
        if (gap := watch.frozen(time.monotonic(), run_queue_wait())) is not None:
            await self._self_fence(f"isolated: the manager did not run for {gap:.1f} s (frozen); not checking")
            return
        via = await probe.check()
        if (gap := watch.frozen(time.monotonic(), run_queue_wait())) is not None:  # frozen while it was checking
            await self._self_fence(f"isolated: the manager did not run for {gap:.1f} s (frozen); not checking")
            return
        silent = watch.observe(time.monotonic(), via, datetime.now(UTC), run_queue_wait())
        if silent is not None and core.running_primary():
            await self._self_fence(f"isolated: neither the API server nor a standby answered for {silent:.1f} s")

    async def _self_fence(self, reason: str) -> None:
        log.error("self-fencing", reason=reason)
        with contextlib.suppress(ActionError):  # shutting down: PostgreSQL stops anyway
            await asyncio.shield(self.actions.fence_now(reason))
