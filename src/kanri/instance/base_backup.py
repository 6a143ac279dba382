"""Base backups taken by the instance manager with Barman Cloud's ``barman-cloud-backup``, and their deletion.

The operator asks ``POST /backups {"id": ...}``; the id is its idempotency key (a PostgresBackup's uid): the same id
never starts a second backup, whatever the number of retries. At most one backup runs at a time; it runs in the
background and ``GET /backups/{id}`` answers its state. Each id's state is a small JSON file on the data volume, beside
PGDATA (``kanri-backups/<id>.json``; not inside PGDATA, which the backup copies), written before the backup starts,
so a restarted manager still answers for a finished id — and reports one it was running when it died as Failed.

The backup connects over the local socket as the manager's superuser (barman uses the concurrent backup API, so it
works on a standby too), is named after the id (``--name``), compressed with snappy or lz4 when barman's venv has the
library (else gzip), and goes to barman's default layout ``<destination>/<cluster>/base/<backup id>/``. The key pair
reaches barman in its environment only (:func:`kanri.instance.archive.credentials_env`); error messages keep only
barman's last lines, from which anything looking like a key is never taken (barman does not print keys).

``POST /backups/expire {"ids": [...]}`` deletes barman backup ids with ``barman-cloud-backup-delete --backup-id``,
which also removes the WAL no remaining backup needs (WAL older than the oldest backup kept). ``POST
/backups/catalogue`` lists every backup of the system in the repository (``barman-cloud-backup-list --format json``),
those no operator recorded too (made by hand, or whose PostgresBackup was deleted), so retention can count them.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import structlog

from kanri.contract.backup import BackupRecord, Catalogue, CatalogueEntry, Expired
from kanri.instance.archive import (
    DEFAULT_CREDENTIALS_DIR,
    ArchiveTarget,
    barman_program,
    cloud_options,
    credentials_env,
)
from kanri.instance.config import SUPERUSER, Settings
from kanri.instance.fence import write_marker

__all__ = [
    "ID_PATTERN",
    "BackupError",
    "BackupRecord",
    "BaseBackups",
    "backup_argv",
    "catalogue_entries",
    "compression_flag",
    "delete_argv",
    "list_argv",
    "show_argv",
    "state_dir",
]

log = structlog.get_logger("kanri.instance.backup")

ID_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
"""An idempotency key: a Kubernetes uid or a name (no path separators, no dots: it names a file)."""
BARMAN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}$")
"""Barman's own backup ids: the start time, ``YYYYMMDDThhmmss``."""
MAX_ERROR = 300
BACKUP_TIMEOUT = 6 * 3600.0
"""A backup that runs longer than this is stopped and reported Failed (a hung object store)."""
DELETE_TIMEOUT = 300.0
LIST_TIMEOUT = 120.0
"""``barman-cloud-backup-list`` reads each backup's ``backup.info``: a few seconds for hundreds of backups."""


class BackupError(Exception):
    """A request the instance refuses; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def state_dir(pgdata: Path) -> Path:
    """Where the records live: on the data volume, beside PGDATA (never copied into a backup or a clone)."""
    return pgdata.parent / "kanri-backups"


def compression_flag(env: Mapping[str, str] | None = None) -> str:
    """``--snappy`` or ``--lz4`` when the Python beside barman's programs can import the library, else ``--gzip``
    (built into Python). Base backups offer no zstd."""
    program = Path(barman_program("barman-cloud-backup", env))
    python = program.parent / "python"
    if program.parent != Path() and python.exists():
        for module, flag in (("snappy", "--snappy"), ("lz4.frame", "--lz4")):
            done = subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, check=False)
            if done.returncode == 0:
                return flag
    return "--gzip"


def backup_argv(
    target: ArchiveTarget, settings: Settings, name: str, compression: str, env: Mapping[str, str] | None = None
) -> list[str]:
    """``barman-cloud-backup`` of this instance over its local socket, named ``name``."""
    return [
        barman_program("barman-cloud-backup", env),
        *cloud_options(target),
        compression,
        "--immediate-checkpoint",
        "--host",
        str(settings.socket_dir),
        "--port",
        str(settings.pg_port),
        "--user",
        SUPERUSER,
        "--name",
        name,
        target.destination,
        target.server_name,
    ]


def show_argv(target: ArchiveTarget, backup: str, env: Mapping[str, str] | None = None) -> list[str]:
    """``barman-cloud-backup-show`` of one backup (by id or name) as JSON."""
    return [
        barman_program("barman-cloud-backup-show", env),
        *cloud_options(target),
        "--format",
        "json",
        target.destination,
        target.server_name,
        backup,
    ]


def list_argv(target: ArchiveTarget, env: Mapping[str, str] | None = None) -> list[str]:
    """``barman-cloud-backup-list`` of the system's backups as JSON (barman's catalogue, read from the store)."""
    return [
        barman_program("barman-cloud-backup-list", env),
        *cloud_options(target),
        "--format",
        "json",
        target.destination,
        target.server_name,
    ]


def catalogue_entries(output: str) -> list[CatalogueEntry]:
    """The entries of ``barman-cloud-backup-list --format json``'s output; ValueError when it is not that."""
    try:
        listed = json.loads(output)["backups_list"]
    except (ValueError, KeyError, TypeError):
        raise ValueError("barman-cloud-backup-list did not print its JSON catalogue") from None
    if not isinstance(listed, list):
        raise ValueError("barman-cloud-backup-list did not print a list of backups")
    entries: list[CatalogueEntry] = []
    for item in listed:
        if not isinstance(item, dict) or not isinstance(item.get("backup_id"), str):
            continue
        entries.append(CatalogueEntry(backup_id=item["backup_id"], status=_text(item.get("status")),
                                      end_time=_iso(item.get("end_time_iso") or item.get("end_time")),
                                      name=_text(item.get("backup_name"))))  # fmt: skip
    return entries


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def delete_argv(target: ArchiveTarget, backup_id: str, env: Mapping[str, str] | None = None) -> list[str]:
    """``barman-cloud-backup-delete`` of one backup id (and the WAL only it needed)."""
    return [
        barman_program("barman-cloud-backup-delete", env),
        *cloud_options(target),
        "--backup-id",
        backup_id,
        target.destination,
        target.server_name,
    ]


