"""Status conditions on raw JSON dicts, with the semantics of apimachinery's ``meta.SetStatusCondition``.

The hot path keeps objects as plain dicts, so these helpers work on ``status["conditions"]`` directly and never
build models. ``lastTransitionTime`` records when the *status* last flipped: rewording a reason or message, or
observing a new generation, does not move it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Literal, TypeVar

from kanri.runtime._time import format_time, parse_time

__all__ = [
    "ConditionStatus",
    "format_time",
    "get_condition",
    "is_true",
    "parse_time",
    "remove_condition",
    "set_condition",
]

ConditionStatus = Literal["True", "False", "Unknown"]

# The same rules metav1.Condition's schema enforces; checking here turns a 422 from the API server into an error
# at the line that built the condition.
_TYPE = re.compile(
    r"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]"
)
_REASON = re.compile(r"[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?")
_STATUSES = ("True", "False", "Unknown")

M = TypeVar("M", bound=Mapping[str, Any])


def set_condition(
    conditions: list[dict[str, Any]],
    *,
    type: str,
    status: ConditionStatus | bool,
    reason: str,
    message: str,
    observed_generation: int | None,
    now: datetime | None = None,
) -> bool:
    """Add or update the condition of ``type`` in place; return whether anything changed.

    ``status`` may be a bool (True -> "True", False -> "False"). ``lastTransitionTime`` is set to ``now`` when the
    condition is new or its status flips, and kept otherwise (``now`` defaults to the current UTC time; inject it
    in tests). ``observed_generation`` None leaves the field out.
    """
    now = now or datetime.now(UTC)
    wanted = _status(status)
    if not _TYPE.fullmatch(type) or len(type) > 316:
        raise ValueError(f"invalid condition type {type!r}: CamelCase, optionally prefixed by a DNS name and '/'")
    if not _REASON.fullmatch(reason) or len(reason) > 1024:
        raise ValueError(f"invalid condition reason {reason!r}: CamelCase letters, digits, '_', ',' or ':'")

    existing = get_condition(conditions, type)
    if existing is None:
        condition: dict[str, Any] = {"type": type, "status": wanted}
        if observed_generation is not None:
            condition["observedGeneration"] = observed_generation
        condition.update({"lastTransitionTime": format_time(now), "reason": reason, "message": message})
        conditions.append(condition)
        return True

    before = dict(existing)
    if existing.get("status") != wanted:
        existing["status"] = wanted
        existing["lastTransitionTime"] = format_time(now)
    elif "lastTransitionTime" not in existing:
        existing["lastTransitionTime"] = format_time(now)  # repair a malformed entry; the field is required
    existing["reason"] = reason
    existing["message"] = message
    if observed_generation is None:
        existing.pop("observedGeneration", None)
    else:
        existing["observedGeneration"] = observed_generation
    return existing != before


def get_condition(conditions: Sequence[M] | None, type: str) -> M | None:
    """The condition of ``type`` (the very dict in the list, so callers may edit it), or None."""
    for condition in conditions or ():
        if condition.get("type") == type:
            return condition
    return None


def is_true(conditions: Sequence[Mapping[str, Any]] | None, type: str) -> bool:
    """Whether the condition of ``type`` exists and its status is "True"."""
    condition = get_condition(conditions, type)
    return condition is not None and condition.get("status") == "True"


def remove_condition(conditions: list[dict[str, Any]], type: str) -> bool:
    """Remove the condition of ``type`` in place; return whether it was there."""
    kept = [condition for condition in conditions if condition.get("type") != type]
    removed = len(kept) != len(conditions)
    conditions[:] = kept
    return removed


def _status(status: ConditionStatus | bool) -> ConditionStatus:
    if isinstance(status, bool):
        return "True" if status else "False"
    if status not in _STATUSES:
        raise ValueError(f"condition status must be True, False or Unknown, not {status!r}")
    return status
