"""A failed base backup is tried again with exponential backoff, a bounded number of times; a refusal never is
(kanri.postgres.backup.retry)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kanri.postgres.backup.retry import DEFAULT, GiveUp, Retry, RetryPolicy, attempt_id, decide

NOW = datetime(2026, 12, 2, 15, 0, tzinfo=UTC)


def test_the_wait_doubles_from_the_base_up_to_the_cap() -> None:
    policy = RetryPolicy(base=timedelta(seconds=30), cap=timedelta(minutes=3), max_attempts=10)
    waits = [policy.delay(n).total_seconds() for n in range(1, 7)]
    assert waits == [30, 60, 120, 180, 180, 180]
    assert policy.delay(10_000) == timedelta(minutes=3)  # no overflow for a huge count


def test_a_transient_failure_is_retried_until_the_last_attempt() -> None:
    assert decide(DEFAULT, 1, "BackupFailed", NOW) == Retry(attempt=2, at=NOW + timedelta(seconds=30))
    assert decide(DEFAULT, 3, "InstanceUnreachable", NOW) == Retry(attempt=4, at=NOW + timedelta(minutes=2))
    last = decide(DEFAULT, DEFAULT.max_attempts, "BackupFailed", NOW)
    assert isinstance(last, GiveUp)
    assert f"all {DEFAULT.max_attempts} attempts failed" in last.why


def test_a_refusal_is_never_retried() -> None:
    refused = decide(DEFAULT, 1, "BackupRefused", NOW)
    assert isinstance(refused, GiveUp)
    assert "not retried" in refused.why


def test_one_attempt_means_no_retry() -> None:
    assert isinstance(decide(RetryPolicy(max_attempts=1), 1, "BackupFailed", NOW), GiveUp)


def test_each_attempt_has_its_own_key_and_the_first_keeps_the_old_one() -> None:
    uid = "3f16aad5-ac1d-4c6e-9d0b-2a1b3c4d5e6f"
    assert attempt_id(uid, 1) == uid
    assert attempt_id(uid, 2) == f"{uid}-a2"
    assert len(attempt_id(uid, 99)) <= 63  # what the instance accepts as a key
