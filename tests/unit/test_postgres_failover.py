"""The failover decisions: when the primary counts as failed, which replica is chosen, and the RPO guard."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kanri.contract.status import Problem
from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.ha.failover import (
    LATE_PROBES,
    NOT_RUNNING_WINDOW,
    STARTING_GRACE,
    SUSPECT_INTERVAL,
    UNREACHABLE_WINDOW,
    Candidate,
    best_candidate,
    failure_of,
    gap_bytes,
    guard,
    heard,
    sync_quorum_heard,
    window,
)
from kanri.postgres.ha.rejoin import rejoining, withhold_rejoining

MIB = 1 << 20


def pod(phase: str = "Running", *, deleting: bool = False, started: bool = True) -> dict[str, Any]:
    state = {"running": {"startedAt": "2026-12-02T00:00:00Z"}} if started else {"waiting": {"reason": "Starting"}}
    meta: dict[str, Any] = {"name": "pg-1-0"}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
    return {"metadata": meta, "status": {"phase": phase, "containerStatuses": [{"name": "postgres", "state": state}]}}


def report(role: str = "primary", *, ready: bool = True, running: bool = True) -> InstanceReport:
    return InstanceReport(name="pg-1", role=role, ready=ready, running=running, timeline=1, write_lsn="0/3000000")


def test_a_healthy_primary_is_not_failed() -> None:
    assert failure_of(report(), pod()) is None


def test_no_answer_from_a_running_pod_is_unreachable_with_the_short_window() -> None:
    assert failure_of(None, pod()) == "PrimaryUnreachable"
    assert window("PrimaryUnreachable", 0) == UNREACHABLE_WINDOW
    assert window("PrimaryUnreachable", 10) == UNREACHABLE_WINDOW + 10


@pytest.mark.parametrize("the_pod", [None, pod(deleting=True), pod("Pending"), pod(started=False)])
def test_a_pod_being_recreated_gets_the_long_window(the_pod: dict[str, Any] | None) -> None:
    # The kubelet is restarting it in place: that is faster than a failover and loses nothing.
    assert failure_of(None, the_pod) == "PrimaryRestarting"
    assert window("PrimaryRestarting", 0) == NOT_RUNNING_WINDOW


def test_an_answering_manager_whose_postgres_is_down_or_in_recovery_is_not_running() -> None:
    assert failure_of(report(running=False, ready=False), pod()) == "PrimaryNotRunning"
    assert failure_of(report(ready=False), pod()) == "PrimaryNotRunning"
    assert failure_of(report("replica"), pod()) == "PrimaryNotRunning"


def test_a_primary_whose_data_directory_is_lost_is_failed_at_once() -> None:
    # Issue 29 item 5: its volume came back empty; it reports DataDirectoryLost and waits (it never runs initdb).
    # No restart in place brings the data back, so no 30 s window: only the spec's delay.
    lost = InstanceReport(name="pg-1", role="unknown", ready=False, running=False,
                          problems=(Problem("DataDirectoryLost", "the data directory is empty"),))  # fmt: skip
    assert failure_of(lost, pod()) == "PrimaryDataLost"
    assert window("PrimaryDataLost", 0) == 0
    assert window("PrimaryDataLost", 15) == 15
    other = InstanceReport(name="pg-1", role="primary", ready=False, running=False,
                           problems=(Problem("InvalidParameter", "work_mem"),))  # fmt: skip
    assert failure_of(other, pod()) == "PrimaryNotRunning"


def test_the_highest_received_lsn_wins_then_replayed_then_the_lowest_number() -> None:
    a = Candidate("pg-2", "0/5000000", "0/4000000")
    b = Candidate("pg-3", "0/5000000", "0/4800000")
    c = Candidate("pg-4", "0/4FFFFFF", "0/4FFFFFF")
    assert best_candidate([a, b, c]) == b
    tie = Candidate("pg-5", "0/5000000", "0/4800000")
    assert best_candidate([tie, b]) == b
    assert best_candidate([]) is None


def test_the_gap_is_measured_against_the_primary_as_last_seen() -> None:
    assert gap_bytes("0/5000000", Candidate("pg-2", "0/4000000", None)) == 16 * MIB
    assert gap_bytes("0/4000000", Candidate("pg-2", "0/5000000", None)) == 0
    assert gap_bytes(None, Candidate("pg-2", "0/5000000", None)) is None


def decide(candidates: list[Candidate], **overrides: Any) -> Any:
    arguments: dict[str, Any] = dict(primary_lsn="0/5000000", policy="Automatic", max_data_loss_bytes=16 * MIB,
                                     sync_mode=False, sync_standbys=0, standbys=2, approved=None)  # fmt: skip
    arguments.update(overrides)
    return guard(candidates, **arguments)


def test_async_within_the_limit_promotes_and_says_loss_is_possible() -> None:
    decision = decide([Candidate("pg-2", "0/4800000", None), Candidate("pg-3", "0/4000000", None)])
    assert decision.blocked is None
    assert decision.candidate is not None
    assert decision.candidate.name == "pg-2"
    assert decision.gap == 8 * MIB
    assert decision.data_loss_possible  # the primary may have written after it was last seen


def test_async_above_the_limit_blocks_with_the_candidate_and_gap_named() -> None:
    decision = decide([Candidate("pg-2", "0/3000000", None)], max_data_loss_bytes=MIB)
    assert decision.blocked == "DataLossAboveLimit"
    assert decision.candidate is not None
    assert decision.candidate.name == "pg-2"
    assert decision.gap == 32 * MIB
    assert "pg-2" in decision.message
    assert str(32 * MIB) in decision.message
    assert "kanri.dev/approve-failover=pg-2" in decision.message


def test_an_unknown_primary_position_blocks_in_async_mode() -> None:
    decision = decide([Candidate("pg-2", "0/3000000", None)], primary_lsn=None)
    assert decision.blocked == "DataLossUnknown"


def test_manual_policy_always_asks() -> None:
    decision = decide([Candidate("pg-2", "0/5000000", None)], policy="Manual")
    assert decision.blocked == "ManualPolicy"


def test_approval_promotes_the_named_candidate_even_above_the_limit() -> None:
    candidates = [Candidate("pg-2", "0/3000000", None), Candidate("pg-3", "0/2000000", None)]
    decision = decide(candidates, max_data_loss_bytes=0, approved="pg-3")
    assert decision.blocked is None
    assert decision.approved
    assert decision.candidate is not None
    assert decision.candidate.name == "pg-3"
    # An approval naming no candidate approves nothing.
    assert decide(candidates, max_data_loss_bytes=0, approved="pg-9").blocked == "DataLossAboveLimit"


def test_no_candidate_blocks() -> None:
    assert decide([]).blocked == "NoCandidate"


def test_sync_mode_promotes_without_loss_once_enough_standbys_answered() -> None:
    # ANY 1 of 2 standbys: every acknowledged commit is on at least one, so both must answer.
    both = [Candidate("pg-2", "0/4000000", None), Candidate("pg-3", "0/4800000", None)]
    decision = decide(both, sync_mode=True, sync_standbys=1, standbys=2, max_data_loss_bytes=0)
    assert decision.blocked is None
    assert not decision.data_loss_possible
    assert decision.candidate is not None
    assert decision.candidate.name == "pg-3"
    one = decide(both[:1], sync_mode=True, sync_standbys=1, standbys=2, max_data_loss_bytes=0)
    assert one.blocked == "NoSynchronousStandby"


def test_the_sync_quorum_arithmetic() -> None:
    assert sync_quorum_heard(standbys=1, required=1, heard=1)
    assert not sync_quorum_heard(standbys=2, required=1, heard=1)
    assert sync_quorum_heard(standbys=2, required=2, heard=1)
    assert sync_quorum_heard(standbys=4, required=2, heard=3)
    assert not sync_quorum_heard(standbys=4, required=2, heard=2)


def test_a_former_primary_never_counts_as_primary_until_it_rejoined() -> None:
    claims: dict[str, dict[str, Any]] = {
        "pg-1": {"metadata": {"name": "pg-1", "annotations": {"kanri.dev/rejoin": "2"}}},
        "pg-2": {"metadata": {"name": "pg-2"}},
    }
    marked = rejoining(claims)
    assert marked == {"pg-1": 2}
    reports = {"pg-1": report("primary"), "pg-2": report("primary")}
    withheld = withhold_rejoining(reports, marked)
    assert withheld["pg-1"].fenced
    assert not withheld["pg-2"].fenced
    as_replica = withhold_rejoining({"pg-1": report("replica")}, marked)
    assert not as_replica["pg-1"].fenced


def test_a_late_answer_moves_the_suspicion_to_when_its_probe_was_sent() -> None:
    # starved, not dead: the manager ran after the probe was sent, so the silence is counted from then
    assert heard(("pg-1", 100.0), "pg-1", 103.5) == ("pg-1", 103.5)


@pytest.mark.parametrize(
    "suspect",
    [None, ("pg-2", 100.0), ("pg-1", 104.0)],
    ids=["recovered-or-failover-begun", "another-primary", "suspected-after-the-probe"],
)
def test_a_late_answer_moves_nothing_when_there_is_no_older_suspicion_of_that_primary(
    suspect: tuple[str, float] | None,
) -> None:
    assert heard(suspect, "pg-1", 103.5) is None


def test_a_late_probe_may_take_the_whole_window_so_a_frozen_primary_still_fails_over_on_time() -> None:
    # A probe sent after a freeze is never answered: the suspicion keeps its start, the window is unchanged.
    assert window("PrimaryUnreachable", 0) == UNREACHABLE_WINDOW
    assert LATE_PROBES * SUSPECT_INTERVAL >= UNREACHABLE_WINDOW  # one probe a pass is in flight over the window


def test_the_finished_event_is_derived_from_the_record_alone() -> None:
    # issue 29 item 3: a later pass posts it from status.lastFailover when the operator that wrote it was killed
    from kanri.postgres.ha.announce import finished_event

    base = {"time": "2026-12-06T12:00:00Z", "from": "pg-1", "to": "pg-2", "timeline": 3}
    kind, reason, message = finished_event({**base, "reason": "NodeMaintenance"})
    assert (kind, reason) == ("Normal", "SwitchedOver")
    assert message == "pg-2 is the primary (timeline 3); pg-1 follows it as a replica, and its node can be " \
                      "drained (NodeMaintenance)"  # fmt: skip
    _, _, message = finished_event({**base, "reason": "RollingUpdate"})
    assert message.endswith("follows it as a replica, and is updated next (RollingUpdate)")
    kind, reason, message = finished_event({**base, "reason": "PrimaryUnreachable", "dataLossPossible": True})
    assert (kind, reason) == ("Warning", "FailedOver")
    assert "possible data loss of unknown size" in message
    _, reason, _ = finished_event({**base, "to": "pg-1", "reason": "SwitchoverAbandoned"})
    assert reason == "PrimaryRestored"


def test_a_primary_whose_container_has_only_just_started_counts_as_restarting() -> None:
    # A woken or restarted pod's instance manager may take seconds to answer on a loaded machine: not a failure yet.
    started = datetime(2026, 12, 2, tzinfo=UTC)  # the pod() helper's startedAt
    assert failure_of(None, pod(), started + timedelta(seconds=5)) == "PrimaryRestarting"
    assert failure_of(None, pod(), started + timedelta(seconds=STARTING_GRACE)) == "PrimaryUnreachable"
    assert failure_of(None, pod()) == "PrimaryUnreachable"  # no clock given: as before
    assert failure_of(report(), pod(), started + timedelta(seconds=1)) is None  # an answer is an answer
