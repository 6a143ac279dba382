"""Rolling restarts' pure decision: one broker at a time, the highest outdated node first, held while a broker is
not ready or while stopping the next one would take a partition under min.insync.replicas."""

from __future__ import annotations

from kanri.kafka.api import KafkaClusterSpec
from kanri.kafka.cluster.children import CONFIG_HASH, statefulset
from kanri.kafka.cluster.rolling import BrokerPod, Hold, PartitionIsr, Restart, next_restart, safe_to_stop


def pods(*current: bool, ready: tuple[bool, ...] = (True, True, True)) -> list[BrokerPod]:
    return [BrokerPod(f"events-{n}", n, ready[n], current[n]) for n in range(len(current))]


FULL = [PartitionIsr("orders", 0, (0, 1, 2), (0, 1, 2), 2), PartitionIsr("orders", 1, (1, 2, 0), (1, 2, 0), 2)]


def test_every_broker_on_the_current_template_needs_no_restart() -> None:
    assert next_restart(pods(True, True, True), FULL) is None


def test_the_highest_outdated_broker_goes_first_when_every_partition_keeps_its_minimum() -> None:
    assert next_restart(pods(False, False, True), FULL) == Restart("events-1", 1)


def test_one_at_a_time_a_restart_waits_for_every_broker_to_be_ready() -> None:
    held = next_restart(pods(False, True, True, ready=(True, True, False)), FULL)
    assert held == Hold("BrokerNotReady", "waiting for events-2 to be ready before the next restart")


def test_a_broker_whose_stop_would_take_a_partition_under_min_isr_is_held() -> None:
    shrunk = [PartitionIsr("orders", 0, (0, 1, 2), (0, 2), 2), *FULL[1:]]  # broker 1 is out of sync on orders-0
    held = next_restart(pods(True, True, False), shrunk)
    assert isinstance(held, Hold)
    assert held.reason == "MinInSyncReplicas"
    assert "stopping broker 2 would leave orders-0 (in sync: 2, min.insync.replicas 2)" in held.message
    assert safe_to_stop(1, shrunk) is None  # broker 1 is not in sync there: stopping it changes nothing


def test_partitions_no_wait_can_help_do_not_hold_a_restart() -> None:
    single = PartitionIsr("scratch", 0, (2,), (2,), 1)  # RF 1: down with its broker whenever it restarts
    strict = PartitionIsr("ledger", 0, (0, 1, 2), (0, 1, 2), 3)  # min.isr = RF: any restart stops writes
    under = PartitionIsr("late", 0, (0, 1, 2), (2,), 2)  # already under its minimum
    assert safe_to_stop(2, [single, strict, under]) is None


def test_a_hold_names_at_most_three_partitions_and_counts_the_rest() -> None:
    many = [PartitionIsr("t", n, (0, 1, 2), (0, 1), 2) for n in range(5)]
    reason = safe_to_stop(0, many)
    assert reason is not None
    assert "t-0" in reason
    assert "t-3" not in reason
    assert "and 2 more" in reason


def test_the_statefulset_is_rolled_by_the_operator_and_a_config_change_is_a_new_revision() -> None:
    spec = KafkaClusterSpec.model_validate({"storage": {"size": "1Gi"}})
    changed = KafkaClusterSpec.model_validate({"storage": {"size": "1Gi"}, "config": {"log.retention.hours": "100"}})
    before, after = statefulset("events", "shop", spec), statefulset("events", "shop", changed)
    assert before["spec"]["updateStrategy"] == {"type": "OnDelete"}  # the StatefulSet controller restarts nothing
    again = statefulset("events", "shop", spec)
    hashes = [sts["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH] for sts in (before, after, again)]
    assert hashes[0] != hashes[1]
    assert hashes[0] == hashes[2]
