"""Which schedule slot to back up now, and whether it is one an operator that was down missed: the pure decision behind
``spec.backup.schedule`` (:mod:`kanri.postgres.backup.schedule` executes it).

- On time: the latest slot after the one asked for last passed less than ``grace`` ago: a backup for it.
- Missed (the operator was down, or the cluster not running, when it passed): made up **once**. Only the latest slot
  is considered (one backup, never one per missed slot: the older ones would only be expired), so the slot made up is
  always within the schedule's own period of now (the next slot has not come yet): a cluster asleep for a month gets
  one backup, not a burst. It is not made up when a backup completed after it: that backup already covers it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError

from kanri.postgres.backup.plan import latest_slot

__all__ = ["GRACE", "SlotDecision", "decide"]

GRACE = timedelta(minutes=5)
"""A slot seen this long after it passed is still on time (the cluster's passes are far more frequent)."""
COUNT_LIMIT = 1000
"""Missed slots are counted (for the Event) up to this many."""


@dataclass(frozen=True)
class SlotDecision:
    """The latest slot not yet asked for, and what to do about it."""

    slot: datetime
    ask: bool
    """Create its backup; False: record the slot as handled, without a backup."""
    missed: int
    """Slots since the one asked for last that passed with no operator looking (0: on time)."""
    why: str


def _count(schedule: str, since: datetime, slot: datetime) -> int:
    """Slots in ``(since, slot]`` (at most :data:`COUNT_LIMIT`)."""
    count = 0
    try:
        for moment in CronSim(schedule, since.astimezone(UTC)):
            if moment > slot or count >= COUNT_LIMIT:
                break
            count += 1
    except CronSimError:
        return 0
    return count


def decide(
    schedule: str, since: datetime, now: datetime, last_completed: datetime | None, grace: timedelta = GRACE
) -> SlotDecision | None:
    """The slot of ``schedule`` (cron, UTC) to handle now, given the slot asked for last (``since``) and the end of the
    newest completed backup; None when no slot passed since."""
    slot = latest_slot(schedule, since, now)
    if slot is None:
        return None
    if now - slot <= grace:
        return SlotDecision(slot, True, 0, "on time")
    missed = _count(schedule, since, slot)
    if last_completed is not None and last_completed >= slot:
        return SlotDecision(slot, False, missed, f"a backup completed after it ({last_completed.isoformat()})")
    return SlotDecision(slot, True, missed, "made up once")
