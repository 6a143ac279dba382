"""The deletion gate of a KafkaTopic with ``deletionPolicy: Delete``: pure, from what Kafka reports now.

The topic is deleted only when (1) no consumer group has messages it has not consumed (lag 0), or the retention
window has passed since the newest message (everything would be gone anyway), and (2) the approval annotation names
the topic. Anything that blocks is said in status and an Event. After ``deletionTimeoutSeconds`` the operator gives
up: the topic is kept and the finalizer dropped, so a namespace never hangs on a gate or a broker that is gone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from kanri.kafka.topics.admin import GroupLag


@dataclass(frozen=True)
class Delete:
    """Every gate is open: delete the topic."""


@dataclass(frozen=True)
class Blocked:
    reasons: list[str]
    """What blocks, with numbers (for status)."""
    summary: list[str]
    """The same without numbers (for the Degraded condition and its Events: a lag that changes is no new reason)."""

    @property
    def message(self) -> str:
        return "; ".join(self.reasons)


@dataclass(frozen=True)
class GiveUp:
    """Waited past the timeout: keep the topic, drop the finalizer."""

    message: str


def retention_passed(retention_ms: int | None, newest_ms: int | None, now: datetime) -> bool:
    """Whether every message is older than the retention window (a topic without messages counts as passed)."""
    if newest_ms is None or newest_ms < 0:
        return True
    if retention_ms is None or retention_ms < 0:
        return False
    return now.timestamp() * 1000 - newest_ms > retention_ms


def decide(
    *,
    topic: str,
    groups: Sequence[GroupLag] | None,
    retention_ms: int | None,
    newest_ms: int | None,
    approval: str,
    deleting_since: datetime,
    timeout_seconds: int,
    now: datetime,
    unreachable: str | None = None,
) -> Delete | Blocked | GiveUp:
    """``groups`` is None when Kafka could not be asked (``unreachable`` says why)."""
    reasons, summary = [], []
    if unreachable is not None or groups is None:
        reasons.append(f"Kafka cannot be reached: {unreachable or 'no answer'}")
        summary.append("Kafka cannot be reached")
    else:
        lagging = [g for g in groups if g.lag > 0]
        if lagging and not retention_passed(retention_ms, newest_ms, now):
            reasons.append("consumer groups have unconsumed messages: " +
                           ", ".join(f"{g.group} (lag {g.lag})" for g in lagging))  # fmt: skip
            summary.append("consumer groups have unconsumed messages: " + ", ".join(g.group for g in lagging))
    if approval != topic:
        needs = f"deleting topic {topic} needs the annotation kafka.kanri.dev/approve-deletion={topic}"
        reasons.append(needs)
        summary.append(needs)
    if not reasons:
        return Delete()
    waited = (now - deleting_since).total_seconds()
    if waited >= timeout_seconds:
        return GiveUp(f"gave up deleting topic {topic} after {timeout_seconds} s; the topic and its messages are "
                      f"kept ({'; '.join(reasons)})")  # fmt: skip
    return Blocked(reasons, summary)
