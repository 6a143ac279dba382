"""A KafkaCluster's health and a change of its replicas, decided (pure): offline partitions, brokers, the controller
quorum (DescribeQuorum v1 encoded and decoded here byte by byte), under-replicated partitions; a scale-down refused
while a node to remove holds replicas, any other change refused for the static voter list."""

from __future__ import annotations

import struct

import pytest

from kanri.kafka.cluster import health, quorum_wire, scale
from kanri.kafka.cluster.health import KafkaView, PartitionState
from kanri.kafka.cluster.quorum_wire import QuorumState, Replica
from kanri.kafka.topics.admin import AdminError

P = PartitionState
FULL = (P("orders", 0, 0, (0, 1, 2), (0, 1, 2)), P("orders", 1, 1, (1, 2, 0), (1, 2, 0)),
        P("__consumer_offsets", 0, 2, (2, 0, 1), (2, 0, 1)))  # fmt: skip
NOW = 1_800_000_000_000
Held = dict[int, int]


def quorum(*behind_ms: int, leader: int = 0) -> QuorumState:
    """Voter 0 leads; voter n (n >= 1) last caught up ``behind_ms[n-1]`` ms before the leader's now (-1: never
    fetched)."""
    voters = [Replica(0, 500, -1, NOW)]
    for n, behind in enumerate(behind_ms, start=1):
        if behind < 0:  # never fetched: the leader knows neither its end nor when it caught up
            voters.append(Replica(n, -1, -1, -1))
        else:
            voters.append(Replica(n, 500 - behind // 100, NOW - 10, NOW - behind))
    return QuorumState(leader, 3, 498, tuple(voters), ())


def test_a_healthy_cluster_is_ready_and_says_what_kafka_reports() -> None:
    verdict = health.verdict(KafkaView((0, 1, 2), FULL, quorum(100, 200)), 3, 3)
    assert verdict == health.Verdict(True, "BrokersReady", "3 of 3 brokers ready, 3 registered; 0 under-replicated "
                                     "and 0 offline partitions; quorum leader 0, 3 of 3 voters caught up")  # fmt: skip


def test_offline_partitions_come_first_and_are_named() -> None:
    lost = tuple(P("orders", n, -1, (2,), ()) for n in range(5))
    verdict = health.verdict(KafkaView((0, 1), FULL + lost, quorum(100, -1)), 3, 2)
    assert (verdict.ready, verdict.reason) == (False, "PartitionsOffline")
    assert verdict.message.startswith("5 partitions have no leader (reads and writes fail): orders-0, orders-1, "
                                      "orders-2 and 2 more (2 of 3 brokers ready")  # fmt: skip


@pytest.mark.parametrize(
    ("view", "ready_pods", "reason", "says"),
    [
        (KafkaView((0, 1, 2), FULL, quorum(100, 100)), 2, "BrokersNotReady", "2 of 3 brokers ready"),
        (KafkaView((0, 2), FULL, quorum(100, 100)), 3, "BrokersNotRegistered", "brokers 1 are not registered"),
        (KafkaView((0, 1, 2), FULL, quorum(100, 9000)), 3, "QuorumBehind", "not caught up with leader 0: 2 (lag 90)"),
        (KafkaView((0, 1, 2), FULL, quorum(100, -1)), 3, "QuorumBehind", "2 (lag unknown)"),
        (KafkaView((0, 1, 2), FULL, quorum(100, 100, leader=-1)), 3, "QuorumBehind", "has no leader"),
        (KafkaView((0, 1, 2), (P("orders", 0, 0, (0, 1, 2), (0, 1)),), quorum(100, 100)), 3, "UnderReplicated",
         "1 partitions have fewer in-sync replicas"),
    ],
)  # fmt: skip
def test_each_reason_not_to_be_ready(view: KafkaView, ready_pods: int, reason: str, says: str) -> None:
    verdict = health.verdict(view, 3, ready_pods)
    assert (verdict.ready, verdict.reason) == (False, reason)
    assert says in verdict.message


def test_a_quorum_not_read_does_not_hold_ready_but_is_said() -> None:
    verdict = health.verdict(KafkaView((0, 1, 2), FULL, None, "_TRANSPORT: refused"), 3, 3)
    assert verdict.ready
    assert verdict.message.endswith("; controller quorum not read: _TRANSPORT: refused")


def test_voters_caught_up_from_the_leaders_clock_with_their_lag() -> None:
    assert health.voters(quorum(4999, 5001)) == [health.Voter(0, True, 0), health.Voter(1, True, 49),
                                                health.Voter(2, False, 50)]  # fmt: skip


def test_replicas_held_by_each_node_count_every_topic() -> None:
    assert health.replicas_on(FULL, [2, 3]) == {2: 3, 3: 0}


# --- a change of replicas ----------------------------------------------------------------------------------------


def test_no_change_a_new_cluster_and_a_scale_up_take_spec_replicas() -> None:
    assert scale.decide(None, 5, None, 3) == scale.ScaleDecision(5)
    assert scale.decide(3, 3, {}, 3) == scale.ScaleDecision(3)
    assert scale.decide(3, 5, None, 3) == scale.ScaleDecision(5)  # broker-only nodes: the voters stay


def test_scale_down_refused_naming_each_broker_that_holds_replicas_and_the_drain_annotation() -> None:
    decision = scale.decide(6, 3, {3: 14, 4: 0, 5: 1}, 3)
    assert decision.replicas == 6
    assert decision.problem is not None
    assert decision.problem.reason == "ScaleDownRefused"
    assert decision.problem.message == "replicas 6 -> 3 is not applied: broker 3 holds 14 partition replicas, " \
        "broker 5 holds 1 partition replicas; removing it would remove that data. To move them off first, " \
        "annotate kafka.kanri.dev/drain-brokers=3,4,5"  # fmt: skip
    assert "docs/kafka.md#scaling" in (decision.problem.event or "")


def test_the_drain_annotation_naming_exactly_the_removed_brokers_keeps_them_while_they_are_drained() -> None:
    held = {3: 14, 4: 2}
    assert scale.decide(5, 3, held, 3, frozenset({3, 4})) == scale.ScaleDecision(5, draining=(3, 4))
    # an annotation naming other brokers drains nothing and says why
    wrong = scale.decide(5, 3, held, 3, frozenset({4}))
    assert (wrong.replicas, wrong.draining) == (5, ())
    assert wrong.problem is not None
    assert "the annotation names 4, not the brokers removed" in wrong.problem.message
    # once they hold nothing, the scale-down is applied (annotation or not)
    assert scale.decide(5, 3, {3: 0, 4: 0}, 3, frozenset({3, 4})) == scale.ScaleDecision(3)
    assert scale.parse_drain("3, 4") == frozenset({3, 4})
    assert scale.parse_drain("three") is None


def test_scale_down_refused_when_kafka_cannot_say_what_the_nodes_hold() -> None:
    decision = scale.decide(4, 3, None, 3)
    assert (decision.replicas, decision.problem and decision.problem.reason) == (4, "ScaleDownRefused")


@pytest.mark.parametrize(("current", "desired", "held"), [(3, 1, {1: 0, 2: 0}), (5, 2, {2: 0, 3: 0, 4: 0})])
def test_a_scale_down_into_the_controller_voters_is_refused(current: int, desired: int, held: dict[int, int]) -> None:
    decision = scale.decide(current, desired, held, 3, frozenset(held))
    assert decision.replicas == current
    assert decision.problem is not None
    assert decision.problem.reason == "VoterListFixed"
    assert "at least 3 replicas stay" in decision.problem.message
    assert f"set spec.replicas back to {current}" in decision.problem.message


# --- DescribeQuorum v1 on the wire --------------------------------------------------------------------------------


def _uvarint(value: int) -> bytes:
    assert value < 0x80
    return bytes([value])


def _replica_bytes(replica: Replica) -> bytes:
    return struct.pack(">iqqq", replica.node_id, replica.log_end_offset, replica.last_fetch_ms,
                       replica.last_caught_up_ms) + b"\x00"  # fmt: skip


def response_bytes(state: QuorumState, code: int = 0, partition_code: int = 0) -> bytes:
    """DescribeQuorumResponse v1 after its header, per the message schema: ErrorCode, Topics[TopicName,
    Partitions[PartitionIndex, ErrorCode, LeaderId, LeaderEpoch, HighWatermark, CurrentVoters, Observers]]."""
    voters = _uvarint(len(state.voters) + 1) + b"".join(_replica_bytes(r) for r in state.voters)
    observers = _uvarint(len(state.observers) + 1) + b"".join(_replica_bytes(r) for r in state.observers)
    partition = struct.pack(">ihiiq", 0, partition_code, state.leader_id, state.leader_epoch, state.high_watermark)
    partition += voters + observers + b"\x00"
    topic = _uvarint(len("__cluster_metadata") + 1) + b"__cluster_metadata" + _uvarint(2) + partition + b"\x00"
    return struct.pack(">h", code) + _uvarint(2) + topic + b"\x00"


def test_the_request_asks_for_partition_0_of_the_metadata_log_in_version_1() -> None:
    frame = quorum_wire._request(7, quorum_wire.describe_body())
    size, key, version, correlation = struct.unpack_from(">ihhi", frame)
    assert (size, key, version, correlation) == (len(frame) - 4, 55, 1, 7)
    assert frame.endswith(b"\x00\x02\x13__cluster_metadata\x02\x00\x00\x00\x00\x00\x00\x00")


def test_the_answer_is_decoded_with_voters_and_observers() -> None:
    state = QuorumState(1, 4, 1234, (Replica(0, 1230, NOW - 5, NOW - 5), Replica(1, 1234, -1, NOW)),
                        (Replica(5, 1200, NOW - 9, NOW - 800),))  # fmt: skip
    assert quorum_wire.parse_describe(response_bytes(state)) == state


@pytest.mark.parametrize(
    ("code", "partition_code", "name"), [(41, 0, "NOT_CONTROLLER"), (0, 3, "UNKNOWN_TOPIC_OR_PART")]
)
def test_an_error_in_the_answer_raises_by_name(code: int, partition_code: int, name: str) -> None:
    with pytest.raises(AdminError) as raised:
        quorum_wire.parse_describe(response_bytes(quorum(100), code, partition_code))
    assert raised.value.code == name
