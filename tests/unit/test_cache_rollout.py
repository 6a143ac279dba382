"""The rolling replace's decisions (kanri.cache.rollout.decide): replicas first and one at a time, each only once
every replica is in sync, a planned switchover before the primary's turn, a scale-down that never removes the
primary, and the StatefulSet's pod count that keeps the primary's pod until then."""

from __future__ import annotations

from kanri.cache.api import CacheSpec
from kanri.cache.observe import Assessment, Lag
from kanri.cache.rollout.decide import (
    IN_SYNC_BYTES,
    PodState,
    Replace,
    RolloutDecision,
    Switchover,
    Wait,
    decide,
)
from kanri.cache.rollout.step import statefulset_replicas, update_revision

OLD, NEW = "rev-old", "rev-new"


def pods(*revisions: str, terminating: int | None = None) -> list[PodState]:
    return [PodState(f"c-{i}", i, rev, terminating=i == terminating) for i, rev in enumerate(revisions)]


def what(decision: RolloutDecision) -> tuple[str, ...]:
    """The decision's kind and the pods it names (its reason aside)."""
    match decision:
        case Replace(pod=pod):
            return ("Replace", pod)
        case Switchover(primary=primary, candidates=candidates):
            return ("Switchover", primary, *candidates)
        case Wait():
            return ("Wait",)
    return ("Settled",)


def seen(primary: str, replicas: list[str], lag: int = 0, unlinked: tuple[str, ...] = ()) -> Assessment:
    linked = [name for name in replicas if name not in unlinked]
    return Assessment([primary], primary, linked, [primary], {name: Lag(lag, 0) for name in linked})


def test_replicas_go_first_highest_ordinal_first_then_a_switchover_then_the_old_primary() -> None:
    state = seen("c-0", ["c-1", "c-2"])
    assert what(decide(pods(OLD, OLD, OLD), NEW, state, 3)) == ("Replace", "c-2")
    assert what(decide(pods(OLD, OLD, NEW), NEW, state, 3)) == ("Replace", "c-1")
    assert what(decide(pods(OLD, NEW, NEW), NEW, state, 3)) == ("Switchover", "c-0", "c-1", "c-2")
    after = seen("c-1", ["c-0", "c-2"])
    assert what(decide(pods(OLD, NEW, NEW), NEW, after, 3)) == ("Replace", "c-0")
    assert what(decide(pods(NEW, NEW, NEW), NEW, after, 3)) == ("Settled",)


def test_one_pod_at_a_time_and_only_when_every_replica_is_in_sync() -> None:
    state = seen("c-0", ["c-1", "c-2"])
    assert isinstance(decide(pods(OLD, OLD, NEW, terminating=2), NEW, state, 3), Wait)
    catching_up = seen("c-0", ["c-1", "c-2"], lag=IN_SYNC_BYTES + 1)
    waiting = decide(pods(OLD, OLD, NEW), NEW, catching_up, 3)
    assert isinstance(waiting, Wait)
    assert "in sync" in waiting.reason
    # the new pod is not linked yet: the next replica waits for it
    assert isinstance(decide(pods(OLD, OLD, NEW), NEW, seen("c-0", ["c-1", "c-2"], unlinked=("c-2",)), 3), Wait)
    assert isinstance(decide(pods(OLD, OLD), NEW, state, 3), Wait), "a pod the StatefulSet has not made yet"


def test_nothing_is_replaced_without_one_primary_or_before_the_statefulset_saw_the_template() -> None:
    several = Assessment(["c-0", "c-1"], None, [], [])
    assert isinstance(decide(pods(OLD, OLD, OLD), NEW, several, 3), Wait)
    none = Assessment([], None, [], [])
    assert isinstance(decide(pods(OLD, OLD, OLD), NEW, none, 3), Wait)
    assert isinstance(decide(pods(OLD, OLD, OLD), None, seen("c-0", ["c-1", "c-2"]), 3), Wait)


def test_an_outdated_replica_that_replicates_from_nobody_is_replaced_at_once() -> None:
    state = seen("c-0", ["c-1", "c-2"], unlinked=("c-1",))
    assert what(decide(pods(NEW, OLD, NEW), NEW, state, 3)) == ("Replace", "c-1")
    # ... but never the primary, and not while no primary is known
    assert isinstance(decide(pods(OLD, OLD, NEW), NEW, Assessment([], None, [], []), 3), Wait)


