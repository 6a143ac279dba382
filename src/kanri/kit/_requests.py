"""One way to ask an operator to act: an annotation in, an acknowledgement in status, idempotent.

A user (or a tool) writes ``<domain>/<request>=<value>`` on the object — any value not answered before, a timestamp
is customary. The operator sees the request :func:`pending` while ``status.requests.<request>.value`` differs,
carries it out, and :func:`acknowledge`\\ s it: the value handled, the result and a message. Seen again, the same
value is already acknowledged and nothing happens; a new value is a new request. The annotation stays (removing it
would be a second write racing the user's next one) and the status says what became of it.

An *approval* is a request whose value names exactly what it approves (:func:`approved`): the operator says what it
waits for (``approve-removal=keys a,b``) and acts only when the annotation says that very text; an approval of
something else — an older plan — approves nothing.

Acknowledge with the pass (staged, written by the pass's one status write) when the action is idempotent; commit at
once (``at_once=True``) when the acknowledgement must be on record before the next step acts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

from kanri.kit._ledger import StatusLedger
from kanri.runtime import KubeModel, format_time

__all__ = ["FIELD", "Acknowledgement", "RequestResult", "acknowledge", "acknowledged", "approved", "pending"]

FIELD = "requests"
"""``status.requests``: request name -> :class:`Acknowledgement`."""
RequestResult = Literal["Done", "Refused", "Failed"]
_MAX_VALUE = 253


class Acknowledgement(KubeModel):
    """What became of the last request of one name (``status.requests.<name>``)."""

    value: str
    """The annotation's value that was handled."""
    result: RequestResult
    """Done, Refused (not possible now: the message says why) or Failed."""
    message: str = ""
    time: str
    """When it was handled (RFC 3339)."""


def _asked(obj: Mapping[str, Any], annotation: str) -> str:
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(annotation) or ""
    return str(value).strip()[:_MAX_VALUE]


def acknowledged(status: Mapping[str, Any], name: str) -> Acknowledgement | None:
    """The acknowledgement of request ``name`` in ``status``, if any."""
    raw = ((status or {}).get(FIELD) or {}).get(name)
    return None if raw is None else Acknowledgement.model_validate(raw)


def pending(obj: Mapping[str, Any], annotation: str, name: str) -> str | None:
    """The value of the request in ``annotation`` when it was not acknowledged yet under ``name``, else None."""
    value = _asked(obj, annotation)
    if not value:
        return None
    done = acknowledged(obj.get("status") or {}, name)
    return None if done is not None and done.value == value else value


def approved(obj: Mapping[str, Any], annotation: str, subject: str) -> bool:
    """Whether the annotation approves exactly ``subject`` (what the operator said it waits for)."""
    return bool(subject) and _asked(obj, annotation) == subject.strip()[:_MAX_VALUE]


async def acknowledge(
    ledger: StatusLedger,
    name: str,
    value: str,
    result: RequestResult,
    message: str = "",
    *,
    at_once: bool = False,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> None:
    """Record that request ``name`` with ``value`` was handled: staged with the pass, or committed now."""
    entry = Acknowledgement(value=value, result=result, message=message, time=format_time(now()))
    requests = {**(ledger.status.get(FIELD) or {}), **(ledger.staged.get(FIELD) or {})}
    requests[name] = entry.model_dump(mode="json", by_alias=True)
    if at_once:
        await ledger.commit(FIELD, requests)
    else:
        ledger.stage(FIELD, requests)
