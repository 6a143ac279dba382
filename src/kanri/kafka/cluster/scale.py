"""A change of a KafkaCluster's ``replicas``, decided (pure): what the StatefulSet runs, whether a drain runs first,
and why a change is refused.

Nodes ``0..controllers-1`` are the KRaft controller voters (and brokers); the voter list is static
(``controller.quorum.voters``), so those nodes stay. Every node after them is a broker only, so:

- a **scale-up** adds broker-only nodes at once; the rebalance step then moves replicas onto them
  (:mod:`.rebalance`);
- a **scale-down** removes the last nodes once they hold no partition replica. While they hold some, it is refused
  (``ScaleDownRefused``, naming each broker and how many it holds) — unless the drain annotation names exactly the
  brokers it removes: then the StatefulSet keeps them while their replicas are moved off, and the scale-down is
  applied by the pass that finds them empty;
- a scale-down into the voters is refused (``VoterListFixed``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from kanri.kafka.api import DRAIN_BROKERS
from kanri.kit import Problem

SCALE_DOWN_REFUSED = "ScaleDownRefused"
VOTER_LIST_FIXED = "VoterListFixed"


@dataclass(frozen=True)
class ScaleDecision:
    replicas: int
    """What the StatefulSet runs."""
    problem: Problem | None = None
    draining: tuple[int, ...] = ()
    """Brokers whose replicas are to be moved off before the StatefulSet shrinks."""


def parse_drain(value: str | None) -> frozenset[int] | None:
    """The drain annotation's broker ids (``"3,4"``); None when unset or not a list of ids."""
    if not value:
        return None
    parts = [part.strip() for part in value.split(",") if part.strip()]
    if not parts or not all(part.isdigit() for part in parts):
        return None
    return frozenset(int(part) for part in parts)


def decide(
    current: int | None,
    desired: int,
    held: Mapping[int, int] | None,
    controllers: int,
    drain: Collection[int] | None = None,
) -> ScaleDecision:
    """``current``: the StatefulSet's replicas (None: not created yet); ``desired``: ``spec.replicas``; ``held``:
    partition replicas per node id as Kafka reports them (None: Kafka could not be read); ``controllers``: the
    voters on record; ``drain``: the brokers the drain annotation names (None: no annotation)."""
    if current is None or current <= desired:
        return ScaleDecision(desired)
    change = f"replicas {current} -> {desired} is not applied"
    back = f"set spec.replicas back to {current}"
    removed = list(range(desired, current))
    if desired < controllers:
        voters = ", ".join(str(node) for node in range(desired, min(current, controllers)))
        message = f"{change}: nodes 0..{controllers - 1} are the KRaft controller voters and the static voter " \
            f"list cannot lose one (node {voters}); at least {controllers} replicas stay; {back}"  # fmt: skip
        return ScaleDecision(current, Problem(VOTER_LIST_FIXED, message))
    if held is None:
        message = f"{change}: which partition replicas the nodes to remove hold cannot be read from Kafka now"
        return ScaleDecision(current, Problem(SCALE_DOWN_REFUSED, message))
    holding = sorted((node, count) for node, count in held.items() if node in removed and count > 0)
    if not holding:
        return ScaleDecision(desired)
    ids = ",".join(str(node) for node in removed)
    if drain is not None and set(drain) == set(removed):
        return ScaleDecision(current, draining=tuple(removed))
    named = ", ".join(f"broker {node} holds {count} partition replicas" for node, count in holding)
    message = f"{change}: {named}; removing it would remove that data. To move them off first, annotate " \
        f"{DRAIN_BROKERS}={ids}"  # fmt: skip
    if drain is not None:
        message += f" (the annotation names {','.join(map(str, sorted(drain)))}, not the brokers removed)"
    event = f"{message}; or {back}. See docs/kafka.md#scaling"
    return ScaleDecision(current, Problem(SCALE_DOWN_REFUSED, message, event))
