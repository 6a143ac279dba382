"""The fence: a marker on the data volume that keeps this instance's PostgreSQL stopped.

The operator fences an instance that must not take writes (a second primary: split brain). The marker is a small
JSON file on the volume *next to* PGDATA, not in it: pg_basebackup copies only PGDATA, so a clone never inherits a
fence, and a new volume (the documented way to rejoin) has none. It outlives the pod and the manager: a restarted
manager reads it before it starts PostgreSQL. A marker that exists but cannot be read still fences — the safe side.
``POST /unfence`` removes it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

__all__ = [
    "FENCED_STOP_TIMEOUT",
    "MARKER",
    "FenceRecord",
    "lift",
    "marker_path",
    "read_fence",
    "remove_marker",
    "write_fence",
    "write_marker",
]

MARKER = "kanri-fenced"

FENCED_STOP_TIMEOUT = 10.0
"""Seconds a fenced (or rejoining) PostgreSQL gets for a fast shutdown before an immediate one. A fast shutdown waits
until every standby confirmed the shutdown checkpoint, so a standby that no longer answers — across the partition
that made this primary fence itself, or on a stopped node — holds it for ``wal_sender_timeout`` (60 s by default):
measured, an isolated primary's rejoin waited 66 s for it. A fenced instance's data is rewound or kept as it is; an
immediate shutdown loses nothing committed (crash recovery replays it at the next start, and pg_rewind runs that
recovery itself)."""


@dataclass(frozen=True)
class FenceRecord:
    """Why and since when the instance is fenced."""

    since: str
    """ISO 8601 time the fence was set ("" when the marker could not be read)."""
    reason: str


def marker_path(pgdata: Path) -> Path:
    """The marker's place: on the volume, beside the data directory."""
    return pgdata.parent / MARKER


def read_fence(path: Path) -> FenceRecord | None:
    """The fence in force, or None when there is no marker."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return FenceRecord("", f"the fence marker {path.name} exists but cannot be read ({exc.strerror})")
    try:
        body = json.loads(raw)
        return FenceRecord(str(body["since"]), str(body["reason"]))
    except (ValueError, KeyError, TypeError):
        return FenceRecord("", f"the fence marker {path.name} exists but is not a fence record")


def write_fence(path: Path, reason: str, now: datetime) -> FenceRecord:
    """Write the marker durably: once this returns, a crash or a restarted pod still finds the instance fenced."""
    record = FenceRecord(now.isoformat(timespec="seconds"), reason)
    write_marker(path, {"since": record.since, "reason": record.reason})
    return record


def write_marker(path: Path, body: dict[str, object]) -> None:
    """A small JSON marker beside PGDATA, durably (temporary file, fsync, rename, fsync of the directory)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as handle:
        json.dump(body, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    _sync_directory(path.parent)


def lift(path: Path) -> bool:
    """Remove the marker; True when there was one."""
    return remove_marker(path)


def remove_marker(path: Path) -> bool:
    """Remove a marker durably; True when there was one."""
    try:
        path.unlink()
    except FileNotFoundError:
        return False
    _sync_directory(path.parent)
    return True


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
