"""Failover messages that tell the truth (issue 29 item 13): the FailedOver and FailoverLossMeasured texts for each
case, the record never saying "loss possible" with a gap of 0, and a planned switchover read as SwitchingOver —
never FailingOver nor Degraded."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.cluster.status import Observation, compute_status
from kanri.postgres.ha.failover import Candidate, guard
from kanri.postgres.ha.loss import measured, promotion_loss, recorded_gap
from kanri.postgres.topology.plan import plan_instances
from kanri.postgres.topology.storage import StoragePlan

NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)


def test_the_promotion_never_says_up_to_none_bytes() -> None:
    unknown = promotion_loss("db-1", None, possible=True)
    assert "None" not in unknown
    assert unknown.startswith("possible data loss of unknown size: db-1's last WAL position was not known")
    assert "measured when it rejoins (status.lastFailover.divergedBytes)" in unknown


def test_a_gap_of_zero_as_last_seen_says_what_is_known() -> None:
    text = promotion_loss("db-1", 0, possible=True)
    assert text.startswith("possible data loss: the promoted replica had all of db-1's WAL as last seen")
    assert "0 bytes" not in text
    assert recorded_gap(0, possible=True) is None  # never dataLossPossible: true with lsnGapBytes: 0
    assert recorded_gap(0, possible=False) == 0
    assert recorded_gap(4096, possible=True) == 4096
    assert recorded_gap(None, possible=True) is None


def test_a_known_gap_is_a_lower_bound_and_sync_promises_no_loss() -> None:
    assert promotion_loss("db-1", 4096, possible=True).startswith(
        "possible data loss: the promoted replica lacked 4096 bytes of db-1's WAL as last seen"
    )
    assert promotion_loss("db-1", 4096, possible=False) == (
        "no acknowledged commit lost: a synchronous standby holding every acknowledged commit was promoted"
    )


def test_an_approved_async_promotion_with_no_gap_as_last_seen_still_says_loss_is_possible() -> None:
    candidates = [Candidate("db-2", "0/5000000", None), Candidate("db-3", "0/4000000", None)]
    common: dict[str, Any] = dict(primary_lsn="0/5000000", policy="Manual", max_data_loss_bytes=0,
                                  sync_standbys=1, standbys=2, approved="db-2")  # fmt: skip
    assert guard(candidates, sync_mode=False, **common).data_loss_possible
    # mode Sync with every standby heard: the best one holds every acknowledged commit
    assert not guard(candidates, sync_mode=True, **common).data_loss_possible
    assert guard(candidates, sync_mode=True, **{**common, "approved": "db-3"}).data_loss_possible


def test_the_measured_loss_says_wal_was_discarded_not_that_commits_were_lost() -> None:
    told = measured("db-1", 8192, "past 0/5000000", possible=True, estimated=None)
    assert told.warning
    assert (told.gap, told.possible) == (8192, True)
    assert told.message == (
        "db-1 had written 8192 bytes of WAL past 0/5000000 on its old timeline, discarded when it rejoined; commits "
        "in it may have been acknowledged to clients (asynchronous replication)"
    )
    assert "are lost" not in told.message
    sync = measured("db-1", 8192, "past 0/5000000", possible=False, estimated=0)
    assert sync.message.endswith("none of it was acknowledged: the promoted standby was synchronous; estimated at "
                                 "the promotion: 0 bytes")  # fmt: skip
    higher = measured("db-1", 100, "past 0/5000000", possible=True, estimated=4096)
    assert higher.gap == 4096
    assert higher.message.endswith("estimated at the promotion: 4096 bytes")


def test_nothing_measured_means_nothing_lost_and_no_loss_possible_any_more() -> None:
    told = measured("db-1", 0, "past 0/5000000", possible=True, estimated=None)
    assert not told.warning
    assert (told.gap, told.possible) == (0, False)
    assert told.message == "db-1 had written nothing past 0/5000000 on its timeline: the failover lost nothing"


def report(name: str, role: str = "replica", *, ready: bool = True) -> InstanceReport:
    return InstanceReport(name=name, role=role, ready=ready, running=True)


def observe(reports: dict[str, InstanceReport], primary: str, **extra: Any) -> Observation:
    plan = plan_instances("db", 3, ["db-1", "db-2", "db-3"], primary)
    return Observation(plan=plan, hibernated=False, generation=2, reports=reports, pods={}, storage=StoragePlan(),
                       **extra)  # fmt: skip


def test_a_planned_switchover_is_switching_over_not_failing_over_nor_degraded() -> None:
    progress = {"phase": "Promoting", "from": "db-1", "reason": "Switchover", "target": "db-3"}
    during = {"db-1": report("db-1", "replica", ready=False), "db-2": report("db-2"), "db-3": report("db-3")}
    status = compute_status({"phase": "Ready"}, observe(during, "db-1", failover=progress), NOW)
    assert status["phase"] == "SwitchingOver"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "False"
    # a failover stays one
    failing = {**progress, "reason": "PrimaryUnreachable"}
    assert compute_status({"phase": "Ready"}, observe(during, "db-1", failover=failing), NOW)["phase"] == "FailingOver"


def test_after_a_switchover_the_former_primary_coming_back_is_not_degraded_for_a_while() -> None:
    last = {"time": "2026-12-06T10:00:00Z", "from": "db-1", "to": "db-3", "reason": "Switchover",
            "dataLossPossible": False, "lsnGapBytes": 0}  # fmt: skip
    coming = {"db-1": report("db-1", ready=False), "db-2": report("db-2"), "db-3": report("db-3", "primary")}
    old = {"phase": "SwitchingOver", "lastFailover": last}
    status = compute_status(old, observe(coming, "db-3"), NOW + timedelta(seconds=5))
    assert status["phase"] == "SwitchingOver"
    assert next(c for c in status["conditions"] if c["type"] == "Degraded")["status"] == "False"
    back = {**coming, "db-1": report("db-1")}
    assert compute_status(old, observe(back, "db-3"), NOW + timedelta(seconds=6))["phase"] == "Ready"
    # still not back a minute later: that is degraded
    late = compute_status(old, observe(coming, "db-3"), NOW + timedelta(seconds=61))
    assert late["phase"] == "Degraded"
    # after a failover the former primary's absence is degraded at once
    failed = {**old, "lastFailover": {**last, "reason": "PrimaryUnreachable"}}
    assert compute_status(failed, observe(coming, "db-3"), NOW + timedelta(seconds=5))["phase"] == "Degraded"
