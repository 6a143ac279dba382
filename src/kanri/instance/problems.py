"""Problems the user must fix, as the operator reads them from ``GET /status`` (``problems``).

Each is a :class:`kanri.contract.status.Problem`: a ``reason`` (one of :data:`kanri.contract.problems.REASONS`), a
one-line ``message`` that never holds a Secret's or a file's content, and optionally the ``secret`` purpose, ``key``
or ``parameter`` it is about. The board keeps the current problems per source and logs a problem once when it appears
and once when it clears: a check that runs every 2 s must not write a log line every 2 s. :class:`ProblemLog` adds
``lastError``: the newest message that still holds, problem or not.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable

import structlog

from kanri.contract.problems import one_line
from kanri.contract.status import Problem

__all__ = [
    "UNREACHABLE",
    "UNREACHABLE_AFTER",
    "Problem",
    "ProblemBoard",
    "ProblemLog",
    "Reachability",
    "cannot_connect_now",
    "connection_error",
    "one_line",
]

log = structlog.get_logger("kanri.instance.problems")


class ProblemBoard:
    """The current problems, by source (e.g. ``secret:app``, ``parameters``); oldest source first."""

    def __init__(self) -> None:
        self._by_source: dict[str, tuple[Problem, ...]] = {}

    def set(self, source: str, problems: Iterable[Problem]) -> bool:
        """Replace the problems of ``source``; True when they changed (new ones are logged, cleared ones too)."""
        new = tuple(dict.fromkeys(problems))
        old = self._by_source.get(source, ())
        if new == old:
            return False
        for problem in new:
            if problem not in old:
                log.warning("problem", **problem.as_json())
        for problem in old:
            if problem not in new:
                log.info("problem resolved", **problem.as_json())
        self._by_source.pop(source, None)  # re-insert: the newest source comes last
        if new:
            self._by_source[source] = new
        return True

    def clear(self, source: str) -> bool:
        """No problems from ``source`` any more; True when there were some."""
        return self.set(source, ())

    def get(self, source: str) -> tuple[Problem, ...]:
        return self._by_source.get(source, ())

    def all(self) -> list[Problem]:
        """Every current problem, the most recently changed source last."""
        return [p for problems in self._by_source.values() for p in problems]


class ProblemLog:
    """What ``/status`` says is wrong: the problems by source (:attr:`board`) and, per source, the last error
    message that still holds (``lastError``), be it a problem for the user or a failure the instance retries."""

    def __init__(self) -> None:
        self.board = ProblemBoard()
        self._errors: dict[str, str] = {}  # source → message, oldest first

    @property
    def last_error(self) -> str | None:
        """The most recent error that still holds (None once every source has recovered)."""
        return next(reversed(self._errors.values()), None)

    def record(self, source: str, message: str) -> bool:
        """Set ``source``'s error; True when it is new (the caller logs only then)."""
        new = self._errors.get(source) != message
        self._errors.pop(source, None)  # re-insert: the newest comes last
        self._errors[source] = message
        return new

    def note(self, source: str, message: str) -> None:
        """:meth:`record` ``message`` as one line."""
        self.record(source, one_line(message))

    def clear(self, source: str) -> None:
        """``source`` has recovered."""
        self._errors.pop(source, None)

    def report(self, source: str, problems: list[Problem] | tuple[Problem, ...]) -> None:
        """The problems of ``source`` for ``problems`` in /status (logged once per change) and for ``lastError``."""
        if self.board.set(source, problems):
            if problems:
                self.record(source, problems[-1].message)
            else:
                self.clear(source)


UNREACHABLE = "PostgresUnreachable"

UNREACHABLE_AFTER = 10.0
"""Seconds the manager's connections to its own running PostgreSQL must keep failing before that is a problem: a
postmaster that has just started has no socket yet for a moment, and that is not for a human to fix."""

_PSYCOPG_PREFIXES = ("connection failed: ", "connection is bad: ")
_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_NOT_YET = "the database system is "
"""SQLSTATE 57P03's messages (starting up, shutting down, in recovery mode, not yet accepting connections): the
server answered, it merely does not take connections now. psycopg does not carry the SQLSTATE of a failed connect."""


def connection_error(error: BaseException | str) -> str:
    """The first line of a failed connection's error, as one short line: libpq's ``connection to server on socket
    "…" failed: FATAL:  …``. Only the first line: the rest is hints and psycopg's list of every attempt. A connection
    error never quotes SQL and libpq never puts the password in it; a ``password=`` is masked all the same."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    first = lines[0] if lines else type(error).__name__ if isinstance(error, BaseException) else "unknown error"
    for prefix in _PSYCOPG_PREFIXES:
        first = first.removeprefix(prefix)
    return one_line(_PASSWORD.sub(r"\1***", first))


def cannot_connect_now(message: str) -> bool:
    """PostgreSQL answered that it does not accept connections at the moment (starting, stopping, recovering)."""
    return _NOT_YET in message


class Reachability:
    """Whether the manager reaches its own running PostgreSQL: ``PostgresUnreachable`` once every connection to the
    same postmaster failed for :data:`UNREACHABLE_AFTER` seconds; nothing as soon as one works or the server answers
    that it is starting or stopping. Without this, a manager that cannot log in (peer authentication with a wrong
    uid, a socket directory it cannot enter, no connection slot left) shows only as "not ready"."""

    def __init__(self, after: float = UNREACHABLE_AFTER, clock: Callable[[], float] = time.monotonic) -> None:
        self.after = after
        self.clock = clock
        self._since: float | None = None
        self._postmaster: object = None

    def failed(self, postmaster: object, error: BaseException | str) -> list[Problem]:
        """A connection to ``postmaster`` (the running process) failed with ``error``: the problems to report."""
        message = connection_error(error)
        if cannot_connect_now(message):
            return self.reached()
        if self._since is None or postmaster is not self._postmaster:
            self._since, self._postmaster = self.clock(), postmaster  # a new postmaster gets its own grace
        if self.clock() - self._since < self.after:
            return []
        return [Problem(UNREACHABLE, message)]

    def reached(self) -> list[Problem]:
        """A connection worked (or no postmaster runs to reach): nothing to report."""
        self._since, self._postmaster = None, None
        return []
