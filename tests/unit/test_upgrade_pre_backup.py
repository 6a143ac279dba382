"""The pre-upgrade backup (issue 29 item 1): once an upgrade is approved the decision names the PostgresBackup the
operator creates, one per approval; a cluster without a repository says so and names the two ways on."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.backup.archiving import BackupSettings
from kanri.postgres.upgrade.machine import Observed, decide, failed, pre_upgrade_backup
from kanri.postgres.upgrade.step import repository_missing
from kanri.postgres.upgrade.versions import upgrade_verdict

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
APPROVED = Observed(running=14, version=15, approved=15, generation=3, ready=True, last_backup=None, record=None,
                    now=NOW, cluster="orders")  # fmt: skip
NAME = "orders-pre-upgrade-15-20261202120000"


def test_an_approval_asks_for_the_pre_upgrade_backup_named_after_it() -> None:
    decision = decide(APPROVED)
    assert decision.backup == NAME == pre_upgrade_backup("orders", 15, NOW)
    assert decision.action == "none"
    assert decision.record is not None
    assert decision.record["phase"] == "WaitingForPreconditions"
    assert f"taking the pre-upgrade backup {NAME}" in decision.record["message"]


def test_the_backup_is_asked_for_once_and_its_phase_is_the_gate() -> None:
    first = decide(APPROVED).record
    # a restarted operator: the record (approvedAt) is read back, the same name derived, the object found
    later = replace(APPROVED, record=first, now=NOW + timedelta(minutes=3))
    for phase in ("Pending", "Running"):
        waiting = decide(replace(later, backups={NAME: phase}, backups_in_flight=(NAME,)))
        assert waiting.backup is None
        assert waiting.record is not None
        assert f"the pre-upgrade backup {NAME} is {phase}" in waiting.record["message"]
        assert "has not finished" not in waiting.record["message"]  # not named twice
    done = decide(replace(later, backups={NAME: "Completed"}, last_backup=NOW + timedelta(minutes=2)))
    assert (done.action, done.backup) == ("check", None)


def test_a_failed_pre_upgrade_backup_is_not_retaken_behind_the_users_back() -> None:
    first = decide(APPROVED).record
    failed_backup = decide(replace(APPROVED, record=first, backups={NAME: "Failed"}))
    assert failed_backup.backup is None
    assert failed_backup.record is not None
    assert f"{NAME} failed" in failed_backup.record["message"]
    assert "delete it to take another" in failed_backup.record["message"]
    assert "spec.upgrade.withoutBackup: true" in failed_backup.record["message"]
    # deleted by the user: asked for again under the same approval
    assert decide(replace(APPROVED, record=first)).backup == NAME


def test_a_new_approval_after_a_failed_upgrade_takes_a_new_backup() -> None:
    checking = decide(replace(APPROVED, last_backup=NOW + timedelta(minutes=1))).record
    assert checking is not None
    record = failed(checking, "pg_upgrade --check failed", 3)
    later = NOW + timedelta(hours=1)
    again = decide(replace(APPROVED, generation=4, record=record, now=later, last_backup=NOW + timedelta(minutes=1),
                           backups={NAME: "Completed"}))  # fmt: skip
    assert again.backup == "orders-pre-upgrade-15-20261202130000"


def test_a_backup_completed_after_the_approval_by_anyone_is_enough() -> None:
    decision = decide(replace(APPROVED, last_backup=NOW + timedelta(seconds=30)))
    assert (decision.action, decision.backup) == ("check", None)


def test_without_a_repository_the_gate_names_both_ways_on_and_nothing_is_asked() -> None:
    decision = decide(replace(APPROVED, repository="NoRepository"))
    assert decision.backup is None
    assert decision.record is not None
    message = decision.record["message"]
    assert "no usable backup repository (NoRepository)" in message
    assert "configure spec.backup with a repository" in message
    assert "spec.upgrade.withoutBackup: true" in message
    verdict = upgrade_verdict(14, 15, 15, "spec.backup is not set")
    assert verdict.reason == "NoBackupRepository"
    assert "spec.upgrade.withoutBackup: true" in verdict.message
    assert verdict.warn
    assert upgrade_verdict(14, 15, 15).reason == "UpgradeApproved"
    assert upgrade_verdict(14, 15, None, "spec.backup is not set").reason == "UpgradeNotApproved"


def test_without_backup_drops_only_the_backup_gate() -> None:
    for repository in (None, "NoRepository"):
        decision = decide(replace(APPROVED, repository=repository, without_backup=True))
        assert (decision.action, decision.backup) == ("check", None)
    busy = decide(replace(APPROVED, without_backup=True, backups_in_flight=("orders-initial",)))
    assert busy.action == "none"
    assert busy.record is not None
    assert "base backup orders-initial has not finished" in busy.record["message"]


@dataclass
class _Pass:
    """The three things repository_missing reads of a pass."""

    spec: PostgresClusterSpec
    namespace: str = "shop"
    backup_settings: BackupSettings = field(default_factory=BackupSettings)


def _spec(**fields: Any) -> PostgresClusterSpec:
    return PostgresClusterSpec.model_validate({"version": 15, "storage": {"size": "1Gi"}, **fields})


def test_the_repository_the_pre_upgrade_backup_would_go_to_is_named_when_missing() -> None:
    approved = {"upgrade": {"approvedVersion": 15}}
    assert repository_missing(_Pass(_spec(**approved))) == "spec.backup is not set"  # type: ignore[arg-type]
    # backups asked for, but neither a repository of its own nor a platform default
    asked = _spec(backup={"retentionDays": 7}, **approved)
    assert repository_missing(_Pass(asked)) == "NoRepository"  # type: ignore[arg-type]
    platform = BackupSettings(default_repository=S3Repository.model_validate(
        {"bucket": "kanri-backups", "endpoint": "http://s3:8333", "credentialsSecret": {"name": "k"}}))  # fmt: skip
    assert repository_missing(_Pass(asked, backup_settings=platform)) is None  # type: ignore[arg-type]
    # approved without a backup: nothing is missing
    without = _spec(upgrade={"approvedVersion": 15, "withoutBackup": True})
    assert repository_missing(_Pass(without)) is None  # type: ignore[arg-type]
