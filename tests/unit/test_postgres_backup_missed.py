"""A schedule slot missed while the operator was down is made up once, not once per slot, and not when a newer backup
covers it (kanri.postgres.backup.missed)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kanri.postgres.backup.missed import decide
from kanri.postgres.backup.schedule import Wanted, due, wanted

DAILY = "0 3 * * *"
LAST = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, day, hour, minute, tzinfo=UTC)


def test_a_slot_seen_as_it_passes_is_on_time() -> None:
    decision = decide(DAILY, LAST, at(2, 3, 1), None)
    assert decision is not None
    assert (decision.slot, decision.ask, decision.missed) == (at(2, 3), True, 0)


def test_nothing_is_due_before_the_next_slot() -> None:
    assert decide(DAILY, LAST, at(2, 2, 59), None) is None


def test_an_operator_down_over_one_slot_makes_it_up_once_when_it_returns() -> None:
    decision = decide(DAILY, LAST, at(2, 9), last_completed=LAST + timedelta(minutes=20))
    assert decision is not None
    assert (decision.slot, decision.ask, decision.missed) == (at(2, 3), True, 1)
    assert decision.why == "made up once"


def test_days_of_missed_slots_are_made_up_by_one_backup_for_the_latest() -> None:
    decision = decide(DAILY, LAST, at(6, 9), last_completed=LAST)
    assert decision is not None
    assert (decision.slot, decision.ask, decision.missed) == (at(6, 3), True, 5)
    # once asked, that slot is the one asked for last: nothing more until the next slot
    assert decide(DAILY, decision.slot, at(6, 9, 1), LAST) is None


def test_a_backup_completed_after_the_missed_slot_covers_it() -> None:
    decision = decide(DAILY, LAST, at(2, 9), last_completed=at(2, 4))
    assert decision is not None
    assert (decision.slot, decision.ask) == (at(2, 3), False)
    assert "completed after it" in decision.why
    # ... but a backup completed after an on-time slot does not cancel it (the schedule is the schedule)
    on_time = decide(DAILY, LAST, at(2, 3, 2), last_completed=at(2, 3, 1))
    assert on_time is not None
    assert on_time.ask


def test_a_month_of_hibernation_asks_one_backup_only_for_the_latest_slot() -> None:
    hourly = "0 * * * *"
    decision = decide(hourly, at(1, 3), at(31, 9, 30), last_completed=at(1, 3, 5))
    assert decision is not None
    assert (decision.slot, decision.ask) == (at(31, 9), True)
    assert decision.missed == 30 * 24 + 6  # counted for the Event, not each one backed up
    assert decide("not a cron", LAST, at(2, 9), None) is None


def _cluster(last_scheduled: str) -> dict[str, object]:
    return {"metadata": {"name": "shop"}, "status": {"phase": "Ready", "backup": {"lastScheduled": last_scheduled}}}


def test_the_schedule_step_names_the_made_up_backup_for_its_slot_and_records_a_covered_one_without_a_backup() -> None:
    made_up = wanted(_cluster("2026-12-01T03:00:00Z"), DAILY, at(4, 9), last_completed=LAST)
    assert made_up == Wanted("shop-202612040300", at(4, 3), "schedule", True, 3, "made up once")
    assert due(_cluster("2026-12-01T03:00:00Z"), DAILY, at(4, 9)) == ("shop-202612040300", at(4, 3), "schedule")
    covered = wanted(_cluster("2026-12-01T03:00:00Z"), DAILY, at(4, 9), last_completed=at(4, 5))
    assert covered is not None
    assert (covered.slot, covered.ask) == (at(4, 3), False)  # the step records the slot, creates nothing
