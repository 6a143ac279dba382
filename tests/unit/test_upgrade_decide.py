"""The major-upgrade decider (kanri.postgres.upgrade.machine.decide): every phase against the observations that move
it."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from kanri.postgres.upgrade.machine import Observed, decide, failed

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
BASE = Observed(running=14, version=15, approved=None, generation=3, ready=True, last_backup=None, record=None,
                now=NOW)  # fmt: skip


def test_nothing_is_recorded_while_version_is_the_data_major() -> None:
    assert decide(replace(BASE, version=14)).record is None
    assert decide(replace(BASE, version=14)).action == "none"


def test_a_raised_version_without_approval_waits_and_acts_on_nothing() -> None:
    for approved in (None, 16):
        decision = decide(replace(BASE, approved=approved))
        assert decision.action == "none"
        assert decision.record is not None
        assert decision.record["phase"] == "WaitingForApproval"
        assert "approvedVersion: 15" in decision.record["message"]
        assert decision.event is not None
        assert decision.event[0] == "UpgradeWaitingForApproval"
    again = decide(replace(BASE, record=decide(BASE).record))
    assert again.record == decide(BASE).record
    assert again.event is None


def test_approval_is_stamped_once_and_a_backup_from_before_it_does_not_count() -> None:
    first = decide(replace(BASE, approved=15, last_backup=NOW - timedelta(hours=1)))
    assert first.record is not None
    assert first.record["phase"] == "WaitingForPreconditions"
    assert first.record["approvedAt"] == "2026-12-02T12:00:00Z"
    assert "no base backup completed after the approval" in first.record["message"]
    later = replace(
        BASE, approved=15, record=first.record, now=NOW + timedelta(minutes=5), last_backup=NOW - timedelta(hours=1)
    )
    assert decide(later).record == first.record  # approvedAt kept: the clock moving on changes nothing
    backed_up = decide(replace(later, last_backup=NOW + timedelta(minutes=1)))
    assert backed_up.record is not None
    assert backed_up.record["phase"] == "Checking"
    assert backed_up.action == "check"
    assert backed_up.record["approvedAt"] == "2026-12-02T12:00:00Z"


def test_a_cluster_not_ready_is_a_named_gate() -> None:
    decision = decide(replace(BASE, approved=15, ready=False, last_backup=NOW + timedelta(minutes=1)))
    assert decision.record is not None
    assert decision.record["phase"] == "WaitingForPreconditions"
    assert decision.record["message"].endswith("waiting: the cluster is not Ready")
    assert decision.action == "none"


def test_checking_resumes_even_if_a_gate_closes_meanwhile() -> None:
    checking = decide(replace(BASE, approved=15, last_backup=NOW + timedelta(minutes=1))).record
    resumed = decide(replace(BASE, approved=15, ready=False, record=checking))
    assert resumed.action == "check"
    assert resumed.record == checking


def test_failed_is_left_only_by_a_spec_change() -> None:
    checking = decide(replace(BASE, approved=15, last_backup=NOW + timedelta(minutes=1))).record
    assert checking is not None
    record = failed(checking, "Checking for incompatible polymorphic functions  fatal", 3)
    same = decide(replace(BASE, approved=15, last_backup=NOW + timedelta(minutes=1), record=record))
    assert same.record == record
    assert same.action == "none"
    edited = decide(
        replace(
            BASE,
            approved=15,
            generation=4,
            last_backup=NOW + timedelta(minutes=1),
            record=record,
            now=NOW + timedelta(minutes=10),
        )
    )
    # approved anew: the backup taken before this approval no longer counts
    assert edited.record is not None
    assert edited.record["phase"] == "WaitingForPreconditions"
    assert edited.record["approvedAt"] == "2026-12-02T12:10:00Z"


def test_an_upgrade_under_way_is_resumed_and_never_re_decided() -> None:
    record = {"phase": "Upgrading", "from": 14, "to": 15, "generation": 3, "approvedAt": "2026-12-02T12:00:00Z"}
    decision = decide(replace(BASE, approved=None, ready=False, record=record))
    assert decision.action == "upgrade"
    assert decision.record == record


def test_a_record_for_another_target_starts_over() -> None:
    record = {"phase": "Failed", "from": 14, "to": 16, "generation": 3, "message": "x"}
    decision = decide(replace(BASE, record=record))
    assert decision.record is not None
    assert decision.record["phase"] == "WaitingForApproval"
    assert decision.record["to"] == 15


def test_succeeded_is_kept_once_the_data_is_on_the_new_major() -> None:
    record = {"phase": "Succeeded", "from": 14, "to": 15, "generation": 3}
    assert decide(replace(BASE, running=15, version=15, record=record)).record == record


def test_an_upgrade_under_way_is_finished_even_once_the_data_is_new_or_the_spec_changed() -> None:
    record = {"phase": "Upgrading", "step": "Starting", "from": 14, "to": 15, "generation": 3}
    # the primary's claim records 15 already: the running major is the target
    assert decide(replace(BASE, running=15, version=15, record=record)).action == "upgrade"
    # the user raised version again mid-way: the stopped cluster is brought up first, on 15
    moved = decide(replace(BASE, version=16, approved=16, record=record))
    assert (moved.action, moved.record) == ("upgrade", record)


def test_a_backup_in_flight_is_a_named_gate() -> None:
    approved = decide(replace(BASE, approved=15)).record
    after = NOW + timedelta(minutes=5)
    waiting = decide(replace(BASE, approved=15, record=approved, last_backup=after, now=after,
                             backups_in_flight=("up-before-15",)))  # fmt: skip
    assert waiting.record is not None
    assert waiting.action == "none"
    assert "base backup up-before-15 has not finished" in waiting.record["message"]
    free = decide(replace(BASE, approved=15, record=approved, last_backup=after, now=after))
    assert free.action == "check"
