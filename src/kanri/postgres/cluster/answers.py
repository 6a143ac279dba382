"""What the status remembers of the instances' answers between passes, per cluster (in memory only).

A grace of one missed answer: an instance manager that did not answer one ``GET /status`` within the client's
timeout (2 s; a loaded machine) keeps its previous answer for the status of that pass, so ``Ready`` does not flap.
Two misses in a row, another pod, or a pod being deleted, and it reads as not answering. Only the status reads the
graced reports: failover detection keeps its own windows (:mod:`kanri.postgres.ha.failover`) and the role labels
follow answers only.

Losing the memory (an operator restart) only means no grace for one pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kanri.postgres.cluster.instances import InstanceReport

__all__ = ["AnswerMemory", "with_grace"]

Obj = dict[str, Any]


@dataclass
class AnswerMemory:
    """One cluster's memory of its instances' answers."""

    last: dict[str, tuple[str, InstanceReport]] = field(default_factory=dict)
    """Instance -> (its pod's uid, its answer) of the previous pass, for those that answered then."""
    withheld: frozenset[str] = frozenset()
    """Replicas withheld from reads in the previous pass (:func:`kanri.postgres.ha.reads.withheld_problem`)."""


def _uid(pod: Obj | None) -> str | None:
    if pod is None or pod["metadata"].get("deletionTimestamp"):
        return None
    return str(pod["metadata"].get("uid") or "") or None


def with_grace(
    memory: AnswerMemory, reports: Mapping[str, InstanceReport], pods: Mapping[str, Obj]
) -> dict[str, InstanceReport]:
    """This pass's answers, plus the previous answer of each instance that missed only this one (same pod, not being
    deleted); remembers this pass's answers for the next."""
    graced = dict(reports)
    for name, (uid, report) in memory.last.items():
        if name not in reports and uid == _uid(pods.get(name)):
            graced[name] = report
    memory.last = {name: (pod_uid, report) for name, report in reports.items()
                   if (pod_uid := _uid(pods.get(name))) is not None}  # fmt: skip
    return graced
