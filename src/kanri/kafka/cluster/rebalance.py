"""Where partition replicas go when brokers are added or drained, decided (pure) from one look at Kafka.

The plan is computed afresh every pass from where the replicas are and what Kafka is still moving, so a restarted
operator needs nothing but Kafka's answers (the same rule as a topic's replication-factor change). It does two
things, in this order:

1. **drain**: every replica on a draining broker goes to the least-loaded other broker that does not hold that
   partition yet (a partition whose replication factor the remaining brokers cannot hold is *unplaceable*);
2. **even out**: while the most loaded broker holds at least two replicas more than the least loaded one, one
   replica moves from the first to the second — a partition already planned to move first (no extra move), else
   the lowest (topic, partition) — so a new broker gets its share with the fewest moves.

A moving partition counts where it is going and is never planned again until Kafka reports it done. Moving a
replica keeps its place in the list: when it was the preferred leader, the new broker becomes it (Kafka's
preferred-leader election then spreads leadership too).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

Key = tuple[str, int]
"""(topic, partition)."""
Assignment = Mapping[Key, Sequence[int]]


@dataclass(frozen=True)
class Moving:
    """A partition Kafka is moving: its replicas now (old and new) and those being added and removed."""

    replicas: tuple[int, ...]
    adding: tuple[int, ...] = ()
    removing: tuple[int, ...] = ()

    @property
    def target(self) -> list[int]:
        return [b for b in self.replicas if b not in self.removing]

    @property
    def before(self) -> list[int]:
        return [b for b in self.replicas if b not in self.adding]


@dataclass(frozen=True)
class Progress:
    moving: int
    """Partitions Kafka is moving now."""
    to_move: dict[Key, list[int]]
    """Every partition not moving whose replicas must change, with its target (drain moves first)."""
    unplaceable: list[Key] = field(default_factory=list)
    """Partitions on a draining broker that the other brokers cannot hold (replication factor too large)."""

    @property
    def finished(self) -> bool:
        return not self.moving and not self.to_move

    def batch(self, limit: int) -> dict[Key, list[int]]:
        """The moves to ask for now: at most ``limit`` partitions moving at once."""
        room = max(0, limit - self.moving)
        return dict(list(self.to_move.items())[:room])


def loads(assignment: Assignment, brokers: Collection[int]) -> Counter[int]:
    """Replicas per broker (only ``brokers`` counted; each starts at 0)."""
    load: Counter[int] = Counter(dict.fromkeys(brokers, 0))
    for replicas in assignment.values():
        for broker in replicas:
            if broker in load:
                load[broker] += 1
    return load


def plan(
    assignment: Assignment, brokers: Sequence[int], draining: Collection[int] = (), frozen: Collection[Key] = ()
) -> tuple[dict[Key, list[int]], list[Key]]:
    """The partitions whose replicas change, with their new replicas, and the unplaceable ones. ``brokers``: every
    broker of the cluster (draining ones included); ``frozen``: partitions that may not be moved (being moved)."""
    targets = sorted(b for b in brokers if b not in draining)
    placed = {key: list(replicas) for key, replicas in sorted(assignment.items())}
    load = loads(placed, targets)
    moved: dict[Key, list[int]] = {}
    unplaceable: list[Key] = []
    for key, replicas in placed.items():
        if key in frozen or not set(replicas) & set(draining):
            continue
        for index, broker in enumerate(replicas):
            if broker not in draining:
                continue
            free = [b for b in targets if b not in replicas]
            if not free:
                unplaceable.append(key)
                break
            best = min(free, key=lambda b: (load[b], b))
            replicas[index] = best
            load[best] += 1
            moved[key] = replicas
    on: dict[int, list[Key]] = {b: [] for b in targets}
    for key, replicas in placed.items():
        for broker in replicas:
            if broker in on:
                on[broker].append(key)
    while len(targets) > 1:
        high = max(targets, key=lambda b: (load[b], -b))
        low = min(targets, key=lambda b: (load[b], b))
        if load[high] - load[low] <= 1:
            break
        candidates = [k for k in on[high] if k not in frozen and low not in placed[k]]
        if not candidates:  # cannot happen while high holds more than low; kept as a guard against a loop
            break
        key = min(candidates, key=lambda k: (k not in moved, k))
        replicas = placed[key]
        replicas[replicas.index(high)] = low
        on[high].remove(key)
        on[low].append(key)
        load[high] -= 1
        load[low] += 1
        moved[key] = replicas
    changed = {key: replicas for key, replicas in moved.items() if list(assignment[key]) != replicas}
    return changed, unplaceable


def progress(
    assignment: Assignment, moving: Mapping[Key, Moving], brokers: Sequence[int], draining: Collection[int] = ()
) -> Progress:
    """What is left toward a balanced (and drained) cluster: moving partitions count at their target."""
    effective = {key: (moving[key].target if key in moving else list(replicas)) for key, replicas in
                 assignment.items()}  # fmt: skip
    to_move, unplaceable = plan(effective, brokers, draining, frozen=set(moving))
    # drain moves first: they are what a waiting scale-down needs
    ordered = dict(sorted(to_move.items(), key=lambda item: (not set(effective[item[0]]) & set(draining), item[0])))
    return Progress(moving=len(moving), to_move=ordered, unplaceable=unplaceable)


def throttled(
    moves: Mapping[Key, Sequence[int]], assignment: Assignment, moving: Mapping[Key, Moving]
) -> dict[str, tuple[str, str]]:
    """Per topic, the values of ``leader.replication.throttled.replicas`` and
    ``follower.replication.throttled.replicas`` that throttle exactly the replication of the partitions moving
    (``moving``) and about to move (``moves``): the existing replicas as leaders, the new ones as followers
    (what ``kafka-reassign-partitions --throttle`` sets)."""
    leaders: dict[str, set[tuple[int, int]]] = {}
    followers: dict[str, set[tuple[int, int]]] = {}
    pairs = [(key, m.before, [b for b in m.adding]) for key, m in moving.items()]
    pairs += [(key, list(assignment[key]), [b for b in target if b not in assignment[key]]) for key, target in
              moves.items()]  # fmt: skip
    for (topic, partition), before, adding in pairs:
        leaders.setdefault(topic, set()).update((partition, b) for b in before)
        followers.setdefault(topic, set()).update((partition, b) for b in adding)
    return {
        topic: (
            ",".join(f"{p}:{b}" for p, b in sorted(leaders[topic])),
            ",".join(f"{p}:{b}" for p, b in sorted(followers.get(topic, set()))),
        )
        for topic in sorted(leaders)
    }
