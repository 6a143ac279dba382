"""Step 6: the status a pass computed, written once when it changed, with the Events its changes call for.

One status write per pass at most (none when converged: :func:`kanri.postgres.cluster.status.status_patch` is None);
``Ready`` turning True or False, a storage class that cannot expand, a major upgrade's warning and each new problem
are told once, as Events.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

from kanri.postgres.cluster.problems import ordered
from kanri.postgres.cluster.status import Observation, compute_status, condition_flipped, status_patch
from kanri.postgres.context import ClusterStep
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.metrics import PostgresMetrics
from kanri.runtime import get_condition

__all__ = ["report"]


class Pass(ClusterStep, Protocol):
    """What the status step needs from the reconcile pass."""

    @property
    def metrics(self) -> PostgresMetrics | None: ...


async def report(step: Pass, observation: Observation) -> None:
    """Write the status the observation calls for (nothing when converged) and send the Events its changes call for."""
    old = step.cluster.get("status") or {}
    new = compute_status(old, observation, datetime.now(UTC))
    if step.metrics is not None:
        # old first: lastFailover, failover, backup, tls are written by their own steps, not compute_status
        step.metrics.observe({**step.cluster, "status": {**old, **new}}, observation.reports)
    patch = status_patch(old, new)
    if patch is None:
        return  # converged: not even a status write (and no problem is new)
    await step.client.patch_status(POSTGRES_CLUSTER, step.name, {"status": patch}, step.namespace)
    ready = condition_flipped(old, new, "Ready")
    if ready is not None and ready["status"] == "True":
        await step.events.normal(step.cluster, "ClusterReady", ready["message"])
    elif ready is not None and ready["reason"] != "Hibernated" and old.get("phase") == "Ready":
        await step.events.warning(step.cluster, "ClusterNotReady", ready["message"])
    storage = condition_flipped(old, new, "StorageResizing")
    if storage is not None and storage["reason"] == "ExpansionNotSupported":
        await step.events.warning(step.cluster, "StorageExpansionNotSupported", storage["message"])
    upgrade = condition_flipped(old, new, "MajorUpgrade")
    if upgrade is not None and observation.upgrade is not None and observation.upgrade.warn:
        await step.events.warning(step.cluster, upgrade["reason"], upgrade["message"])
    # One Warning Event per problem when it appears: the old Degraded message lists the ones already told.
    told = get_condition(old.get("conditions") or [], "Degraded") or {}
    told_message = str(told.get("message") or "") if told.get("status") == "True" else ""
    for problem in ordered(observation.problems):
        if problem.message not in told_message:
            await step.events.warning(step.cluster, problem.reason, problem.event or problem.message)
