"""What a KafkaCluster's health is, decided (pure) from one look at Kafka: the brokers registered, every partition's
leader, replicas and in-sync replicas (one metadata request for the whole cluster), and the controller quorum
(:mod:`.quorum_wire`).

``Ready`` is False with the most serious reason first: ``PartitionsOffline`` (a partition without a leader: its
reads and writes fail now), ``BrokersNotReady`` (pods), ``BrokersNotRegistered`` (pods up, Kafka does not list
them), ``QuorumBehind`` (a controller voter not caught up with the metadata log's leader: one more failure may
stop the quorum), ``UnderReplicated``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kanri.kafka.cluster.quorum_wire import QuorumState

CAUGHT_UP_MS = 5000
"""A voter that fetched up to the leader's end within this many ms of the leader's clock is caught up (controllers
fetch continuously and the leader appends a no-op record every 500 ms, so a live voter is well within it)."""
MAX_NAMED = 3


@dataclass(frozen=True)
class PartitionState:
    """One partition as the cluster's metadata reports it."""

    topic: str
    partition: int
    leader: int
    """-1: no leader (offline)."""
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True)
class KafkaView:
    """One look at a cluster: its metadata, and its quorum (None when DescribeQuorum did not answer: ``quorum_error``
    says why)."""

    brokers: tuple[int, ...]
    partitions: tuple[PartitionState, ...]
    quorum: QuorumState | None = None
    quorum_error: str | None = None


@dataclass(frozen=True)
class Voter:
    node_id: int
    caught_up: bool
    lag: int | None
    """Records of the metadata log behind the leader's end (None: unknown)."""


@dataclass(frozen=True)
class Verdict:
    ready: bool
    reason: str
    message: str


def voters(quorum: QuorumState) -> list[Voter]:
    """Each voter and whether it is caught up: the leader is; another is when its last caught-up time is within
    :data:`CAUGHT_UP_MS` of the leader's own (both on the leader's clock)."""
    leader = next((v for v in quorum.voters if v.node_id == quorum.leader_id), None)
    found = []
    for voter in sorted(quorum.voters, key=lambda v: v.node_id):
        lag = None
        if leader is not None and voter.log_end_offset >= 0 and leader.log_end_offset >= 0:
            lag = max(0, leader.log_end_offset - voter.log_end_offset)
        if voter.node_id == quorum.leader_id:
            found.append(Voter(voter.node_id, True, 0))
            continue
        now = leader.last_caught_up_ms if leader is not None else -1
        caught_up = now >= 0 and voter.last_caught_up_ms >= 0 and now - voter.last_caught_up_ms <= CAUGHT_UP_MS
        found.append(Voter(voter.node_id, caught_up, lag))
    return found


def under_replicated(partitions: Iterable[PartitionState]) -> int:
    return sum(1 for p in partitions if len(p.isr) < len(p.replicas))


def offline(partitions: Iterable[PartitionState]) -> list[PartitionState]:
    return [p for p in partitions if p.leader < 0]


def replicas_on(partitions: Iterable[PartitionState], nodes: Iterable[int]) -> dict[int, int]:
    """How many partition replicas each of ``nodes`` holds (internal topics included: they are data too)."""
    held = dict.fromkeys(nodes, 0)
    for p in partitions:
        for node in p.replicas:
            if node in held:
                held[node] += 1
    return held


def _named(partitions: Sequence[PartitionState]) -> str:
    named = ", ".join(f"{p.topic}-{p.partition}" for p in partitions[:MAX_NAMED])
    return named + (f" and {len(partitions) - MAX_NAMED} more" if len(partitions) > MAX_NAMED else "")


def _not_ready(view: KafkaView, expected: int, ready_pods: int) -> tuple[str, str] | None:
    """The most serious reason the cluster is not Ready, with its message; None when it is."""
    if lost := offline(view.partitions):
        return "PartitionsOffline", f"{len(lost)} partitions have no leader (reads and writes fail): {_named(lost)}"
    if ready_pods < expected:
        return "BrokersNotReady", f"{ready_pods} of {expected} brokers ready"
    if missing := sorted(set(range(expected)) - set(view.brokers)):
        return "BrokersNotRegistered", f"brokers {', '.join(map(str, missing))} are not registered with the cluster"
    if view.quorum is not None:
        if view.quorum.leader_id < 0:
            return "QuorumBehind", "the controller quorum has no leader"
        if behind := [v for v in voters(view.quorum) if not v.caught_up]:
            names = ", ".join(f"{v.node_id} (lag {'unknown' if v.lag is None else v.lag})" for v in behind)
            return "QuorumBehind", f"controller voters not caught up with leader {view.quorum.leader_id}: {names}"
    if under := under_replicated(view.partitions):
        return "UnderReplicated", f"{under} partitions have fewer in-sync replicas than replicas"
    return None


def verdict(view: KafkaView, expected: int, ready_pods: int) -> Verdict:
    """``Ready`` for a cluster of ``expected`` nodes with ``ready_pods`` pods ready, and a message that says what
    Kafka reports (brokers, partitions, quorum)."""
    summary = (
        f"{ready_pods} of {expected} brokers ready, {len(view.brokers)} registered; "
        f"{under_replicated(view.partitions)} under-replicated and {len(offline(view.partitions))} offline partitions"
    )
    if view.quorum is not None:
        caught_up = sum(1 for v in voters(view.quorum) if v.caught_up)
        summary += f"; quorum leader {view.quorum.leader_id}, {caught_up} of {len(view.quorum.voters)} voters caught up"
    elif view.quorum_error:
        summary += f"; controller quorum not read: {view.quorum_error}"
    found = _not_ready(view, expected, ready_pods)
    if found is None:
        return Verdict(True, "BrokersReady", summary)
    reason, message = found
    return Verdict(False, reason, f"{message} ({summary})")
