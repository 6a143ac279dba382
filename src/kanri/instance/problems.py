"""Problems the user must fix, as the operator reads them from ``GET /status`` (``problems``).

Each has a ``reason`` (one of :data:`REASONS`), a one-line ``message`` that never holds a Secret's or a file's
content, and optionally the ``secret`` purpose, ``key`` or ``parameter`` it is about. The board keeps the current
problems per source and logs a problem once when it appears and once when it clears: a check that runs every 2 s
must not write a log line every 2 s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import structlog

from kanri.contract.problems import MAX_MESSAGE, REASONS

log = structlog.get_logger("kanri.instance.problems")


def one_line(text: str) -> str:
    """``text`` as one line of at most :data:`MAX_MESSAGE` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_MESSAGE else flat[: MAX_MESSAGE - 1] + "…"


@dataclass(frozen=True)
class Problem:
    """One thing the user must fix."""

    reason: str
    message: str
    secret: str | None = None
    key: str | None = None
    parameter: str | None = None

    def __post_init__(self) -> None:
        assert self.reason in REASONS, self.reason
        object.__setattr__(self, "message", one_line(self.message))

    def as_json(self) -> dict[str, str]:
        """The ``/status`` form: optional fields only when set."""
        body = {"reason": self.reason, "message": self.message}
        for name in ("secret", "key", "parameter"):
            if (value := getattr(self, name)) is not None:
                body[name] = value
        return body


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
