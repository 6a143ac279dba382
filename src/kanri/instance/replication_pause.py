"""The replication pause: a replica's WAL receiver stopped on purpose, for the operator's failover.

Before it chooses a replica to promote, the operator freezes what every replica has received, so the positions it
compares cannot move while it decides (and a replica cannot go on streaming from an old primary that comes back).
A paused replica's ``postgresql.conf`` has no ``primary_conninfo``, so PostgreSQL runs no WAL receiver at all; the
manager remembers the pause in memory and in a small marker beside PGDATA (like the fence, :mod:`kanri.instance.fence`),
so a restarted manager, or a restarted PostgreSQL, stays paused. ``POST /replication/resume`` and ``POST /promote``
end it. The marker is outside PGDATA, so a clone never inherits it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from kanri.instance.fence import remove_marker, write_marker

__all__ = ["MARKER", "PauseRecord", "clear_pause", "marker_path", "read_pause", "write_pause"]

MARKER = "kanri-replication-paused"


@dataclass(frozen=True)
class PauseRecord:
    """Since when replication is paused, and the timeline the WAL receiver was on when it stopped (None: unknown)."""

    since: str
    timeline: int | None


def marker_path(pgdata: Path) -> Path:
    """The marker's place: on the volume, beside the data directory."""
    return pgdata.parent / MARKER


def read_pause(path: Path) -> PauseRecord | None:
    """The pause in force, or None. A marker that exists but cannot be parsed still pauses (timeline unknown): the
    safe side while a failover is being decided."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError:
        return PauseRecord("", None)
    try:
        body = json.loads(raw)
        timeline = body.get("timeline")
        return PauseRecord(str(body["since"]), timeline if isinstance(timeline, int) else None)
    except (ValueError, KeyError, TypeError, AttributeError):
        return PauseRecord("", None)


def write_pause(path: Path, now: datetime, timeline: int | None) -> PauseRecord:
    """Write the marker durably (as the fence's: :func:`kanri.instance.fence.write_marker`)."""
    record = PauseRecord(now.isoformat(timespec="seconds"), timeline)
    write_marker(path, {"since": record.since, "timeline": record.timeline})
    return record


def clear_pause(path: Path) -> bool:
    """Remove the marker; True when there was one."""
    return remove_marker(path)
