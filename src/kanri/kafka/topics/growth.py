"""Partition growth in checked steps: the pure decision of what to do next, from what Kafka reports now.

Before each step: the pause since the last step has passed, every active consumer group on the topic (one with
members) is stable (not rebalancing) and lags at most ``maxLag`` messages, and — for a key-ordered topic, whose keys
move to other partitions when partitions are added — a human approved exactly this step. A group without members is
not waited for (it may never come back); its lag is still shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from kanri.kafka.api import PartitionGrowth
from kanri.kafka.topics.admin import GroupLag

#: Group states in which a group's assignment is settled; anything else with members is a rebalance under way.
SETTLED = frozenset({"STABLE", "EMPTY"})


@dataclass(frozen=True)
class Grow:
    """Take one step: make the topic ``to`` partitions."""

    to: int
    checks: str


@dataclass(frozen=True)
class Wait:
    """No step now: ``reason`` (a condition reason) and a message that says exactly what blocks."""

    reason: str
    message: str
    retry_after: float
    approval: str | None = None
    """For ``ApprovalRequired``: the approval annotation's value that approves this step."""


def step_subject(topic: str, current: int, to: int) -> str:
    """What an approval of the step names: ``orders 6->8``."""
    return f"{topic} {current}->{to}"


def describe_groups(groups: Sequence[GroupLag]) -> str:
    if not groups:
        return "no consumer groups"
    return "; ".join(f"{g.group} {g.state} members {g.members} lag {g.lag}" for g in groups)


def decide(
    *,
    topic: str,
    current: int,
    desired: int,
    growth: PartitionGrowth,
    groups: Sequence[GroupLag],
    key_ordered: bool,
    approval: str,
    last_step_time: datetime | None,
    now: datetime,
) -> Grow | Wait | None:
    """The next growth step, or why there is none now; None when the topic has its partitions."""
    if current >= desired:
        return None
    to = min(desired, current + growth.step_size)
    if last_step_time is not None:
        waited = (now - last_step_time).total_seconds()
        if waited < growth.pause_seconds:
            # the message names a fixed time, not the seconds left: a status that changes on every pass is rewritten
            # on every pass (and each write is another event)
            due = last_step_time + timedelta(seconds=growth.pause_seconds)
            return Wait("GrowthPaused", f"next step {current}->{to} at {due.isoformat(timespec='seconds')} (pause "
                        f"{growth.pause_seconds} s between steps)", growth.pause_seconds - waited)  # fmt: skip
    active = [g for g in groups if g.members > 0]
    unsettled = [g for g in active if g.state not in SETTLED]
    if unsettled:
        names = ", ".join(f"{g.group} ({g.state})" for g in unsettled)
        return Wait("GroupRebalancing", f"step {current}->{to} waits: consumer groups rebalancing: {names}", 5)
    lagging = [g for g in active if g.lag > growth.max_lag]
    if lagging:
        names = ", ".join(f"{g.group} lag {g.lag}" for g in lagging)
        return Wait("ConsumerLag", f"step {current}->{to} waits: consumer groups over maxLag {growth.max_lag}: "
                    f"{names}", 10)  # fmt: skip
    checks = f"{describe_groups(groups)} (maxLag {growth.max_lag})"
    subject = step_subject(topic, current, to)
    if key_ordered and approval != subject:
        return Wait("ApprovalRequired", f"topic is key-ordered: step {current}->{to} moves keys to other "
                    f"partitions; approve with annotation kafka.kanri.dev/approve-growth={subject!r}", 30,
                    approval=subject)  # fmt: skip
    return Grow(to, checks)
