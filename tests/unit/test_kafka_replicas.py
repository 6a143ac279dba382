"""Replication-factor changes: the pure decision (where replicas go, what is done) and the reassignment requests'
encoding (checked against hand-built answers in Kafka's flexible wire format)."""

from __future__ import annotations

import struct
from collections import Counter

import pytest

from kanri.kafka.topics import reassign_wire, replicas
from kanri.kafka.topics.admin import AdminError


def test_an_increase_keeps_every_replica_and_the_leader_and_spreads_the_new_ones() -> None:
    current = {p: [p % 3] for p in range(6)}  # RF 1 over brokers 0, 1, 2
    target = replicas.target_assignment(current, [0, 1, 2], 3)
    assert all(target[p][0] == current[p][0] for p in current)  # the preferred leader does not move
    assert all(sorted(held) == [0, 1, 2] for held in target.values())
    two = replicas.target_assignment({p: [0] for p in range(6)}, [0, 1, 2], 2)  # every leader on broker 0
    assert Counter(held[1] for held in two.values()) == {1: 3, 2: 3}  # the second copies split evenly


def test_a_decrease_drops_the_last_replicas_and_keeps_the_leader() -> None:
    target = replicas.target_assignment({0: [2, 0, 1], 1: [1, 2, 0]}, [0, 1, 2], 2)
    assert target == {0: [2, 0], 1: [1, 2]}


def test_replicas_on_a_broker_that_is_gone_are_replaced() -> None:
    assert replicas.target_assignment({0: [5, 1]}, [0, 1, 2], 2)[0][0] == 1


def test_progress_counts_done_partitions_and_moves_only_the_idle_ones() -> None:
    current = {0: [0, 1, 2], 1: [1, 2, 0], 2: [2], 3: [0]}
    progress = replicas.progress(current, {1}, [0, 1, 2], 3)  # partition 1 is being moved (it lists its targets)
    assert (progress.done, progress.total, progress.moving) == (1, 4, 1)
    assert sorted(progress.to_move) == [2, 3]
    assert progress.to_move[2][0] == 2
    assert len(progress.to_move[3]) == 3
    assert not progress.finished
    done = replicas.progress({0: [0, 1, 2]}, set(), [0, 1, 2], 3)
    assert done.finished
    assert done.to_move == {}


def test_more_replicas_than_brokers_is_refused_with_a_reason() -> None:
    message = replicas.too_many(4, 3, "orders", "events")
    assert message is not None
    assert "replicationFactor 4 is more than the 3 brokers of cluster events" in message
    assert replicas.too_many(3, 3, "orders", "events") is None
    with pytest.raises(ValueError, match="3 replicas on 2 brokers"):
        replicas.target_assignment({0: [0]}, [0, 1], 3)


def _compact(text: str | None) -> bytes:
    return b"\x00" if text is None else bytes([len(text) + 1]) + text.encode()


def test_the_reassignment_requests_and_answers_use_the_flexible_format() -> None:
    body = reassign_wire.alter_body("t", {0: [0, 1]}, 1000)
    # timeout, 1 topic, name, 1 partition, index 0, 2 replicas, tags
    assert body == struct.pack(">i", 1000) + b"\x02" + _compact("t") + b"\x02" + struct.pack(">i", 0) + b"\x03" + \
        struct.pack(">ii", 0, 1) + b"\x00" + b"\x00" + b"\x00"  # fmt: skip
    refused = struct.pack(">ih", 0, 0) + _compact(None) + b"\x02" + _compact("t") + b"\x03" + \
        struct.pack(">ih", 0, 0) + _compact(None) + b"\x00" + struct.pack(">ih", 1, 39) + _compact("bad") + \
        b"\x00" + b"\x00" + b"\x00"  # fmt: skip
    errors = reassign_wire.parse_alter(refused)
    assert list(errors) == [1]
    assert errors[1].code == "INVALID_REPLICA_ASSIGNMENT"
    assert not errors[1].retriable
    moving = struct.pack(">ih", 0, 0) + _compact(None) + b"\x02" + _compact("t") + b"\x02" + struct.pack(">i", 3) + \
        b"\x04" + struct.pack(">iii", 0, 1, 2) + b"\x03" + struct.pack(">ii", 1, 2) + b"\x01" + b"\x00" + b"\x00" + \
        b"\x00"  # fmt: skip
    assert reassign_wire.parse_list(moving) == {3: reassign_wire.Ongoing(3, (0, 1, 2), (1, 2), ())}
    with pytest.raises(AdminError, match="NOT_CONTROLLER"):
        reassign_wire.parse_list(struct.pack(">ih", 0, 41) + _compact(None) + b"\x01" + b"\x00")