def _short(output: str) -> str:
    """The last meaningful lines of barman's output, on one line: the error message a user can act on."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    text = " | ".join(lines[-3:]) if lines else "no output"
    return text[-MAX_ERROR:]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _iso(value: Any) -> str | None:
    """Barman's times (``2026-12-02 07:40:01.123456+00:00`` or ISO) as ISO 8601, or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.astimezone(UTC).isoformat(timespec="seconds")


def apply_show(record: BackupRecord, shown: Mapping[str, Any]) -> None:
    """Fill ``record`` from ``barman-cloud-backup-show --format json``'s backup (its fields are barman's)."""
    backup_id = shown.get("backup_id")
    record.backup_id = backup_id if isinstance(backup_id, str) else record.backup_id
    record.begin_time = _iso(shown.get("begin_time_iso")) or _iso(shown.get("begin_time"))
    record.end_time = _iso(shown.get("end_time_iso")) or _iso(shown.get("end_time"))
    for attr, key in (("begin_wal", "begin_wal"), ("end_wal", "end_wal"), ("begin_lsn", "begin_xlog"),
                      ("end_lsn", "end_xlog")):  # fmt: skip
        value = shown.get(key)
        setattr(record, attr, value if isinstance(value, str) else None)
    for attr, key in (("size_bytes", "size"), ("timeline", "timeline")):
        value = shown.get(key)
        setattr(record, attr, value if isinstance(value, int) and not isinstance(value, bool) else None)
    if record.size_bytes is None and isinstance(shown.get("cluster_size"), int):
        record.size_bytes = shown["cluster_size"]  # what Barman Cloud records: the size of the data backed up


def find_shown(body: Any) -> Mapping[str, Any] | None:
    """The backup's fields in barman's JSON (keyed by the server name, or the backup itself)."""
    if not isinstance(body, dict):
        return None
    if "backup_id" in body:
        return body
    for value in body.values():
        if isinstance(value, dict) and "backup_id" in value:
            return value
    return None