def test_scale_down_switches_the_primary_off_a_leaving_pod_first() -> None:
    state = seen("c-2", ["c-0", "c-1"])
    assert what(decide(pods(OLD, OLD, OLD), NEW, state, 2)) == ("Replace", "c-1"), "staying replicas go first"
    switch = decide(pods(NEW, NEW, OLD), NEW, state, 2)
    assert what(switch) == ("Switchover", "c-2", "c-0", "c-1")
    assert "scale-down" in getattr(switch, "reason", "")
    # the primary stays: the leaving pods are the StatefulSet's to remove
    assert what(decide(pods(NEW, NEW, OLD), NEW, seen("c-0", ["c-1", "c-2"]), 2)) == ("Settled",)


def test_the_statefulset_keeps_the_primarys_pod_until_it_is_switched_over() -> None:
    spec = CacheSpec(data_policy="Regenerable", replicas=2)
    assert statefulset_replicas(spec, "c-4") == 5
    assert statefulset_replicas(spec, "c-1") == 2
    assert statefulset_replicas(spec, None) == 2


def test_a_single_regenerable_pod_is_replaced_in_place_and_scale_up_waits_for_the_new_pods() -> None:
    single = Assessment(["c-0"], "c-0", [], ["c-0"])
    assert isinstance(decide(pods(OLD), NEW, single, 1), Replace)
    grown = decide(pods(OLD), NEW, single, 3)
    assert isinstance(grown, Wait)
    assert "1 of 3" in grown.reason


def test_the_update_revision_counts_only_once_the_controller_observed_the_spec() -> None:
    sts = {"metadata": {"generation": 2}, "status": {"observedGeneration": 1, "updateRevision": OLD}}
    assert update_revision(sts) is None
    sts["status"] = {"observedGeneration": 2, "updateRevision": NEW}
    assert update_revision(sts) == NEW
    assert update_revision(None) is None


def test_planned_switchovers_are_not_counted_as_failovers_and_a_rollout_shows_as_updating() -> None:
    from prometheus_client import CollectorRegistry

    from kanri.cache.metrics import CacheMetrics

    registry = CollectorRegistry()
    metrics = CacheMetrics(registry)
    records = [{"reason": "observed by the operator: Sentinel promoted another pod"},
               {"reason": "planned switchover from c-0 to c-1: writes paused until it held them all"}]  # fmt: skip
    conditions = [{"type": "Updating", "status": "True"}, {"type": "Ready", "status": "True"}]
    metrics.observe({"metadata": {"name": "c", "namespace": "ns"},
                     "status": {"failovers": records, "conditions": conditions}})  # fmt: skip
    labels = {"namespace": "ns", "cache": "c"}
    assert registry.get_sample_value("kanri_cache_cache_recorded_failovers", labels) == 1
    assert registry.get_sample_value("kanri_cache_cache_updating", labels) == 1
    metrics.forget("ns", "c")
    assert registry.get_sample_value("kanri_cache_cache_updating", labels) is None


def test_sentinels_that_count_gone_peers_are_reset_one_at_a_time_and_never_mid_failover() -> None:
    from kanri.cache.rollout.sentinels import SentinelView, to_reset

    def view(sentinels: int, replicas: int = 2, primary: str = "c-0:6379", failing: bool = False) -> SentinelView:
        return SentinelView(primary, sentinels, replicas, failing)

    assert to_reset({"c-0": view(2), "c-1": view(2), "c-2": view(2)}, 3) is None, "nothing to forget"
    assert to_reset({"c-0": view(2), "c-1": view(4), "c-2": view(3)}, 3) == "c-1"
    # the one reset before still relearns its replicas: wait
    assert to_reset({"c-0": view(2, replicas=0), "c-1": view(4), "c-2": view(3)}, 3) is None
    assert to_reset({"c-0": view(4), "c-1": view(4), "c-2": None}, 3) is None, "a Sentinel does not answer"
    assert to_reset({"c-0": view(4), "c-1": view(4, primary="c-1:6379"), "c-2": view(2)}, 3) is None
    assert to_reset({"c-0": view(4, failing=True), "c-1": view(4), "c-2": view(2)}, 3) is None
