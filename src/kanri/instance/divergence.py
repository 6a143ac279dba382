"""How much WAL a former primary wrote after the cluster's timeline left it: measured when it rejoins.

A failover's ``lsnGapBytes`` is the operator's estimate, made while the old primary could not be asked: its position
as last seen (up to a probe old) against the promoted replica's. What the old primary wrote after that last answer is
not in it, so the estimate can be too low. When the old primary comes back, its own ``pg_wal`` says exactly: the
switchpoint is where the new primary's timeline history says the old timeline ended, and every byte the old primary
wrote on that timeline past the switchpoint is WAL the cluster does not have — the measured loss, to the byte. It is
read before ``pg_rewind`` or a clone discards it, with the binaries' own ``pg_waldump``.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Divergence", "end_of_last_record", "lsn", "lsn_text", "measure", "switchpoint_of"]

PAGE = 8192
"""XLOG_BLCKSZ of the packages kanri runs."""
SEGMENT = 16 * 1024 * 1024
"""wal_segment_size (initdb's default; kanri never changes it)."""
SHORT_HEADER = 24
"""MAXALIGN(SizeOfXLogShortPHD): the header of every WAL page but a segment's first."""
LONG_HEADER = 40
"""MAXALIGN(SizeOfXLogLongPHD): the header of a segment's first page."""

_RECORD = re.compile(r"len \(rec/tot\):\s*\d+/\s*(\d+),.*?lsn: ([0-9A-F]+/[0-9A-F]+)")


def lsn(text: str) -> int:
    """``X/Y`` as a byte position."""
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


def lsn_text(position: int) -> str:
    return f"{position >> 32:X}/{position & 0xFFFFFFFF:X}"


@dataclass(frozen=True)
class Divergence:
    """WAL the old primary wrote on ``timeline`` past ``switchpoint``, up to ``end`` (``bytes``; 0: none)."""

    timeline: int
    switchpoint: int
    end: int

    @property
    def bytes(self) -> int:
        return max(self.end - self.switchpoint, 0)

    def as_json(self) -> dict[str, Any]:
        return {"timeline": self.timeline, "switchpoint": lsn_text(self.switchpoint), "end": lsn_text(self.end),
                "bytes": self.bytes}  # fmt: skip


def switchpoint_of(history: str, timeline: int) -> int | None:
    """Where ``timeline`` ended according to a timeline history file's text (``parent\\tswitchpoint\\treason`` per
    line); None when the history does not pass through it."""
    for line in history.splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[0].isdigit() and int(fields[0]) == timeline:
            try:
                return lsn(fields[1])
            except ValueError:
                return None
    return None


def _advance(position: int, length: int) -> int:
    """The position after a record of ``length`` bytes starting at ``position``: page headers it crosses count too."""
    remaining = length
    while remaining > 0:
        take = min(remaining, PAGE - position % PAGE)
        position += take
        remaining -= take
        if remaining > 0:
            position += LONG_HEADER if position % SEGMENT == 0 else SHORT_HEADER
    return (position + 7) & ~7  # the next record starts MAXALIGNed


def end_of_last_record(waldump: str) -> int | None:
    """The end of the last record ``pg_waldump`` printed (None: it printed none)."""
    last = None
    for line in waldump.splitlines():
        if (found := _RECORD.search(line)) is not None:
            last = found
    if last is None:
        return None
    return _advance(lsn(last.group(2)), int(last.group(1)))


async def measure(pg_waldump: str, pg_wal: Path, timeline: int, history: str) -> Divergence | None:
    """The divergence of the stopped data directory whose ``pg_wal`` is given, on ``timeline``, from the timeline
    whose ``history`` text is given; None when the history does not branch from ``timeline`` or the WAL cannot be
    read (the operator keeps its estimate then)."""
    switchpoint = switchpoint_of(history, timeline)
    if switchpoint is None:
        return None
    process = await asyncio.create_subprocess_exec(
        pg_waldump, f"--path={pg_wal}", f"--timeline={timeline}", f"--start={lsn_text(switchpoint)}",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    # pg_waldump always ends with an error at the end of the WAL ("invalid record length at ..."); no valid record
    # after the switchpoint ("could not find a valid record after") means nothing was written past it.
    end = end_of_last_record(out.decode(errors="replace"))
    if end is None:
        if b"could not find a valid record" in err:
            return Divergence(timeline, switchpoint, switchpoint)
        return None
    return Divergence(timeline, switchpoint, end)
