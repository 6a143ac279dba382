"""Replication-factor changes, decided (pure): where each partition's replicas go, what is done and what is left.

A partition is *done* when it has exactly the desired number of replicas and Kafka is not moving it. Each pass
asks Kafka to move only the partitions that are neither done nor moving, to a target computed from where replicas
are now — so a pass after an operator restart (or after the spec changed again mid-change) needs nothing but what
Kafka reports.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

Assignment = Mapping[int, Sequence[int]]
"""Partition -> its replicas' broker ids, the preferred leader first."""


@dataclass(frozen=True)
class Progress:
    done: int
    total: int
    moving: int
    """Partitions Kafka is moving now."""
    to_move: dict[int, list[int]]
    """Partitions to ask Kafka to move, with their target replicas."""

    @property
    def finished(self) -> bool:
        return self.done == self.total


def too_many(replicas: int, brokers: int, topic: str, cluster: str) -> str | None:
    """Why ``replicas`` cannot be had on ``brokers`` brokers (the status message), or None when it can."""
    if replicas <= brokers:
        return None
    return f"replicationFactor {replicas} is more than the {brokers} brokers of cluster {cluster}: topic {topic} " \
        f"keeps its replicas until the spec asks for at most {brokers} or brokers are added"  # fmt: skip


def target_assignment(current: Assignment, brokers: Sequence[int], replicas: int) -> dict[int, list[int]]:
    """Each partition's replicas for ``replicas`` copies on ``brokers``: the ones it has are kept (the preferred
    leader first, so leadership does not move); a decrease drops the last ones; an increase adds the brokers that
    carry the fewest replicas of this topic, ties broken by a rotation on the partition number so equal loads
    still spread."""
    if replicas > len(brokers):
        raise ValueError(f"{replicas} replicas on {len(brokers)} brokers")
    ordered = sorted(brokers)
    kept = {p: [b for b in current[p] if b in ordered][:replicas] for p in sorted(current)}
    load = Counter(b for held in kept.values() for b in held)
    target: dict[int, list[int]] = {}
    for partition, held in kept.items():
        chosen = list(held)
        rotation = ordered[partition % len(ordered) :] + ordered[: partition % len(ordered)]
        while len(chosen) < replicas:
            free = [b for b in rotation if b not in chosen]
            best = min(free, key=lambda b: (load[b], free.index(b)))
            chosen.append(best)
            load[best] += 1
        target[partition] = chosen
    return target


def progress(current: Assignment, moving: Collection[int], brokers: Sequence[int], replicas: int) -> Progress:
    """What is done, what Kafka is moving and what to ask it to move, toward ``replicas`` copies everywhere."""
    done = [p for p, held in current.items() if len(held) == replicas and p not in moving]
    pending = {p for p in current if p not in moving and p not in done}
    target = target_assignment(current, brokers, replicas) if pending else {}
    to_move = {p: target[p] for p in sorted(pending)}
    return Progress(done=len(done), total=len(current), moving=len(moving), to_move=to_move)
