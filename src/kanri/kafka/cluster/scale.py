"""A change of a KafkaCluster's ``replicas``, decided (pure): what the StatefulSet runs, and why a change is refused.

Every node is a combined KRaft controller and broker with a static voter list (``controller.quorum.voters``, one
entry per node). KRaft keeps that list in the metadata log of formatted nodes, so a StatefulSet with another
number of nodes would start voters that disagree with it: a crash loop, or a quorum that cannot elect. So no change
of ``replicas`` reaches the StatefulSet; the refusal is a ``Degraded`` reason naming what stops it:

- ``ScaleDownRefused``: a node that would go still holds partition replicas (its data would go with it) — named
  with how many, checked first because it is the data-loss risk;
- ``VoterListFixed``: otherwise (scale-up, or removed nodes holding nothing): the static voter list.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kanri.kit import Problem

SCALE_DOWN_REFUSED = "ScaleDownRefused"
VOTER_LIST_FIXED = "VoterListFixed"


@dataclass(frozen=True)
class ScaleDecision:
    replicas: int
    """What the StatefulSet runs."""
    problem: Problem | None = None


def decide(current: int | None, desired: int, held: Mapping[int, int] | None) -> ScaleDecision:
    """``current``: the StatefulSet's replicas (None: not created yet); ``desired``: ``spec.replicas``; ``held``:
    partition replicas per node id as Kafka reports them (None: Kafka could not be read)."""
    if current is None or current == desired:
        return ScaleDecision(desired)
    change = f"replicas {current} -> {desired} is not applied"
    back = f"set spec.replicas back to {current}"
    if desired < current:
        if held is None:
            message = f"{change}: which partition replicas the nodes to remove hold cannot be read from Kafka now"
            return ScaleDecision(current, Problem(SCALE_DOWN_REFUSED, message))
        holding = sorted((node, count) for node, count in held.items() if node >= desired and count > 0)
        if holding:
            named = ", ".join(f"broker {node} holds {count} partition replicas" for node, count in holding)
            message = f"{change}: {named}; removing it would remove that data"
            event = f"{message}. Move the replicas off first (or {back}); see docs/kafka.md#scaling"
            return ScaleDecision(current, Problem(SCALE_DOWN_REFUSED, message, event))
    message = f"{change}: every node is a KRaft controller voter and the static voter list cannot change on " \
        f"formatted nodes; {back} (another size needs a new cluster, docs/kafka.md#scaling)"  # fmt: skip
    return ScaleDecision(current, Problem(VOTER_LIST_FIXED, message))
