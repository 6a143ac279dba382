"""Problems: what a pass found that a human must fix, each a reason and a message.

They become the ``Degraded`` condition (the most serious reason first, every message joined with ``; ``) and one
Warning Event per problem when it first appears — a problem already named in the previous ``Degraded`` message is not
announced again, so a converged but broken object costs no Event per pass. Messages name objects, keys and fields,
never a value from a Secret.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kanri.runtime import ApiError, get_condition

__all__ = [
    "CHILD_CONFLICT",
    "CHILD_REJECTED",
    "DEGRADED",
    "Problem",
    "Problems",
    "child_conflict",
    "child_rejected",
]

DEGRADED = "Degraded"
CHILD_REJECTED = "ChildRejected"
CHILD_CONFLICT = "ChildConflict"
_MAX_SERVER_MESSAGE = 500


@dataclass(frozen=True)
class Problem:
    """Something wrong a human must fix: ``reason`` is CamelCase (the condition's reason), ``message`` a sentence."""

    reason: str
    message: str
    event: str | None = None
    """The Warning Event's text when it should say more than the condition (how to recover, say)."""


class Problems:
    """The problems of one pass, ordered by ``severity`` (reasons, most serious first; unknown reasons last)."""

    def __init__(self, severity: Sequence[str] = ()) -> None:
        self._rank = {reason: i for i, reason in enumerate(severity)}
        self._found: dict[Problem, None] = {}

    def add(self, problem: Problem) -> None:
        """Record ``problem`` (a repeat of the same one is kept once)."""
        self._found[problem] = None

    def extend(self, problems: Iterable[Problem]) -> None:
        for problem in problems:
            self.add(problem)

    def ordered(self) -> list[Problem]:
        """Most serious first, stable within a reason."""
        return sorted(self._found, key=lambda p: self._rank.get(p.reason, len(self._rank)))

    def __bool__(self) -> bool:
        return bool(self._found)

    def __len__(self) -> int:
        return len(self._found)

    def reasons(self) -> list[str]:
        return [p.reason for p in self.ordered()]

    def condition(self) -> dict[str, Any]:
        """The ``Degraded`` condition (``update_status``'s keywords) these problems make."""
        found = self.ordered()
        if not found:
            return {"type": DEGRADED, "status": False, "reason": "AsExpected", "message": "no problem found"}
        return {"type": DEGRADED, "status": True, "reason": found[0].reason,
                "message": "; ".join(p.message for p in found)}  # fmt: skip

    def new_since(self, status: Mapping[str, Any]) -> list[Problem]:
        """The problems ``status`` (as it was before this pass) did not name yet: each gets its Warning Event."""
        told = get_condition((status or {}).get("conditions") or [], DEGRADED) or {}
        told_message = str(told.get("message") or "") if told.get("status") == "True" else ""
        return [p for p in self.ordered() if p.message not in told_message]


def child_rejected(kind: str, name: str, error: ApiError) -> Problem:
    """The API server refused a write of a child (a 4xx other than a conflict: retrying the same write cannot help)."""
    text = " ".join(error.message.split())[:_MAX_SERVER_MESSAGE] or error.reason or "no message"
    return Problem(CHILD_REJECTED, f"the API server refused {kind} {name} ({error.status}): {text}")


def child_conflict(kind: str, name: str, owner: str) -> Problem:
    """A child's name is taken by an object another owner controls: never taken over."""
    return Problem(CHILD_CONFLICT, f"{kind} {name} is controlled by {owner}; it is not taken over")
