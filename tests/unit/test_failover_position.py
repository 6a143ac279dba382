"""The failed primary's last known position (kanri.postgres.ha.position) and the RPO guard fed with it: the
operator's memory, the replicas' evidence after an operator restart, and when neither bounds the loss."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from kanri.contract.status import InstanceStatus, Upstream
from kanri.postgres.ha.failover import Candidate, guard
from kanri.postgres.ha.loss import promotion_loss
from kanri.postgres.ha.position import (
    EVIDENCE_WINDOW,
    NODE_GRACE,
    NODE_HEARTBEAT,
    LastPosition,
    Witness,
    anchor,
    last_position,
    node_silence,
    witnesses,
)


def witness(name: str, position: str, streaming: float, timeline: int | None = 1) -> Witness:
    return Witness(name, position, timeline, streaming_seconds=streaming, heard_seconds=streaming)


def decide(known: LastPosition, received: str = "0/3000040", limit: int = 1024) -> object:
    return guard([Candidate("pg-2", received, received)], primary_lsn=known.lsn, policy="Automatic",
                 max_data_loss_bytes=limit, sync_mode=False, sync_standbys=0, standbys=2, approved=None,
                 evidence=known.evidence)  # fmt: skip


def test_fresh_evidence_bounds_the_loss_and_the_async_guard_promotes_with_that_gap() -> None:
    # The replica lost the primary 3 s after the operator first missed it (a receiver notices within ~6 s).
    known = last_position(None, [witness("pg-2", "0/3000100", streaming=4.0)], timeline=1, watched=7.0)
    assert (known.lsn, known.source) == ("0/3000100", "Replicas")
    decision = decide(known)
    assert decision.blocked is None  # type: ignore[attr-defined]
    assert decision.gap == 0xC0  # type: ignore[attr-defined]
    assert decision.data_loss_possible is True  # type: ignore[attr-defined]


def test_evidence_within_one_detection_window_before_the_failure_still_counts() -> None:
    known = last_position(None, [witness("pg-2", "0/3000100", streaming=7.0 + EVIDENCE_WINDOW)], timeline=1,
                          watched=7.0)  # fmt: skip
    assert known.source == "Replicas"


def test_stale_evidence_leaves_the_position_unknown_and_the_block_names_its_age() -> None:
    known = last_position(None, [witness("pg-2", "0/3000100", streaming=127.0)], timeline=1, watched=7.0)
    assert (known.lsn, known.source) == (None, None)
    decision = decide(known)
    assert decision.blocked == "DataLossUnknown"  # type: ignore[attr-defined]
    message = decision.message  # type: ignore[attr-defined]
    assert "pg-2 heard WAL end 0/3000100 (last streamed 120 s before it was found failed)" in message
    assert f"older than {EVIDENCE_WINDOW:.0f} s" in message
    assert "kanri.dev/approve-failover=pg-2" in message


def test_no_evidence_at_all_blocks_and_says_so() -> None:
    known = last_position(None, [], timeline=1, watched=7.0)
    assert known.lsn is None
    decision = decide(known)
    assert decision.blocked == "DataLossUnknown"  # type: ignore[attr-defined]
    assert "no replica reported evidence of its WAL end on timeline 1" in decision.message  # type: ignore[attr-defined]


def test_a_gap_above_the_limit_blocks_as_with_the_operators_memory() -> None:
    known = last_position(None, [witness("pg-2", "0/3100000", streaming=2.0)], timeline=1, watched=7.0)
    decision = decide(known, limit=1024)
    assert decision.blocked == "DataLossAboveLimit"  # type: ignore[attr-defined]
    assert decision.gap == 0x3100000 - 0x3000040  # type: ignore[attr-defined]


def test_the_higher_of_memory_and_evidence_wins() -> None:
    fresh = [witness("pg-2", "0/3000100", streaming=2.0)]
    assert last_position("0/3000080", fresh, timeline=1, watched=7.0) == LastPosition(
        "0/3000100", "Replicas", "pg-2 heard WAL end 0/3000100 (last streamed 5 s after it was found failed)"
    )
    assert last_position("0/3000200", fresh, timeline=1, watched=7.0).source == "Memory"
    assert last_position("0/3000200", fresh, timeline=1, watched=7.0).lsn == "0/3000200"
    # stale evidence never lowers nor replaces the memory
    assert last_position("0/3000080", [witness("pg-2", "0/3000900", 300.0)], timeline=1, watched=7.0).lsn == (
        "0/3000080"
    )


def test_the_highest_position_counts_once_one_replica_is_fresh() -> None:
    # Any replica's evidence is a lower bound of the primary's position; the freshest one bounds what came after.
    found = [witness("pg-2", "0/3000300", streaming=60.0), witness("pg-3", "0/3000100", streaming=2.0)]
    assert last_position(None, found, timeline=1, watched=7.0).lsn == "0/3000300"


def test_evidence_of_another_timeline_says_nothing_about_this_primary() -> None:
    known = last_position(None, [witness("pg-2", "0/3000900", streaming=2.0, timeline=1)], timeline=2, watched=7.0)
    assert known.lsn is None
    assert "no replica reported evidence of its WAL end on timeline 2" in known.evidence
    # the cluster's timeline unknown: the newest timeline among the evidence
    found = [witness("pg-2", "0/3000900", 2.0, timeline=1), witness("pg-3", "0/3000100", 2.0, timeline=2)]
    assert last_position(None, found, timeline=None, watched=7.0).lsn == "0/3000100"


def test_witnesses_are_the_replicas_that_reported_evidence() -> None:
    upstream = Upstream(position="0/3000100", timeline=1, heard_seconds=3.0, streaming_seconds=1.5)
    reports = {
        "pg-1": InstanceStatus(name="pg-1", role="primary", upstream=upstream),  # a primary's memory is not evidence
        "pg-2": InstanceStatus(name="pg-2", role="replica", upstream=upstream),
        "pg-3": InstanceStatus(name="pg-3", role="replica"),  # an older instance manager: no evidence
    }
    assert witnesses(reports, "pg-1") == [Witness("pg-2", "0/3000100", 1, streaming_seconds=1.5, heard_seconds=3.0)]


def test_the_failed_over_event_says_who_last_saw_the_position() -> None:
    by_replicas = promotion_loss("pg-1", 192, True, "Replicas", "pg-3 heard WAL end 0/3000100 (still streaming)")
    assert "lacked 192 bytes of pg-1's WAL as last seen by the replicas (pg-3 heard WAL end 0/3000100" in by_replicas
    assert "as the operator last saw it" in promotion_loss("pg-1", 192, True, "Memory")
    assert "as last seen;" in promotion_loss("pg-1", 192, True)  # a record from before the source was kept


def test_a_node_silent_long_before_the_operator_came_back_anchors_the_evidence() -> None:
    # The operator came back 5 minutes after the node stopped; the replicas lost the primary as it did.
    found = [witness("pg-2", "0/3000100", streaming=295.0)]
    known = last_position(None, found, timeline=1, watched=7.0, node_silent=300.0)
    assert (known.lsn, known.source) == ("0/3000100", "Replicas")
    assert "last streamed 5 s after its node last renewed its Lease" in known.evidence
    # without the node's Lease the same evidence is too old: the primary may have run on, cut off from its replicas
    assert last_position(None, found, timeline=1, watched=7.0).lsn is None


def test_a_node_that_still_renews_its_lease_proves_nothing() -> None:
    # The replicas lost the primary 5 minutes ago, but its node is alive: it may have written all along.
    known = last_position(None, [witness("pg-2", "0/3000100", streaming=300.0)], timeline=1, watched=7.0,
                          node_silent=3.0)  # fmt: skip
    assert known.lsn is None
    assert "older than 6 s before it was found failed" in known.evidence


def test_replicas_that_lost_the_primary_long_before_its_node_went_silent_do_not_bound_it() -> None:
    known = last_position(None, [witness("pg-2", "0/3000100", streaming=600.0)], timeline=1, watched=7.0,
                          node_silent=300.0)  # fmt: skip
    assert known.lsn is None
    assert "last streamed 300 s before its node last renewed its Lease" in known.evidence
    assert anchor(7.0, 300.0) == (300.0, "its node last renewed its Lease")
    assert anchor(7.0, 7.0 + NODE_HEARTBEAT) == (7.0, "it was found failed")  # no renewal missed: nothing known
    assert anchor(7.0, None) == (7.0, "it was found failed")


NOW = datetime(2026, 12, 7, 1, 0, 0, tzinfo=UTC)


def node(status: str, reason: str, marked_ago: float) -> dict[str, Any]:
    marked = (NOW - timedelta(seconds=marked_ago)).isoformat().replace("+00:00", "Z")
    ready = {"type": "Ready", "status": status, "reason": reason, "lastTransitionTime": marked}
    return {"metadata": {"name": "node-1"}, "status": {"conditions": [ready]}}


def test_a_node_marked_unknown_last_renewed_its_lease_at_least_the_grace_before() -> None:
    assert node_silence(node("Unknown", "NodeStatusUnknown", 260.0), NOW) == 260.0 + NODE_GRACE
    # the cluster's own grace (kanri run --node-monitor-grace 50): the last heartbeat was at least that long before
    assert node_silence(node("Unknown", "NodeStatusUnknown", 260.0), NOW, 50.0) == 310.0
    # Ready, or not ready for another reason (its kubelet still reports): nothing is known of its silence
    assert node_silence(node("True", "KubeletReady", 260.0), NOW) is None
    assert node_silence(node("False", "KubeletNotReady", 260.0), NOW) is None
    assert node_silence({"status": {}}, NOW) is None
    assert node_silence(None, NOW) is None
    assert node_silence({"status": {"conditions": [{"type": "Ready", "status": "Unknown",
                                                    "reason": "NodeStatusUnknown"}]}}, NOW) is None  # fmt: skip
