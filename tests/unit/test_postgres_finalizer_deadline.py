"""The finalizer's deadline (kanri.postgres.backup.cleanup, issue 29 item 5): when a deleted cluster stops waiting for
its backups' deletion, what it says is left, and that no retry is scheduled past the deadline."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kanri.postgres.backup.archiving import BackupSettings
from kanri.postgres.backup.cleanup import FINALIZER_TIMEOUT, BackupCleanup, left_behind, timed_out

DELETED = datetime(2026, 12, 7, 10, 0, tzinfo=UTC)


def test_the_deadline_passes_only_after_the_timeout_from_the_deletion() -> None:
    assert not timed_out(DELETED, DELETED + timedelta(seconds=FINALIZER_TIMEOUT), FINALIZER_TIMEOUT)
    assert timed_out(DELETED, DELETED + timedelta(seconds=FINALIZER_TIMEOUT + 1), FINALIZER_TIMEOUT)
    assert not timed_out(None, DELETED + timedelta(days=9), FINALIZER_TIMEOUT)  # not being deleted: never


def test_what_is_left_names_the_prefix_the_reason_the_pods_and_the_manual_cleanup() -> None:
    text = left_behind("s3://b/pg/orders/", "b", "waited 1800 s: DeleteObjects refused", ["orders-1-0"])
    assert "s3://b/pg/orders/" in text
    assert "DeleteObjects refused" in text
    assert "pods still there: orders-1-0" in text
    assert "aws s3 rm --recursive s3://b/pg/orders/" in text
    assert "kubectl delete postgresbackup" in text
    assert "pods still there" not in left_behind("s3://b/pg/orders/", "b", "x", [])


def test_no_retry_is_scheduled_past_the_deadline() -> None:
    now = DELETED + timedelta(seconds=FINALIZER_TIMEOUT - 10)
    cleanup = BackupCleanup(BackupSettings, now=lambda: now)
    cluster = {"metadata": {"name": "orders", "deletionTimestamp": "2026-12-07T10:00:00Z"}}
    assert cleanup._before_deadline(cluster, 300.0) == 10.5  # a 5-minute backoff is cut to the deadline
    assert cleanup._before_deadline(cluster, 2.0) == 2.0
    assert cleanup._before_deadline({"metadata": {"name": "orders"}}, 300.0) == 300.0
