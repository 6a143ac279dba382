"""The HTTP side of base backups (:mod:`kanri.instance.base_backup`): ``POST /backups``, ``GET /backups/{id}``,
``POST /backups/expire`` and ``POST /wal/switch``."""

from __future__ import annotations

from typing import Any

import psycopg
import structlog
from pydantic import ValidationError

from kanri.contract.actions import BackupRequest
from kanri.contract.backup import WalSwitched
from kanri.instance.archive import ArchiveTarget
from kanri.instance.base_backup import BackupError, BaseBackups, state_dir
from kanri.instance.core import Core
from kanri.instance.db import connect, fetch_one
from kanri.instance.http_api import Accepted, ActionError
from kanri.instance.problems import one_line

log = structlog.get_logger("kanri.instance")


class BackupActions:
    """Base backups of this instance, asked by the operator; the records live on the volume."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.backups = BaseBackups(core.settings, state_dir(core.settings.pgdata))

    async def close(self) -> None:
        """Stop a backup still running (at shutdown)."""
        await self.backups.close()

    async def start_backup(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /backups {"id"}``: start a base backup of this instance (primary or standby) in the background
        (202), or answer the known id's record (200)."""
        core = self.core
        try:
            backup = BackupRequest.model_validate(body).id
        except ValidationError:
            raise ActionError(400, "the body needs an id (the backup's idempotency key)") from None
        try:
            known = self.backups.read(backup)
            if known is not None:
                return known.as_json()
            if core.shutting_down:
                raise ActionError(503, "shutting down")
            if not core.pg.running or core.fenced is not None:
                raise ActionError(503, "postgres is not running; no backup can be taken here now")
            record, _ = self.backups.start(backup, core.config.archive, standby=core.is_replica)
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

    def _target(self, server: object) -> ArchiveTarget | None:
        """The archive target of this system, or of the earlier system of this cluster ``server`` names."""
        target = self.core.config.archive
        if target is not None and server is not None and server != target.server_name:
            try:  # only a system of this same cluster, never another cluster's folder
                target = target.system(str(server))
            except ValueError:
                raise ActionError(
                    400, "serverName must name a system of this cluster (<cluster>[.pg<major>])"
                ) from None
        return target

    async def expire_backups(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /backups/expire {"ids", "serverName"?}``: delete these barman backup ids (and the WAL only they
        needed) — of this system, or of the earlier one ``serverName`` names (a major upgrade's predecessor, which
        archived under another server name in the same repository)."""
        ids = body.get("ids")
        target = self._target(body.get("serverName"))
        try:
            return await self.backups.expire(ids if isinstance(ids, list) else [], target)
        except BackupError as exc:
            raise ActionError(exc.status, exc.reason) from None

    async def backup_catalogue(self, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /backups/catalogue {"serverName"?}``: every backup in the repository of this system, or of the
        earlier one of this cluster ``serverName`` names, as Barman Cloud's catalogue lists it."""
        target = self._target(body.get("serverName"))
        try:
            return await self.backups.catalogue(target)
        except BackupError as exc:
            raise ActionError(exc.status, exc.reason) from None

    async def switch_wal(self, _: dict[str, Any]) -> dict[str, Any]:
        """``POST /wal/switch``: close the current WAL segment (``pg_switch_wal()``) so that it is archived now.

        The operator asks it after a base backup: the backup's last segment is otherwise archived only once it
        fills or ``archive_timeout`` passes, and until then the backup cannot be restored (its end WAL is missing).
        A primary only: a standby has no WAL of its own to close."""
        core = self.core
        if core.config.archive is None:
            raise ActionError(409, "this cluster archives no WAL")
        if not core.pg.running or core.is_replica:
            raise ActionError(409, "not a running primary: only the primary can switch WAL")
        try:
            conn = await connect(core.settings, timeout=3, statement_timeout_ms=10_000)
        except psycopg.OperationalError as exc:
            raise ActionError(503, f"postgres does not answer: {one_line(str(exc))[:200]}") from None
        async with conn:
            row = await fetch_one(conn, "SELECT pg_walfile_name(pg_switch_wal()) AS segment")
        log.info("switched WAL", segment=row["segment"])
        return WalSwitched(segment=row["segment"]).as_json()
