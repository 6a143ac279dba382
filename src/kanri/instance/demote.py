"""What a planned switchover needs from the old primary: where its shutdown checkpoint is.

A fast shutdown of a primary writes a shutdown checkpoint as its last WAL record, and the WAL senders send all WAL
up to it to the connected standbys before they exit. Its location, read from ``pg_controldata`` once the server is
down, is therefore the point a standby must have received before it is promoted: a standby that has received past it
has every commit the old primary acknowledged, and the old primary can follow it without pg_rewind.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ControlData", "parse_controldata", "read_controldata"]


@dataclass(frozen=True)
class ControlData:
    """The fields of ``pg_controldata`` a switchover reads."""

    state: str
    """``Database cluster state``: ``shut down`` after a clean stop of a primary."""
    system_identifier: str
    """``Database system identifier``."""
    checkpoint_lsn: str
    """``Latest checkpoint location`` (``X/Y``)."""
    timeline: int
    """``Latest checkpoint's TimeLineID``."""


def parse_controldata(text: str) -> ControlData:
    """Parse ``pg_controldata``'s output (run with ``LC_ALL=C``); ValueError names a missing field."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    try:
        return ControlData(
            state=fields["Database cluster state"],
            system_identifier=fields["Database system identifier"],
            checkpoint_lsn=fields["Latest checkpoint location"],
            timeline=int(fields["Latest checkpoint's TimeLineID"]),
        )
    except KeyError as exc:
        raise ValueError(f"pg_controldata printed no {exc.args[0]!r}") from None


async def read_controldata(pg_controldata: str, pgdata: Path) -> ControlData:
    """Run ``pg_controldata PGDATA`` and parse it; RuntimeError when it fails."""
    proc = await asyncio.create_subprocess_exec(
        pg_controldata,
        str(pgdata),
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "LC_ALL": "C"},  # the field names are translated otherwise
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"pg_controldata failed with code {proc.returncode}: {text.strip()[-300:]}")
    return parse_controldata(text)
