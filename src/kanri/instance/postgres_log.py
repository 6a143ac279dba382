"""PostgreSQL's log passed through the manager: every byte goes on to the manager's stderr unchanged (the container
log), and every line is shown to the watchers that read it (:class:`kanri.instance.disk_full.DiskWatch` looks for
ENOSPC).

The copy runs in a thread of its own, not on the event loop: a busy or stalled loop must never make a PostgreSQL
backend wait on a full pipe to write a log line. The pipe is the manager's own, not asyncio's (asyncio's
``Process.wait()`` would also wait for its pipes to close, and a backend that outlives its postmaster for a moment
must not delay the supervisor). Watchers are called from that thread: they must only record, quickly.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

import structlog

__all__ = ["LineWatcher", "LogPipe", "split_lines"]

log = structlog.get_logger("kanri.instance.postgres")

LineWatcher = Callable[[str], None]

MAX_LINE = 64 * 1024
"""A line longer than this (a huge statement in the log) is shown to the watchers in pieces."""

_CHUNK = 64 * 1024


def split_lines(pending: bytes, chunk: bytes) -> tuple[list[bytes], bytes]:
    """The complete lines (each with its newline) of ``pending + chunk``, and what is left of an unfinished one
    (handed on whole once it exceeds :data:`MAX_LINE`)."""
    *complete, rest = (pending + chunk).split(b"\n")
    lines = [line + b"\n" for line in complete]
    if len(rest) > MAX_LINE:
        lines.append(rest)
        rest = b""
    return lines, rest


class LogPipe:
    """One pipe for one postmaster: give :attr:`write_fd` to the child as stdout and stderr, then :meth:`start`."""

    def __init__(self, watchers: list[LineWatcher], out: int | None = None) -> None:
        self.watchers = watchers
        self.out = sys.stderr.fileno() if out is None else out  # where the bytes go on: the container log
        self._read_fd, self.write_fd = os.pipe()
        self.thread = threading.Thread(target=self._copy, name="postgres-log", daemon=True)

    def start(self) -> None:
        """Close the manager's copy of the write end and copy the log until every writer has closed it."""
        os.close(self.write_fd)
        self.thread.start()

    def abandon(self) -> None:
        """The child was never started: close both ends."""
        os.close(self.write_fd)
        os.close(self._read_fd)

    def _copy(self) -> None:
        pending = b""
        try:
            while chunk := os.read(self._read_fd, _CHUNK):
                _write_all(self.out, chunk)
                lines, pending = split_lines(pending, chunk)
                for line in lines:
                    self._show(line.decode(errors="replace"))
            if pending:
                self._show(pending.decode(errors="replace"))
        finally:
            os.close(self._read_fd)

    def _show(self, line: str) -> None:
        for watch in self.watchers:
            try:
                watch(line)
            except Exception:  # a watcher's bug must not stop PostgreSQL's log
                log.exception("a log watcher failed")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError:
            return  # stderr gone (the manager is going away): the rest is lost, PostgreSQL must not block
        view = view[written:]
