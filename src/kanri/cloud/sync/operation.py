"""Provider operations as a state machine in ``status.operation``: the record is committed *before* the call (the
intent), so an operator killed at any point finds it and polls, or repeats a call that is safe to repeat (a create
is found by its deterministic name and uid tag; a delete of a deleting database is refused as busy and waited for).

``decide`` is the pure part: from the record and what the provider reports, call (again), wait, or end."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from kanri.cloud.api import OperationRecord
from kanri.cloud.providers.base import Observed

__all__ = ["FAILED_STATES", "MODIFY_TIMEOUT", "Verdict", "decide", "ended", "started"]

FAILED_STATES = frozenset({"failed", "incompatible-parameters", "incompatible-network", "incompatible-restore",
                           "incompatible-option-group", "storage-full", "inaccessible-encryption-credentials",
                           "restore-error"})  # fmt: skip
MODIFY_TIMEOUT = timedelta(minutes=30)
"""A modify whose database is settled but still differs after this long failed (named, not retried blindly)."""

Action = Literal["call", "wait", "succeeded", "failed"]


@dataclass(frozen=True)
class Verdict:
    action: Action
    message: str = ""


def decide(record: OperationRecord, observed: Observed | None, *, converged: bool, now: datetime) -> Verdict:
    """What to do about the operation ``record`` now that the provider reports ``observed`` (None: no database).
    ``converged``: the fields the operation changes have their desired values (or are pending)."""
    if observed is not None and observed.state in FAILED_STATES:
        return Verdict("failed", f"the database is {observed.state}")
    if record.kind == "Create":
        if observed is None:
            return Verdict("call")  # never sent, or not accepted: the create is repeated (found by name if it was)
        return Verdict("succeeded") if observed.settled else Verdict("wait", f"the database is {observed.state}")
    if record.kind == "Delete":
        if observed is None:
            return Verdict("succeeded")
        if observed.state == "deleting" or (record.outcome == "InProgress" and observed.state != "available"):
            return Verdict("wait", f"the database is {observed.state}")
        return Verdict("call")
    if observed is None:
        return Verdict("failed", "the database is gone")
    if not observed.settled:
        return Verdict("wait", f"the database is {observed.state}")
    if converged:
        return Verdict("succeeded")
    if record.outcome == "Pending":
        return Verdict("call")
    if now - record.started > MODIFY_TIMEOUT:
        return Verdict("failed", f"the provider did not apply {', '.join(record.fields)}")
    return Verdict("wait", "the provider has not applied the change yet")


def started(kind: Literal["Create", "Modify", "Delete"], id: str, target: str, fields: tuple[str, ...] = (),
            generation: int | None = None) -> OperationRecord:  # fmt: skip
    """A new record, Pending until the provider accepted the call."""
    return OperationRecord(kind=kind, id=id, target_state=target, started=datetime.now(UTC), fields=list(fields),
                           generation=generation)  # fmt: skip


def ended(record: OperationRecord, verdict: Verdict) -> OperationRecord:
    """The record as ``status.lastOperation`` keeps it."""
    outcome: Literal["Succeeded", "Failed"] = "Succeeded" if verdict.action == "succeeded" else "Failed"
    return record.model_copy(update={"outcome": outcome, "message": verdict.message or None})
