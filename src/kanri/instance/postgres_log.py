"""PostgreSQL's log passed through the manager: every line goes on to the manager's stderr unchanged (the container
log), and is shown to the watchers that read it (:class:`kanri.instance.disk_full.DiskWatch` looks for ENOSPC).

The postmaster writes to a pipe the manager drains at once; a line is never held back for a watcher. The pipe is the
manager's own, not asyncio's: asyncio's ``Process.wait()`` would also wait for its pipes to close, and a backend that
outlives its postmaster for a moment must not delay the supervisor."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Callable

import structlog

__all__ = ["LineWatcher", "LogPipe", "pass_through"]

log = structlog.get_logger("kanri.instance.postgres")

LineWatcher = Callable[[str], None]

_MAX_LINE = 64 * 1024
"""Longer lines are passed on in pieces (a huge statement in the log must not stall the pipe)."""


async def pass_through(stream: asyncio.StreamReader, watchers: list[LineWatcher], fd: int | None = None) -> None:
    """Copy ``stream`` to ``fd`` (stderr) line by line until EOF, showing each line to ``watchers``."""
    out = sys.stderr.fileno() if fd is None else fd
    while True:
        try:
            chunk = await stream.readuntil(b"\n")
        except asyncio.IncompleteReadError as end:
            chunk = end.partial
        except asyncio.LimitOverrunError as over:
            chunk = await stream.readexactly(min(over.consumed, _MAX_LINE) or 1)
        if not chunk:
            return
        _write_all(out, chunk)
        text = chunk.decode(errors="replace")
        for watch in watchers:
            try:
                watch(text)
            except Exception:  # a watcher's bug must not stop PostgreSQL's log
                log.exception("a log watcher failed")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError:
            return  # stderr gone (the manager is going away): the line is lost, PostgreSQL must not block
        view = view[written:]


class LogPipe:
    """One pipe for one postmaster: give :attr:`write_fd` to the child as stdout and stderr, then :meth:`start`."""

    def __init__(self, watchers: list[LineWatcher], out: int | None = None) -> None:
        self.watchers = watchers
        self.out = out  # where the lines go on: the manager's stderr unless told
        self._read_fd, self.write_fd = os.pipe()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Close the manager's copy of the write end and copy the log until every writer has closed it."""
        os.close(self.write_fd)
        self.task = asyncio.create_task(self._copy())

    async def _copy(self) -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=_MAX_LINE)
        transport, _ = await loop.connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(self._read_fd, "rb", buffering=0)
        )
        try:
            await pass_through(reader, self.watchers, self.out)
        finally:
            transport.close()

    def abandon(self) -> None:
        """The child was never started: close both ends."""
        os.close(self.write_fd)
        os.close(self._read_fd)
