"""The pure part of base backups (kanri.postgres.backup.plan): names, schedule slots, the one-at-a-time rule, the
choice of instance, the recovery window, and the summary behind status.backup and LastBackupSucceeded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kanri.cli.run import offset_clock
from kanri.postgres.backup import plan as backup_plan
from kanri.postgres.backup.plan import Done

Obj = dict[str, Any]
NOW = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)


def backup(name: str, created: str, phase: str | None = None, **status: Any) -> Obj:
    return {"metadata": {"name": name, "creationTimestamp": created}, "spec": {"cluster": "shop"},
            "status": {"phase": phase, **status} if phase else {}}  # fmt: skip


def test_names_are_deterministic_per_slot() -> None:
    assert backup_plan.initial_name("shop") == "shop-initial"
    assert backup_plan.scheduled_name("shop", datetime(2026, 12, 2, 3, 0, tzinfo=UTC)) == "shop-202612020300"
    assert backup_plan.idempotency_id("3F16AAD5-ac1d") == "3f16aad5-ac1d"


def test_the_latest_slot_is_the_last_cron_moment_after_the_one_asked_for_last() -> None:
    last = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
    assert backup_plan.latest_slot("0 3 * * *", last, NOW) == datetime(2026, 12, 2, 3, 0, tzinfo=UTC)
    assert backup_plan.latest_slot("0 3 * * *", datetime(2026, 12, 2, 3, 0, tzinfo=UTC), NOW) is None
    # a slot exactly now counts; missed slots are not made up (one backup for the latest)
    assert backup_plan.latest_slot("0 * * * *", last, NOW) == NOW
    assert backup_plan.latest_slot("not a cron", last, NOW) is None


def test_one_backup_at_a_time_the_running_one_then_the_oldest() -> None:
    a = backup("a", "2026-12-02T10:00:00Z", "Completed")
    b = backup("b", "2026-12-02T11:00:00Z", "Pending")
    c = backup("c", "2026-12-02T12:00:00Z")
    assert backup_plan.first_in_line([c, b, a]) is b
    running = backup("d", "2026-12-02T13:00:00Z", "Running")
    assert backup_plan.first_in_line([b, c, running]) is running
    assert backup_plan.first_in_line([a]) is None


def test_a_streaming_replica_is_chosen_before_the_primary() -> None:
    primary = {"name": "shop-1", "role": "Primary", "ready": True}
    replica = {"name": "shop-2", "role": "Replica", "ready": True, "lagBytes": 0}
    assert backup_plan.choose_source([primary, replica], "shop-1") == "shop-2"
    far = {**replica, "lagBytes": 1 << 30}
    assert backup_plan.choose_source([primary, far], "shop-1") == "shop-1"
    unreported = {"name": "shop-2", "role": "Replica", "ready": True}
    assert backup_plan.choose_source([primary, unreported], "shop-1") == "shop-1"
    assert backup_plan.choose_source([{**primary, "ready": False}], "shop-1") is None


def test_retention_keeps_the_window_and_its_base_and_always_the_newest() -> None:
    day = timedelta(days=1)
    old, base, inside = (Done("old", "1", NOW - 10 * day), Done("base", "2", NOW - 3 * day),
                         Done("inside", "3", NOW - day / 2))  # fmt: skip
    assert backup_plan.expired([inside, old, base], 2, NOW) == [old]
    # every backup older than the window: only the newest stays
    assert backup_plan.expired([old, base], 1, NOW) == [old]
    assert backup_plan.expired([old], 1, NOW) == []
    assert backup_plan.expired([old, base, inside], 30, NOW) == []


def test_the_summary_says_how_the_last_finished_backup_went() -> None:
    done = backup("a", "2026-12-02T10:00:00Z", "Completed", backupId="20261202T100000",
                  completedAt="2026-12-02T10:05:00Z")  # fmt: skip
    failed = backup("b", "2026-12-02T11:00:00Z", "Failed", reason="BackupFailed", message="barman exited 1",
                    completedAt="2026-12-02T11:01:00Z")  # fmt: skip
    summary = backup_plan.summary([done, failed])
    assert summary.last_successful == datetime(2026, 12, 2, 10, 5, tzinfo=UTC)
    assert summary.first_recoverability_point == summary.last_successful
    assert summary.last_failed == datetime(2026, 12, 2, 11, 1, tzinfo=UTC)
    assert summary.condition is not None
    assert summary.condition[:2] == (False, "BackupFailed")
    assert "barman exited 1" in summary.condition[2]
    again = backup("c", "2026-12-02T12:00:00Z", "Completed", backupId="20261202T120000",
                   completedAt="2026-12-02T12:05:00Z")  # fmt: skip
    assert backup_plan.summary([done, failed, again]).condition is not None
    assert backup_plan.summary([done, failed, again]).condition[:2] == (True, "Completed")  # type: ignore[index]
    assert backup_plan.summary([backup("d", "2026-12-02T13:00:00Z", "Running")]).condition is None


def test_the_clock_test_hook_adds_the_seconds_in_its_file(tmp_path: Path) -> None:
    path = tmp_path / "offset"
    now = offset_clock(path)
    assert abs((now() - datetime.now(UTC)).total_seconds()) < 5  # missing: no offset
    path.write_text("172800\n")
    assert abs((now() - datetime.now(UTC)).total_seconds() - 172800) < 5
