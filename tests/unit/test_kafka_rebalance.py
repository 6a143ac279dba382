"""Where replicas go when brokers are added or drained (kanri.kafka.cluster.rebalance): balanced with few moves,
drained completely, never two replicas of a partition on one broker, and the same answer again from what Kafka
reports mid-way (a restarted operator carries on)."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kanri.kafka.cluster import rebalance
from kanri.kafka.cluster.rebalance import Moving


def _three_broker_topic(partitions: int, rf: int = 3) -> dict[tuple[str, int], list[int]]:
    return {("orders", p): [(p + i) % 3 for i in range(rf)] for p in range(partitions)}


def test_a_fourth_broker_gets_its_share_with_the_fewest_moves() -> None:
    assignment = _three_broker_topic(12)  # 36 replicas, 12 per broker
    progress = rebalance.progress(assignment, {}, [0, 1, 2, 3])
    after = {key: progress.to_move.get(key, replicas) for key, replicas in assignment.items()}
    assert sorted(rebalance.loads(after, [0, 1, 2, 3]).values()) == [9, 9, 9, 9]
    assert len(progress.to_move) == 9  # each move carries one replica to broker 3: no more than needed
    assert all(len(set(r)) == 3 and 3 in r for r in progress.to_move.values())


def test_a_drain_empties_the_broker_and_moves_its_replicas_first() -> None:
    assignment = {("orders", p): [p % 4, (p + 1) % 4] for p in range(8)}
    progress = rebalance.progress(assignment, {}, [0, 1, 2, 3], draining=[3])
    after = {key: progress.to_move.get(key, replicas) for key, replicas in assignment.items()}
    assert not any(3 in r for r in after.values())
    first = next(iter(progress.to_move))
    assert 3 in assignment[first]  # the drain's moves come before any evening out
    assert max(rebalance.loads(after, [0, 1, 2]).values()) - min(rebalance.loads(after, [0, 1, 2]).values()) <= 1


def test_a_partition_the_rest_cannot_hold_is_named_unplaceable() -> None:
    assignment = {("wide", 0): [0, 1, 2, 3], ("narrow", 0): [3]}
    progress = rebalance.progress(assignment, {}, [0, 1, 2, 3], draining=[3])
    assert progress.unplaceable == [("wide", 0)]
    assert ("narrow", 0) in progress.to_move


def test_moving_partitions_count_where_they_go_and_are_not_asked_again() -> None:
    assignment = _three_broker_topic(12)
    first = rebalance.progress(assignment, {}, [0, 1, 2, 3])
    batch = first.batch(4)
    assert len(batch) == 4
    # Kafka reports the batch moving: replicas old + new, the new ones adding, the old ones removing
    moving = {}
    for key, target in batch.items():
        adding = tuple(b for b in target if b not in assignment[key])
        removing = tuple(b for b in assignment[key] if b not in target)
        moving[key] = Moving(tuple(assignment[key]) + adding, adding, removing)
    now = {key: list(m.replicas) if key in moving else assignment[key] for key, m in moving.items()} | {
        key: r for key, r in assignment.items() if key not in moving
    }
    again = rebalance.progress(now, moving, [0, 1, 2, 3])
    assert again.moving == 4
    assert not set(again.to_move) & set(batch)
    assert len(again.to_move) == 5  # the rest of the nine
    assert again.batch(4) == {}  # four already moving: nothing more asked at a limit of 4


def test_throttles_name_the_old_replicas_as_leaders_and_the_new_ones_as_followers() -> None:
    assignment = {("orders", 0): [0, 1, 2], ("orders", 1): [1, 2, 0]}
    moves = {("orders", 0): [3, 1, 2]}
    moving = {("orders", 1): Moving((1, 2, 0, 3), adding=(3,), removing=(0,))}
    assert rebalance.throttled(moves, assignment, moving) == {
        "orders": ("0:0,0:1,0:2,1:0,1:1,1:2", "0:3,1:3"),
    }


def test_a_balanced_cluster_has_nothing_to_move() -> None:
    assert rebalance.progress(_three_broker_topic(6), {}, [0, 1, 2]).finished


assignments = st.dictionaries(
    st.tuples(st.sampled_from(["a", "b", "__consumer_offsets"]), st.integers(0, 20)),
    st.integers(1, 3).flatmap(lambda rf: st.permutations(range(4)).map(lambda p: list(p[:rf]))),
    min_size=1,
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(assignments, st.integers(4, 6), st.sets(st.integers(0, 5), max_size=2))
def test_any_plan_balances_drains_and_keeps_replicas_distinct(
    assignment: dict[tuple[str, int], list[int]], brokers: int, draining: set[int]
) -> None:
    nodes = list(range(brokers))
    draining = {b for b in draining if b < brokers}
    progress = rebalance.progress(assignment, {}, nodes, draining)
    after = {key: progress.to_move.get(key, replicas) for key, replicas in assignment.items()}
    for key, replicas in after.items():
        assert len(set(replicas)) == len(replicas) == len(assignment[key])
        if key not in progress.unplaceable:
            assert not set(replicas) & draining
    if not progress.unplaceable:
        load = rebalance.loads(after, [b for b in nodes if b not in draining])
        assert max(load.values()) - min(load.values()) <= 1, load
        # applying the plan leaves nothing to do: the next pass agrees
        assert rebalance.progress(after, {}, nodes, draining).finished
    # every move changes the partition's replicas
    assert all(Counter(progress.to_move[k]) != Counter(assignment[k]) or progress.to_move[k] != assignment[k]
               for k in progress.to_move)  # fmt: skip
