"""The archive's gap at a failover: the old timeline's last segments, which only the promoted standby still has.

A standby with ``archive_mode = on`` archives nothing: its WAL receiver marks every segment it receives ``.done`` in
``pg_wal/archive_status``, and after a promotion PostgreSQL archives only what the new primary writes itself (and the
old timeline's last, partial segment as ``.partial``). When the old primary died before archiving its last full
segments — a node lost, a volume gone — those segments are in no archive: a restore replays the old timeline up to
the hole and stops there, silently short of commits that were acknowledged and replicated (found by the failover
e2e: a row written before the primary's node was powered off was missing from the restore).

After a promotion the instance manager calls :func:`mark_old_timeline_ready`: every old-timeline segment and history
file still in ``pg_wal`` that is marked ``.done`` is marked ``.ready`` again, so PostgreSQL's archiver ships it
(oldest first). A segment the old primary did archive is uploaded again with the same content, which barman
overwrites: a few seconds of uploads after a failover buy an archive with no hole. (``archive_mode = always`` would
close the hole too, at the price of every standby uploading every segment all the time.)
"""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["mark_old_timeline_ready"]

_SEGMENT = re.compile(r"^(?P<timeline>[0-9A-F]{8})[0-9A-F]{16}$")
_HISTORY = re.compile(r"^(?P<timeline>[0-9A-F]{8})\.history$")


def _timeline(name: str) -> int | None:
    found = _SEGMENT.match(name) or _HISTORY.match(name)
    return int(found["timeline"], 16) if found else None


def mark_old_timeline_ready(pgdata: Path, timeline: int) -> list[str]:
    """Mark ``.ready`` every WAL file of a timeline below ``timeline`` (the new one) that is in ``pg_wal`` and marked
    ``.done``; the names marked, oldest first. A file whose mark changed meanwhile is left as it is."""
    wal = pgdata / "pg_wal"
    status = wal / "archive_status"
    marked: list[str] = []
    try:
        done = sorted(path for path in status.iterdir() if path.name.endswith(".done"))
    except FileNotFoundError:
        return marked
    for path in done:
        name = path.name.removesuffix(".done")
        old = _timeline(name)
        if old is None or old >= timeline or not (wal / name).exists():
            continue
        try:
            path.rename(status / f"{name}.ready")
        except FileNotFoundError:
            continue  # removed or re-marked by PostgreSQL meanwhile
        marked.append(name)
    return marked
