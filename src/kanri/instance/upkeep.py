"""The upkeep loop on a primary: the roles after a start or a Secret change, then the replication slots; after a
major upgrade, the statistics and extension updates (:mod:`kanri.instance.post_upgrade`) in the background.

Its own task and its own connection: a statement stuck here (a lock held by a client, a synchronous-commit wait)
ends at the statement timeout and never delays the config loop.
"""

from __future__ import annotations

import asyncio

import psycopg
from psycopg.rows import DictRow

from kanri.instance import post_upgrade
from kanri.instance.core import Core
from kanri.instance.db import fetch_one
from kanri.instance.roles import ensure_roles
from kanri.instance.slots import reconcile_slots


class Upkeep:
    """Roles and slots (and, once, the post-upgrade work) on a running primary."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self._post_upgrade: asyncio.Task[dict[str, object]] | None = None

    async def run(self) -> None:
        """The upkeep loop (forever)."""
        await self.core.repeat("upkeep", self.upkeep)

    async def upkeep(self) -> None:
        """One pass on a primary: roles after a start or a Secret change, then slots."""
        core = self.core
        if not core.pg.running or core.synced is not core.pg.process:
            return  # the config loop reaches a new postmaster first (files in place, reload done)
        try:
            conn = await core.connect_own(timeout=2)
        except psycopg.OperationalError:
            return
        async with conn, core.upkeep_lock:
            if (await fetch_one(conn, "SELECT pg_is_in_recovery() AS r"))["r"]:
                # a demoted primary keeps its slots; on a standby they would only hold WAL back: drop kanri's
                await reconcile_slots(conn, cluster=core.settings.cluster, name=core.settings.name, instances=())
                return
            if not core.roles_ok:
                await self.ensure_roles(conn)
            await self.reconcile_slots(conn)
        if self._post_upgrade is None and post_upgrade.pending(core.settings):
            # statistics and extension updates after a major upgrade: in the background, the cluster serves meanwhile
            self._post_upgrade = asyncio.create_task(post_upgrade.run(core.settings, core.binary_version))

    async def ensure_roles(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        """The roles with the Secrets' passwords (the caller holds :attr:`Core.upkeep_lock`)."""
        core = self.core
        secrets = core.secrets
        await ensure_roles(
            conn,
            core.settings,
            superuser=secrets["superuser"].credentials,
            replication=secrets["replication"].credentials,
            app=secrets["app"].credentials,
        )
        core.roles_ok = True

    async def reconcile_slots(self, conn: psycopg.AsyncConnection[DictRow]) -> None:
        """A slot for every other instance of the config, none for anyone else (the caller holds the upkeep lock)."""
        core = self.core
        await reconcile_slots(conn, cluster=core.settings.cluster, name=core.settings.name,
                              instances=core.config.instances)  # fmt: skip
