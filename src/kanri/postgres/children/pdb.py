"""PodDisruptionBudgets: a drain may take at most one replica at a time and never the primary without a
switchover (the operator switches the primary away from a cordoned node first: :mod:`kanri.postgres.ha.maintenance`).

A single instance has no replica to hand its role to: once it served, its pod is kept from a drain (the primary
budget alone) unless ``spec.nodeMaintenanceWindow.inProgress`` says the owner accepts the downtime. A hibernated
cluster has none (no pod to protect)."""

from __future__ import annotations

from typing import Any

from kanri.postgres import names
from kanri.postgres.children import child_meta, owned
from kanri.postgres.labels import PRIMARY, REPLICA, cluster_labels, role_selector

__all__ = ["disruption_budgets", "wants_budgets"]

Obj = dict[str, Any]


def wants_budgets(instances: int, hibernated: bool, *, maintenance: bool = False) -> bool:
    """Budgets while a primary runs: with a replica, or alone outside a maintenance window (``maintenance``)."""
    return not hibernated and (instances >= 2 or (instances == 1 and not maintenance))


def disruption_budgets(cluster: Obj, *, by_app: bool = True, instances: int = 2) -> list[Obj]:
    """``<cluster>-primary`` (minAvailable 1 on the primary: for one pod, no eviction at all) and, with replicas
    (``instances`` above 1), ``<cluster>`` (maxUnavailable 1 on the replicas). ``by_app``: they select by app name
    too, as the Services do (:func:`kanri.postgres.labels.routes_by_app`)."""
    name = cluster["metadata"]["name"]
    labels = cluster_labels(name)
    primary = {"minAvailable": 1, "selector": {"matchLabels": role_selector(name, PRIMARY, by_app=by_app)}}
    replicas = {"maxUnavailable": 1, "selector": {"matchLabels": role_selector(name, REPLICA, by_app=by_app)}}
    budgets = [
        owned("policy/v1", "PodDisruptionBudget", child_meta(cluster, names.primary_pdb(name), labels), spec=primary),
        owned("policy/v1", "PodDisruptionBudget", child_meta(cluster, names.replica_pdb(name), labels), spec=replicas),
    ]
    return budgets if instances >= 2 else budgets[:1]
