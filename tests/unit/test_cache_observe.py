"""What the operator concludes from its pods' reports: the primary, several primaries, readable replicas per
readPolicy, and a failover's possible loss."""

from __future__ import annotations

from datetime import UTC, datetime

from kanri.cache.agent.fencing import History
from kanri.cache.api import CacheSpec, ReadPolicy
from kanri.cache.observe import Lag, assess, failover_record, readable_replica, recorded_primary
from kanri.cache.steps import _readiness

OLD, NEW = "a" * 40, "b" * 40
HOST = "c-0.c-hl.ns.svc.cluster.local:6379"
PRIMARY_ONLY = ReadPolicy()
WITHIN_2S = ReadPolicy(serve_from="Replicas", max_lag_seconds=2)
WITHIN_100B = ReadPolicy(serve_from="Replicas", max_lag_bytes=100)


def primary(offset: int = 1000) -> History:
    return History("10.0.0.1", "primary", OLD, offset)


def replica(offset: int = 1000, link: bool = True, of: str = HOST) -> History:
    return History("10.0.0.2", "replica", OLD, offset, primary_host=of, link_up=link)


def test_one_primary_and_linked_replicas() -> None:
    seen = assess({"c-0": primary(), "c-1": replica(), "c-2": replica(link=False)}, {}, PRIMARY_ONLY)
    assert (seen.primary, seen.primaries, seen.linked) == ("c-0", ["c-0"], ["c-1"])


def test_two_primaries_name_none() -> None:
    seen = assess({"c-0": primary(), "c-1": History("x", "primary", NEW, 5)}, {}, PRIMARY_ONLY)
    assert seen.primary is None
    assert seen.primaries == ["c-0", "c-1"]
    assert seen.readable == []


def test_the_last_single_primary_stays_on_record_while_none_or_several_claim_it() -> None:
    # c-0 -> (c-0 and c-1 both primary for a moment) -> c-1: the record keeps c-0 through the moment, so the look
    # that sees c-1 alone finds a primary other than the one on record and records the failover
    both = assess({"c-0": primary(), "c-1": History("x", "primary", NEW, 5)}, {}, PRIMARY_ONLY)
    assert recorded_primary(both, "c-0") == "c-0"
    alone = assess({"c-0": replica(), "c-1": History("x", "primary", NEW, 5)}, {}, PRIMARY_ONLY)
    assert recorded_primary(alone, recorded_primary(both, "c-0")) == "c-1"
    assert recorded_primary(assess({"c-0": None}, {}, PRIMARY_ONLY), None) is None  # nothing known yet


def test_a_replica_of_another_primary_is_not_linked() -> None:
    seen = assess({"c-0": primary(), "c-1": replica(of="c-9.c-hl:6379")}, {}, PRIMARY_ONLY)
    assert seen.linked == []


def test_primary_policy_reads_from_the_primary_only() -> None:
    assert assess({"c-0": primary(), "c-1": replica()}, {"c-1": 0}, PRIMARY_ONLY).readable == ["c-0"]


def test_replicas_within_the_lag_serve_reads() -> None:
    pods = {"c-0": primary(1000), "c-1": replica(990), "c-2": replica(500)}
    assert assess(pods, {"c-1": 0, "c-2": 1}, WITHIN_100B).readable == ["c-1"]
    assert assess(pods, {"c-1": 1, "c-2": 5}, WITHIN_2S).readable == ["c-1"]


def test_no_replica_within_the_lag_sends_reads_to_the_primary() -> None:
    assert assess({"c-0": primary(1000), "c-1": replica(10)}, {}, WITHIN_100B).readable == ["c-0"]


def test_unknown_lag_seconds_is_not_within_a_bound() -> None:
    assert not readable_replica(WITHIN_2S, Lag(0, None))
    assert readable_replica(WITHIN_2S, Lag(0, 2))


def test_a_failover_records_what_the_old_primary_had_beyond_the_switch() -> None:
    promoted = History(
        "10.0.0.2", "primary", NEW, 50, replid2=OLD, second_offset=901
    )  # Valkey: its offset at the switch + 1
    record = failover_record("c-0", primary(1000), "c-1", promoted, datetime(2026, 1, 1, tzinfo=UTC))
    assert (record.from_pod, record.to_pod, record.possible_loss_bytes) == ("c-0", "c-1", 100)


def test_a_failover_without_a_last_look_has_unknown_loss() -> None:
    promoted = History(
        "10.0.0.2", "primary", NEW, 50, replid2=OLD, second_offset=901
    )  # Valkey: its offset at the switch + 1
    assert failover_record(None, None, "c-1", promoted, datetime.now(UTC)).possible_loss_bytes is None


def test_metrics_follow_the_status_and_go_with_the_cache() -> None:
    from prometheus_client import CollectorRegistry

    from kanri.cache.metrics import CacheMetrics

    registry = CollectorRegistry()
    metrics = CacheMetrics(registry)
    status = {"writablePrimaries": ["c-0", "c-1"], "readyReplicas": 1, "failovers": [{}],
              "conditions": [{"type": "Ready", "status": "False"}]}  # fmt: skip
    metrics.observe({"metadata": {"name": "c", "namespace": "ns"}, "status": status})
    labels = {"namespace": "ns", "cache": "c"}
    assert registry.get_sample_value("kanri_cache_cache_primaries", labels) == 2
    assert registry.get_sample_value("kanri_cache_cache_ready", labels) == 0
    metrics.forget("ns", "c")
    assert registry.get_sample_value("kanri_cache_cache_primaries", labels) is None


def test_a_replica_holding_replicated_writes_the_primary_lacks_is_ahead_and_the_cache_not_ready() -> None:
    """A stale replica promoted late (issue 31): the pod that holds the newest confirmed writes refuses to re-sync
    from it; the operator says so instead of calling the cache Ready."""
    ahead = History("10.0.0.3", "replica", OLD, 1500, primary_host=HOST, link_up=False)
    seen = assess({"c-0": primary(1000), "c-1": replica(1000), "c-2": ahead}, {}, PRIMARY_ONLY)
    assert seen.ahead == {"c-2": 500}
    ready, reason, message = _readiness(CacheSpec.model_validate({"dataPolicy": "Durable", "replicas": 3}), seen, 3)
    assert (ready, reason) == (False, "ReplicaAheadOfPrimary")
    assert "the primary c-0 lacks replicated writes that c-2 (500 bytes) hold(s)" in message
    # the primary before the last failover: its unconfirmed tail is that failover's recorded loss, not a replica ahead
    assert assess({"c-0": primary(1000), "c-2": ahead}, {}, PRIMARY_ONLY, former="c-2").ahead == {}
    # a replica behind, or one the primary holds, is not ahead
    assert assess({"c-0": primary(1000), "c-1": replica(900, link=False)}, {}, PRIMARY_ONLY).ahead == {}
