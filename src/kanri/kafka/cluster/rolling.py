"""Rolling restarts, decided (pure): which broker may restart next, one at a time, and only when no partition would
fall under ``min.insync.replicas`` while it is down.

A broker is safe to stop when, for every partition whose in-sync replicas include it, the others still number at
least the topic's ``min.insync.replicas`` — otherwise producers with ``acks=all`` would be refused until it is
back. Two cases do not hold a restart, because waiting cannot help: a partition already under its minimum (writes
already fail), and a topic whose ``min.insync.replicas`` is at least its replication factor (a restart of any of
its brokers stops its writes, whenever it is done).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

MAX_NAMED = 3
"""Partitions named in a hold's message (the rest are counted)."""


@dataclass(frozen=True)
class PartitionIsr:
    """One partition as the controller reports it, with its topic's effective ``min.insync.replicas``."""

    topic: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    min_isr: int


@dataclass(frozen=True)
class BrokerPod:
    name: str
    node_id: int
    ready: bool
    current: bool
    """The pod runs the StatefulSet's current template (no restart needed)."""


@dataclass(frozen=True)
class Restart:
    pod: str
    node_id: int


@dataclass(frozen=True)
class Hold:
    reason: str
    """``BrokerNotReady`` or ``MinInSyncReplicas``."""
    message: str


def _at_risk(node_id: int, partition: PartitionIsr) -> bool:
    if node_id not in partition.isr or partition.min_isr >= len(partition.replicas):
        return False  # not in sync there, or no restart can ever keep this topic writable
    return len(partition.isr) - 1 < partition.min_isr <= len(partition.isr)  # writable now, not without it


def would_fall_under(node_id: int, partitions: Sequence[PartitionIsr]) -> list[PartitionIsr]:
    """The partitions that stopping ``node_id`` would take under their ``min.insync.replicas``."""
    return [p for p in partitions if _at_risk(node_id, p)]


def safe_to_stop(node_id: int, partitions: Sequence[PartitionIsr]) -> str | None:
    """Why broker ``node_id`` may not stop now, or None when it may."""
    at_risk = would_fall_under(node_id, partitions)
    if not at_risk:
        return None
    named = ", ".join(f"{p.topic}-{p.partition} (in sync: {len(p.isr)}, min.insync.replicas {p.min_isr})"
                      for p in at_risk[:MAX_NAMED])  # fmt: skip
    more = f" and {len(at_risk) - MAX_NAMED} more" if len(at_risk) > MAX_NAMED else ""
    return f"stopping broker {node_id} would leave {named}{more} under min.insync.replicas; waiting for the other " \
        f"replicas to be in sync"  # fmt: skip


def next_restart(pods: Sequence[BrokerPod], partitions: Sequence[PartitionIsr]) -> Restart | Hold | None:
    """The next broker to restart (the highest node id not on the current template), a hold saying why not now,
    or None when every broker runs the current template."""
    outdated = [pod for pod in pods if not pod.current]
    if not outdated:
        return None
    if unready := sorted(pod.name for pod in pods if not pod.ready):
        return Hold("BrokerNotReady", f"waiting for {', '.join(unready)} to be ready before the next restart")
    candidate = max(outdated, key=lambda pod: pod.node_id)
    if (reason := safe_to_stop(candidate.node_id, partitions)) is not None:
        return Hold("MinInSyncReplicas", reason)
    return Restart(candidate.name, candidate.node_id)
