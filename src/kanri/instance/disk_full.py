"""A full data volume, said as such: ``DiskFull`` with the volume's free bytes, and cleared once space returns.

Evidence comes from two places. PostgreSQL's own log (its stderr passes through the manager, see
:mod:`kanri.instance.postgres_process`): a line ``could not …: No space left on device`` is what an INSERT that cannot
extend a table, a WAL write that panics, a checkpoint or a start that fails on ENOSPC print. And the volume itself:
``statvfs`` of PGDATA gives the bytes an unprivileged writer (PostgreSQL) may still use.

A log line alone is not proof (a user's ``RAISE EXCEPTION`` can print the same words), and a low free figure alone is
only a warning (the alerts say that one): the instance reports ``DiskFull`` while PostgreSQL has failed to write for
lack of space and the volume is still below :func:`room_needed`, or outright when nothing at all is left
(:data:`EMPTY_BELOW`). Once the volume has room again (files removed, the claim grown) the problem clears and
:meth:`DiskWatch.room` wakes the supervisor, so a PostgreSQL that stopped starts again at once, not after its back-off.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from kanri.contract.status import Problem
from kanri.instance.problems import ProblemLog

__all__ = [
    "CHECK_INTERVAL",
    "DISK_FULL",
    "EMPTY_BELOW",
    "DiskWatch",
    "VolumeSpace",
    "disk_full_problems",
    "enospc_failure",
    "read_space",
    "room_needed",
]

log = structlog.get_logger("kanri.instance.disk")

DISK_FULL = "DiskFull"

CHECK_INTERVAL = 2.0
"""Seconds between two looks at the volume (one statvfs)."""

WAL_SEGMENT = 16 * 1024 * 1024
"""PostgreSQL allocates WAL a whole segment at a time: with less than this free, the next segment cannot be made."""

EMPTY_BELOW = 1024 * 1024
"""Less than this free for PostgreSQL is a full volume even before PostgreSQL said so."""

_ENOSPC = re.compile(r"\b(?:ERROR|FATAL|PANIC|WARNING|LOG):\s+(could not [^:\"]*(?:\"[^\"]*\")?[^:]*): "
                     + re.escape(os.strerror(28)) + r"\s*$")  # fmt: skip
"""PostgreSQL's own ENOSPC messages: ``could not extend file "base/…"``, ``could not write to file "pg_wal/…"``, ``could
not write lock file "postmaster.pid"``; never ``statement: …`` (log_statement lines quote SQL)."""


def enospc_failure(line: str) -> str | None:
    """What PostgreSQL could not do for lack of space (``could not extend file "base/16384/16385"``), or None when
    ``line`` is not one of its ENOSPC messages. Only the failed operation is kept: a file name, never a row."""
    found = _ENOSPC.search(line.rstrip("\n"))
    return found.group(1)[:100] if found else None


def room_needed(size_bytes: int) -> int:
    """Free bytes the volume must have again for the problem to clear: two WAL segments, or 2% of a large volume
    (so a volume that merely flickers above the edge is not called recovered)."""
    return max(2 * WAL_SEGMENT, size_bytes // 50)


@dataclass(frozen=True)
class VolumeSpace:
    """The data volume as statvfs sees it: its size and what an unprivileged writer may still use."""

    path: str
    free_bytes: int
    size_bytes: int


def read_space(path: Path) -> VolumeSpace | None:
    """The volume holding ``path`` (None while it does not exist yet, say a replica still cloning)."""
    try:
        stat = os.statvfs(path)
    except OSError:
        return None
    return VolumeSpace(str(path), stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize)


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.1f} MiB"


def disk_full_problems(space: VolumeSpace | None, failure: str | None, shown_free: int | None = None) -> list[Problem]:
    """The decision: ``DiskFull`` when PostgreSQL failed to write for lack of space (``failure``, from its log) and the
    volume is still short of :func:`room_needed`, or when less than :data:`EMPTY_BELOW` is left at all. The message
    says ``shown_free`` bytes free when given (the figure already told), else what ``space`` has."""
    if space is None:
        return []
    short = space.free_bytes < room_needed(space.size_bytes)
    if not (failure is not None and short) and space.free_bytes >= EMPTY_BELOW:
        return []
    free = space.free_bytes if shown_free is None else shown_free
    said = f"; PostgreSQL: {failure}: No space left on device" if failure else ""
    message = (f"data volume full: {free} bytes free of {space.size_bytes} ({_mib(free)} of "
               f"{_mib(space.size_bytes)}, PGDATA {space.path}){said}; it writes again once "
               f"{_mib(room_needed(space.size_bytes))} are free")  # fmt: skip
    return [Problem(DISK_FULL, message)]


class DiskWatch:
    """Reads PostgreSQL's log lines and the volume; reports ``DiskFull`` to the problem log (source ``disk``).

    The free figure in the message is the one seen when the problem appeared and moves only when the free space has
    moved by more than a WAL segment: the operator posts an Event per new message, not one per byte."""

    SOURCE = "disk"

    def __init__(self, pgdata: Path, read: Callable[[Path], VolumeSpace | None] = read_space) -> None:
        self.pgdata = pgdata
        self.read = read
        self.failure: str | None = None  # the last ENOSPC PostgreSQL printed, until the volume has room again
        self.full = False
        self.shown_free: int | None = None  # the free bytes the current problem tells
        self.room = asyncio.Event()
        self.room.set()

    def saw_line(self, line: str) -> None:
        """One line of PostgreSQL's log."""
        # the first failure is kept until there is room: a WAL temp file's name changes with each attempt
        if self.failure is None and (failure := enospc_failure(line)) is not None:
            log.warning("postgres ran out of space", failure=failure, pgdata=str(self.pgdata))
            self.failure = failure

    def check(self) -> list[Problem]:
        """Look at the volume now: the problems to report (none, or one ``DiskFull``)."""
        space = self.read(self.pgdata)
        if space is not None and self.failure is not None and space.free_bytes >= room_needed(space.size_bytes):
            self.failure = None  # room again: what PostgreSQL said before no longer holds
        shown = self.shown_free
        if shown is not None and space is not None and abs(space.free_bytes - shown) > WAL_SEGMENT:
            shown = None  # moved a lot: tell the new figure
        problems = disk_full_problems(space, self.failure, shown)
        if problems and not self.full:
            self.room.clear()
        elif not problems and self.full:
            log.info("the data volume has room again", free_bytes=space.free_bytes if space else None)
            self.room.set()
        self.full = bool(problems)
        if not problems or shown is None:
            self.shown_free = space.free_bytes if problems and space is not None else None
        return problems

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less: until a full volume has room again (a restart back-off ends there)."""
        if self.room.is_set():
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.room.wait(), seconds)

    async def run(self, problems: ProblemLog, interval: float = CHECK_INTERVAL) -> None:
        """Check every ``interval`` seconds, forever."""
        while True:
            problems.report(self.SOURCE, self.check())
            await asyncio.sleep(interval)
