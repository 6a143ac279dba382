"""PodDisruptionBudgets: a drain may take at most one replica at a time and never the primary without a
switchover. Skipped for a single instance or a hibernated cluster (a budget nothing can satisfy would block every
node drain forever)."""

from __future__ import annotations

from typing import Any

from kanri.postgres import names
from kanri.postgres.children import child_meta, owned
from kanri.postgres.labels import PRIMARY, REPLICA, cluster_labels, role_selector

__all__ = ["disruption_budgets", "wants_budgets"]

Obj = dict[str, Any]


def wants_budgets(instances: int, hibernated: bool) -> bool:
    """Budgets only make sense with a primary and at least one replica running."""
    return instances >= 2 and not hibernated


def disruption_budgets(cluster: Obj, *, by_app: bool = True) -> list[Obj]:
    """``<cluster>-primary`` (minAvailable 1 on the primary) and ``<cluster>`` (maxUnavailable 1 on the replicas).
    ``by_app``: they select by app name too, as the Services do (:func:`kanri.postgres.labels.routes_by_app`)."""
    name = cluster["metadata"]["name"]
    labels = cluster_labels(name)
    primary = {"minAvailable": 1, "selector": {"matchLabels": role_selector(name, PRIMARY, by_app=by_app)}}
    replicas = {"maxUnavailable": 1, "selector": {"matchLabels": role_selector(name, REPLICA, by_app=by_app)}}
    return [
        owned("policy/v1", "PodDisruptionBudget", child_meta(cluster, names.primary_pdb(name), labels), spec=primary),
        owned("policy/v1", "PodDisruptionBudget", child_meta(cluster, names.replica_pdb(name), labels), spec=replicas),
    ]
