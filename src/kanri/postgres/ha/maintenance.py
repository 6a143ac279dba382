"""Node maintenance: a primary whose node is cordoned (``kubectl cordon``, the first thing ``kubectl drain`` does) is
switched over to the best replica on a schedulable node before the drain reaches it.

The primary budget (:mod:`kanri.postgres.children.pdb`) keeps a drain from evicting the primary; without this step
the drain waits on it until someone switches over by hand. Once the role moved, the old primary is a replica, which
the replica budget lets the drain take. A replica on a cordoned node is never chosen (the drain would take the new
primary next). When no replica can take the role, a ``NodeMaintenanceBlocked`` Warning Event says why, once.

The node is read with one GET per pass of a cluster with replicas (the operator keeps no Node cache); an operator
not allowed to read Nodes (403) logs it once and does nothing here — the budgets still hold the drain.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import structlog

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.context import ClusterStep
from kanri.postgres.ha.memory import FailoverMemory
from kanri.postgres.ha.primary_update import switchover_target
from kanri.runtime import ApiError
from kanri.runtime.kinds import NODE

__all__ = ["MAINTENANCE_RETRY", "NodeReader", "is_cordoned", "maintenance_target"]

Obj = dict[str, Any]
log = structlog.get_logger("kanri.postgres.ha.maintenance")

MAINTENANCE_RETRY = 60.0
"""After a maintenance switchover began, how long before another may begin (one that was abandoned is not retried
on every pass)."""
_UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"


class Pass(ClusterStep, Protocol):
    """What node maintenance needs from the reconcile pass."""


def is_cordoned(node: Mapping[str, Any] | None) -> bool:
    """Whether ``node`` takes no new pods: ``spec.unschedulable`` or its taint (what ``kubectl cordon`` sets)."""
    spec = (node or {}).get("spec") or {}
    return bool(spec.get("unschedulable")) or any(
        t.get("key") == _UNSCHEDULABLE_TAINT for t in spec.get("taints") or []
    )


class NodeReader:
    """Reads the nodes of one pass, each once; a refusal to read Nodes is logged once per operator."""

    refused = False

    def __init__(self, step: Pass) -> None:
        self.step = step
        self.seen: dict[str, Obj | None] = {}

    async def node_of(self, pod: Mapping[str, Any] | None) -> Obj | None:
        node = ((pod or {}).get("spec") or {}).get("nodeName")
        if not node or NodeReader.refused:
            return None
        if node not in self.seen:
            try:
                self.seen[node] = await self.step.client.get(NODE, str(node))
            except ApiError as exc:
                if exc.status == 403:
                    NodeReader.refused = True
                    log.warning("not allowed to read Nodes: a primary on a cordoned node is not switched over")
                elif not exc.not_found:
                    raise
                self.seen[node] = None
        return self.seen[node]


async def maintenance_target(
    step: Pass,
    memory: FailoverMemory,
    now: float,
    primary: str,
    instances: list[str],
    reports: Mapping[str, InstanceReport],
    pods: Mapping[str, Obj],
) -> tuple[str, str] | None:
    """(the replica to switch over to, the cordoned node) when ``primary``'s node is cordoned and a ready replica on
    a schedulable node can take the role; None otherwise (said once by an Event when no replica can)."""
    nodes = NodeReader(step)
    node = await nodes.node_of(pods.get(primary))
    if node is None or not is_cordoned(node):
        memory.maintenance_refused = None
        return None
    name = str(node["metadata"]["name"])
    if memory.maintenance_started is not None and now - memory.maintenance_started < MAINTENANCE_RETRY:
        return None
    schedulable = {i for i in instances if i != primary and not is_cordoned(await nodes.node_of(pods.get(i)))}
    target = switchover_target(primary, instances, reports, schedulable)
    if target is None:
        if memory.maintenance_refused != name:
            memory.maintenance_refused = name
            await step.events.warning(step.cluster, "NodeMaintenanceBlocked", f"node {name} of the primary {primary} "
                                      f"is cordoned, and no ready replica on another schedulable node can take the "
                                      f"primary role: the drain waits on the primary's budget")  # fmt: skip
        return None
    memory.maintenance_started = now
    memory.maintenance_refused = None
    return target, name
