"""The topic logic's pure decisions: growth steps and their gates, the deletion gate, config drift, ownership."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from kanri.kafka.api import TOPIC_OWNED_KEYS, PartitionGrowth
from kanri.kafka.topics import deletion, growth
from kanri.kafka.topics.admin import GroupLag
from kanri.kafka.topics.drift import config_change
from kanri.kafka.topics.ownership import claimants, owner, topic_name

NOW = datetime(2026, 12, 6, 10, 0, tzinfo=UTC)
STEPS = PartitionGrowth(step_size=2, pause_seconds=30, max_lag=100)


def decide(current: int = 6, desired: int = 12, groups: tuple[GroupLag, ...] = (), key_ordered: bool = False,
           approval: str = "", last: datetime | None = None) -> growth.Grow | growth.Wait | None:  # fmt: skip
    return growth.decide(topic="orders", current=current, desired=desired, growth=STEPS, groups=groups,
                         key_ordered=key_ordered, approval=approval, last_step_time=last, now=NOW)  # fmt: skip


def test_growth_goes_one_step_at_a_time_and_stops_at_the_target() -> None:
    assert decide() == growth.Grow(8, "no consumer groups (maxLag 100)")
    assert decide(current=11) == growth.Grow(12, "no consumer groups (maxLag 100)")
    assert decide(current=12) is None
    assert decide(current=13) is None  # more than asked (made outside kanri): nothing to grow, never a shrink


def test_a_step_waits_for_the_pause_after_the_last_one() -> None:
    waiting = decide(last=NOW - timedelta(seconds=10))
    assert isinstance(waiting, growth.Wait)
    assert waiting.reason == "GrowthPaused"
    assert waiting.retry_after == pytest.approx(20)
    # the same wait seen a second later reads the same (a status that changes every pass is written every pass)
    later = growth.decide(
        topic="orders",
        current=6,
        desired=12,
        growth=STEPS,
        groups=(),
        key_ordered=False,
        approval="",
        last_step_time=NOW - timedelta(seconds=10),
        now=NOW + timedelta(seconds=1),
    )
    assert isinstance(later, growth.Wait)
    assert later.message == waiting.message, (later.message, waiting.message)
    assert isinstance(decide(last=NOW - timedelta(seconds=30)), growth.Grow)


def test_a_lagging_active_group_holds_the_step_and_an_idle_one_does_not() -> None:
    lagging = GroupLag("billing", "STABLE", lag=101, members=2)
    held = decide(groups=(lagging,))
    assert isinstance(held, growth.Wait)
    assert held.reason == "ConsumerLag"
    assert "billing lag 101" in held.message
    assert "maxLag 100" in held.message
    caught_up = decide(groups=(GroupLag("billing", "STABLE", lag=100, members=2),))
    assert isinstance(caught_up, growth.Grow)
    assert "billing STABLE members 2 lag 100" in caught_up.checks
    idle = decide(groups=(GroupLag("old-reports", "EMPTY", lag=5000, members=0),))
    assert isinstance(idle, growth.Grow)


@pytest.mark.parametrize("state", ["PREPARING_REBALANCE", "COMPLETING_REBALANCE", "UNKNOWN"])
def test_a_rebalancing_group_holds_the_step(state: str) -> None:
    held = decide(groups=(GroupLag("billing", state, lag=0, members=1),))
    assert isinstance(held, growth.Wait)
    assert held.reason == "GroupRebalancing"
    assert f"billing ({state})" in held.message


def test_a_key_ordered_topic_waits_for_an_approval_of_exactly_this_step() -> None:
    held = decide(key_ordered=True)
    assert isinstance(held, growth.Wait)
    assert held.reason == "ApprovalRequired"
    assert held.approval == "orders 6->8"
    assert "moves keys" in held.message
    assert isinstance(decide(key_ordered=True, approval="orders 6->8"), growth.Grow)
    stale = decide(current=8, key_ordered=True, approval="orders 6->8")  # an approval of the last step
    assert isinstance(stale, growth.Wait)
    assert stale.approval == "orders 8->10"


def test_the_lag_gate_comes_before_the_approval() -> None:
    held = decide(groups=(GroupLag("billing", "STABLE", lag=500, members=1),), key_ordered=True,
                  approval="orders 6->8")  # fmt: skip
    assert isinstance(held, growth.Wait)
    assert held.reason == "ConsumerLag"


def gate(**overrides: Any) -> deletion.Delete | deletion.Blocked | deletion.GiveUp:
    args: dict[str, Any] = dict(topic="orders", groups=[], retention_ms=3_600_000, newest_ms=None, approval="orders",
                                deleting_since=NOW - timedelta(seconds=5), timeout_seconds=3600, now=NOW)  # fmt: skip
    return deletion.decide(**(args | overrides))


def test_deletion_needs_no_lag_and_an_approval_naming_the_topic() -> None:
    assert gate() == deletion.Delete()
    unapproved = gate(approval="other")
    assert isinstance(unapproved, deletion.Blocked)
    assert unapproved.message == "deleting topic orders needs the annotation kafka.kanri.dev/approve-deletion=orders"
    newest = int(NOW.timestamp() * 1000) - 1000
    lagging = gate(groups=[GroupLag("billing", "EMPTY", lag=10)], newest_ms=newest)
    assert isinstance(lagging, deletion.Blocked)
    assert lagging.message == "consumer groups have unconsumed messages: billing (lag 10)"
    assert lagging.summary == ["consumer groups have unconsumed messages: billing"]


def test_lag_does_not_block_once_the_retention_window_has_passed() -> None:
    old = int(NOW.timestamp() * 1000) - 3_600_001
    assert gate(groups=[GroupLag("billing", "EMPTY", lag=10)], newest_ms=old) == deletion.Delete()
    forever = gate(groups=[GroupLag("billing", "EMPTY", lag=10)], newest_ms=old, retention_ms=-1)
    assert isinstance(forever, deletion.Blocked)
    assert deletion.retention_passed(1000, None, NOW)  # no message at all


def test_an_unreachable_cluster_blocks_then_the_operator_gives_up_and_keeps_the_topic() -> None:
    blocked = gate(groups=None, unreachable="KafkaCluster events is gone")
    assert isinstance(blocked, deletion.Blocked)
    assert "Kafka cannot be reached: KafkaCluster events is gone" in blocked.message
    late = gate(groups=None, unreachable="gone", deleting_since=NOW - timedelta(seconds=3600))
    assert isinstance(late, deletion.GiveUp)
    assert "the topic and its messages are kept" in late.message


def test_config_drift_is_set_back_and_extra_keys_dropped() -> None:
    change = config_change({"retention.ms": "1000", "cleanup.policy": "delete"},
                           {"retention.ms": "5", "segment.ms": "10", "cleanup.policy": "delete"})  # fmt: skip
    assert change.set == {"retention.ms": "1000"}
    assert change.remove == ["segment.ms"]
    assert change.keys() == ["retention.ms", "segment.ms"]
    assert not config_change({"a": "1"}, {"a": "1"})


def test_the_replication_throttle_the_operator_sets_is_no_drift() -> None:
    throttled = {"retention.ms": "5", "leader.replication.throttled.replicas": "*"}
    change = config_change({"retention.ms": "5"}, throttled, TOPIC_OWNED_KEYS)
    assert not change
    assert config_change({}, throttled, TOPIC_OWNED_KEYS).remove == ["retention.ms"]


def topic(name: str, created: str, uid: str, cluster: str = "events", topic_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"cluster": cluster, "partitions": 1} | ({"topicName": topic_name} if topic_name else {})
    return {"metadata": {"name": name, "creationTimestamp": created, "uid": uid}, "spec": spec}


def test_the_oldest_of_two_topics_naming_one_kafka_topic_owns_it() -> None:
    first = topic("orders", "2026-12-01T00:00:00Z", "b")
    second = topic("orders-copy", "2026-12-02T00:00:00Z", "a", topic_name="orders")
    elsewhere = topic("orders-x", "2026-11-01T00:00:00Z", "c", cluster="other", topic_name="orders")
    everyone = [second, elsewhere, first]
    assert owner(second, everyone) is first
    assert owner(first, everyone) is first
    assert [t["metadata"]["name"] for t in claimants(first, everyone)] == ["orders", "orders-copy"]
    assert topic_name(second) == "orders"
    tie = topic("orders-tie", "2026-12-01T00:00:00Z", "a", topic_name="orders")
    assert owner(first, [first, tie]) is tie  # same second: the uid decides, the same way every time


def test_within_one_second_the_topic_that_already_manages_it_wins() -> None:
    first = topic("orders", "2026-12-01T00:00:00Z", "z")
    first["status"] = {"topicName": "orders", "phase": "Ready"}
    second = topic("orders-copy", "2026-12-01T00:00:00Z", "a", topic_name="orders")
    assert owner(second, [first, second]) is first
    first["status"]["phase"] = "Conflict"
    assert owner(second, [first, second]) is second
