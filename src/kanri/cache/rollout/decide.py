"""The order and the pace of a Cache's rolling replace, from observed state only (so a restarted operator decides
the same thing): pods are replaced by the operator (the StatefulSet's ``updateStrategy`` is ``OnDelete``), one at a
time, the replicas first (highest ordinal first), each only once every pod is back and every replica in sync with
the primary; then a planned switchover moves the primary to an up-to-date replica, and the old primary goes last.

A scale-down that would remove the primary's pod (the StatefulSet removes the highest ordinals) first switches the
primary over to a pod that stays. A replica whose template is outdated and that is not linked serves nothing, so it
is replaced without waiting for the others (a template that breaks pods could never be fixed otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kanri.cache.observe import Assessment

__all__ = ["IN_SYNC_BYTES", "PodState", "Replace", "RolloutDecision", "Settled", "Switchover", "Wait", "decide"]

IN_SYNC_BYTES = 1 << 20
"""A linked replica at most this many replication bytes behind the primary (measured by two probes a moment apart,
so writes in flight count) is in sync: replacing a peer of it loses no redundancy worth waiting for."""


@dataclass(frozen=True)
class PodState:
    """One pod of the cache as the API shows it."""

    name: str
    ordinal: int
    revision: str | None
    """Its ``controller-revision-hash`` label: the StatefulSet template it was made from."""
    terminating: bool = False


@dataclass(frozen=True)
class Replace:
    """Delete ``pod``: the StatefulSet controller makes it again from the current template."""

    pod: str
    reason: str


@dataclass(frozen=True)
class Switchover:
    """Move the primary off ``primary`` to one of ``candidates`` (up to date and staying), planned: writes paused
    until a candidate holds all of them."""

    primary: str
    candidates: tuple[str, ...]
    reason: str


@dataclass(frozen=True)
class Wait:
    """Nothing to do now; look again."""

    reason: str


@dataclass(frozen=True)
class Settled:
    """Every pod that stays runs the current template and the primary stays."""


RolloutDecision = Replace | Switchover | Wait | Settled


def in_sync(seen: Assessment, pod: str) -> bool:
    lag = seen.lags.get(pod)
    return pod in seen.linked and lag is not None and lag.bytes <= IN_SYNC_BYTES


def decide(pods: Sequence[PodState], update_revision: str | None, seen: Assessment, wanted: int) -> RolloutDecision:
    """What to do next for a cache of ``wanted`` pods. ``update_revision`` is the StatefulSet's current template
    (None until its controller has observed the latest spec); ``seen`` is what the pods reported this pass."""
    if update_revision is None:
        return Wait("the StatefulSet controller has not observed the latest template yet")
    busy = [pod.name for pod in pods if pod.terminating]
    if busy:
        return Wait(f"{', '.join(busy)} is being replaced")
    staying = sorted((pod for pod in pods if pod.ordinal < wanted), key=lambda pod: pod.ordinal)
    outdated = [pod.name for pod in staying if pod.revision != update_revision]
    primary = seen.primary
    broken = [name for name in reversed(outdated) if primary is not None and name != primary
              and name not in seen.linked]  # fmt: skip
    if broken:
        return Replace(broken[0], f"{broken[0]} runs an outdated template and replicates from nobody")
    leaving = primary is not None and all(pod.name != primary for pod in staying)
    if primary is not None and not outdated and not leaving:
        return Settled()
    if len(staying) < wanted or primary is None:
        return Wait(_unsettled(staying, wanted, primary, len(seen.primaries)))
    lagging = [pod.name for pod in staying if pod.name != primary and not in_sync(seen, pod.name)]
    if lagging:
        return Wait(f"waiting for {', '.join(lagging)} to be in sync with the primary {primary}")
    replicas = [name for name in reversed(outdated) if name != primary]
    if replicas:
        left = len(outdated) - 1
        return Replace(replicas[0], f"replacing replica {replicas[0]} with the current template ({left} more after)")
    candidates = tuple(pod.name for pod in staying if pod.name != primary)
    if candidates:
        why = "leaves with the scale-down" if leaving else "runs an outdated template"
        return Switchover(primary, candidates, f"the primary {primary} {why}: planned switchover to an "
                          "up-to-date replica first")  # fmt: skip
    # a single pod (Regenerable only): no replica to switch to, so the pod is replaced in place
    return Replace(primary, f"replacing {primary}, the only pod: its data is regenerable")


def _unsettled(staying: Sequence[PodState], wanted: int, primary: str | None, primaries: int) -> str:
    if primaries > 1:
        return f"{primaries} pods claim to be primary: no pod is replaced until one is"
    if primary is None:
        return "no primary answers: no pod is replaced until one does"
    return f"{len(staying)} of {wanted} pods exist: waiting for the StatefulSet to make the rest"