@dataclass
class BaseBackups:
    """The instance's backups: at most one running, records under ``directory``. ``target`` and ``standby`` are
    read when a backup starts (the manager's current cluster config and role)."""

    settings: Settings
    directory: Path
    env: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    _task: asyncio.Task[None] | None = None
    _running: str | None = None

    def _path(self, backup: str) -> Path:
        return self.directory / f"{backup}.json"

    def _write(self, record: BackupRecord) -> None:
        self.directory.mkdir(mode=0o700, exist_ok=True)
        write_marker(self._path(record.id), record.as_json())

    def read(self, backup: str) -> BackupRecord | None:
        """The record of ``backup``; a Running record with no backup running here is one a previous manager was
        running when it stopped: Failed (barman's partial upload is marked FAILED by barman itself, or left
        incomplete — never listed as a usable backup)."""
        if not ID_PATTERN.fullmatch(backup):
            raise BackupError(400, "a backup id is 1-63 lower case letters, digits and '-'")
        try:
            record = BackupRecord.model_validate(json.loads(self._path(backup).read_bytes()))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError) as exc:
            return BackupRecord(id=backup, phase="Failed", started_at="",
                                error=f"the backup's record cannot be read: {exc}")  # fmt: skip
        if record.phase == "Running" and self._running != backup:
            record.phase, record.completed_at = "Failed", _now()
            record.error = "the instance manager stopped while the backup ran"
            self._write(record)
        return record

    def start(self, backup: str, target: ArchiveTarget | None, standby: bool) -> tuple[BackupRecord, bool]:
        """Start ``backup`` in the background; (its record, whether it was started now). A known id answers its
        record and starts nothing; another backup running → 409."""
        known = self.read(backup)
        if known is not None:
            return known, False
        if self._running is not None:
            raise BackupError(409, f"backup {self._running} is running on this instance; one at a time")
        if target is None:
            raise BackupError(409, "no backup repository is configured for this cluster")
        record = BackupRecord(id=backup, phase="Running", started_at=_now(), from_standby=standby)
        self._write(record)  # before barman starts: a retry after a crash finds the id
        self._running = backup
        self._task = asyncio.create_task(self._run(record, target), name=f"backup-{backup}")
        log.info("base backup started", id=backup, standby=standby, destination=target.destination)
        return record, True

    def _secrets(self, target: ArchiveTarget) -> dict[str, str]:
        directory = Path(self.env.get("KANRI_BACKUP_CREDENTIALS_DIR") or DEFAULT_CREDENTIALS_DIR)
        try:
            return credentials_env(directory, target.region)
        except OSError as exc:
            raise BackupError(409, f"repository credentials unreadable: {exc.strerror} ({directory})") from None

    async def _barman(self, argv: list[str], target: ArchiveTarget, timeout: float) -> tuple[int, str]:
        env = {**self.env, **self._secrets(target)}
        process = await asyncio.create_subprocess_exec(
            *argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        try:
            async with asyncio.timeout(timeout):
                output, _ = await process.communicate()
        except (TimeoutError, asyncio.CancelledError):
            process.kill()
            await process.wait()
            raise
        return process.returncode or 0, output.decode(errors="replace")

    async def _run(self, record: BackupRecord, target: ArchiveTarget) -> None:
        try:
            compression = await asyncio.to_thread(compression_flag, self.env)
            code, output = await self._barman(
                backup_argv(target, self.settings, record.id, compression, self.env), target, BACKUP_TIMEOUT
            )
            if code != 0:
                record.phase, record.error = "Failed", f"barman-cloud-backup exited {code}: {_short(output)}"
            else:
                code, output = await self._barman(show_argv(target, record.id, self.env), target, 120)
                shown = find_shown(json.loads(output)) if code == 0 else None
                if shown is None:
                    record.phase = "Failed"
                    record.error = f"the backup finished but barman-cloud-backup-show failed: {_short(output)}"
                else:
                    apply_show(record, shown)
                    status = shown.get("status")
                    record.phase = "Completed" if status == "DONE" else "Failed"
                    if status != "DONE":
                        record.error = f"barman reports the backup {status}"
        except BackupError as exc:
            record.phase, record.error = "Failed", exc.reason
        except TimeoutError:
            record.phase, record.error = "Failed", f"the backup did not finish within {BACKUP_TIMEOUT:.0f} s"
        except asyncio.CancelledError:
            record.phase, record.error = "Failed", "the instance manager stopped while the backup ran"
            record.completed_at = _now()
            self._write(record)
            raise
        except (OSError, ValueError) as exc:
            record.phase, record.error = "Failed", f"cannot run Barman Cloud: {exc}"[:MAX_ERROR]
        finally:
            self._running = None
        record.completed_at = _now()
        self._write(record)
        log.info("base backup finished", id=record.id, phase=record.phase, backup_id=record.backup_id,
                 error=record.error)  # fmt: skip

    async def expire(self, ids: list[str], target: ArchiveTarget | None) -> dict[str, Any]:
        """Delete barman backup ids (one after the other; an id already gone counts as deleted). The answer names
        those deleted and those that failed (with barman's message)."""
        if target is None:
            raise BackupError(409, "no backup repository is configured for this cluster")
        if not ids or not all(isinstance(i, str) and BARMAN_ID.fullmatch(i) for i in ids):
            raise BackupError(400, "ids must be a non-empty list of barman backup ids (YYYYMMDDThhmmss)")
        deleted: list[str] = []
        failed: dict[str, str] = {}
        for backup_id in ids:
            code, output = await self._barman(delete_argv(target, backup_id, self.env), target, DELETE_TIMEOUT)
            if code == 0 or "not found" in output.lower() or "does not exist" in output.lower():
                deleted.append(backup_id)
            else:
                failed[backup_id] = _short(output)
        log.info("base backups expired", deleted=deleted, failed=sorted(failed))
        return Expired(deleted=deleted, failed=failed).as_json()

    async def catalogue(self, target: ArchiveTarget | None) -> dict[str, Any]:
        """Every backup of ``target``'s system in the repository, as barman's catalogue lists it."""
        if target is None:
            raise BackupError(409, "no backup repository is configured for this cluster")
        env = {**self.env, **self._secrets(target)}
        process = await asyncio.create_subprocess_exec(*list_argv(target, self.env), env=env,
                                                       stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                                       stderr=subprocess.PIPE)  # fmt: skip
        try:
            async with asyncio.timeout(LIST_TIMEOUT):
                output, errors = await process.communicate()
        except (TimeoutError, asyncio.CancelledError):
            process.kill()
            await process.wait()
            raise
        if process.returncode:
            raise BackupError(502, f"barman-cloud-backup-list failed: {_short(errors.decode(errors='replace'))}")
        try:
            entries = catalogue_entries(output.decode(errors="replace"))
        except ValueError as exc:
            raise BackupError(502, str(exc)) from None
        return Catalogue(backups=entries).as_json()

    async def close(self) -> None:
        """Stop a running backup (the manager is shutting down); its record says Failed."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
