"""Times as the API writes them (RFC 3339, ``metav1.Time``), read from raw objects as aware datetimes in UTC.

Objects on the hot path stay plain dicts, so their times stay strings; these helpers turn them into datetimes at
the one place a reconciler compares them, instead of a ``fromisoformat(text.replace("Z", "+00:00"))`` per module.
Models (:class:`~kanri.runtime.KubeModel`) parse their ``datetime`` fields themselves.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["creation_time", "deletion_time", "format_time", "parse_optional_time", "parse_time"]

_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision and a ``Z``, as metav1.Time serialises (``2026-05-01T12:00:00Z``).

    The inverse of :func:`parse_time` (to the second). A naive datetime raises ``ValueError``."""
    if moment.tzinfo is None:
        raise ValueError("times must be timezone-aware (use datetime.now(UTC) or the injected clock)")
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    """An RFC 3339 time as the API server writes it (``creationTimestamp``, ``lastTransitionTime``, a MicroTime's
    ``2026-05-01T12:00:00.123456Z``, or with an offset) as an aware datetime in UTC. Raises ``ValueError`` otherwise
    (a time without a zone too: it would compare wrongly with every aware one)."""
    if not isinstance(text, str) or not _RFC3339.fullmatch(text):
        raise ValueError(f"not an RFC 3339 time: {text!r}")
    return datetime.fromisoformat(text.replace("z", "Z")).astimezone(UTC)


def parse_optional_time(value: str | None) -> datetime | None:
    """:func:`parse_time` of an optional field: None (or ``""``) for an absent time, e.g.
    ``parse_optional_time(status.get("lastScheduleTime"))``. Anything else that is not RFC 3339 raises."""
    if value is None or value == "":
        return None
    return parse_time(value)


def creation_time(obj: Mapping[str, Any]) -> datetime:
    """When the API server created ``obj`` (``metadata.creationTimestamp``). Raises ``ValueError`` for an object
    that was never stored (built in code)."""
    text = (obj.get("metadata") or {}).get("creationTimestamp")
    if not text:
        raise ValueError("the object has no metadata.creationTimestamp: it was not read from the API")
    return parse_time(text)


def deletion_time(obj: Mapping[str, Any]) -> datetime | None:
    """When deletion of ``obj`` was requested (``metadata.deletionTimestamp``); None while it is not being deleted.

    With finalizers the object stays until they are removed; this is the time the wait began."""
    return parse_optional_time((obj.get("metadata") or {}).get("deletionTimestamp"))
