"""Labels the operator puts on its children, and the selectors built from them.

``kanri.dev/cluster`` and ``kanri.dev/instance`` are fixed for an object's life (StatefulSet selectors are
immutable); ``kanri.dev/role`` is set on pods only, by the operator, from what each instance manager reports, so the
``-rw`` and ``-ro`` Services follow a failover without touching a StatefulSet. ``fenced`` is selected by neither:
an instance fenced after a split brain gets no traffic (``-r``, "any instance", still selects it, but a fenced
instance's PostgreSQL is stopped and its pod not ready).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["CLUSTER", "FENCED", "INSTANCE", "MANAGED_BY", "PRIMARY", "REPLICA", "ROLE", "Role", "cluster_labels",
           "instance_labels", "role_selector"]  # fmt: skip

CLUSTER = "kanri.dev/cluster"
INSTANCE = "kanri.dev/instance"
ROLE = "kanri.dev/role"
MANAGED_BY = "app.kubernetes.io/managed-by"

Role = Literal["primary", "replica"]
PRIMARY: Role = "primary"
REPLICA: Role = "replica"
FENCED = "fenced"
"""A pod label value only (never a bootstrap role): the instance was fenced."""


def cluster_labels(cluster: str) -> dict[str, str]:
    """On every child: which cluster it belongs to, and who manages it."""
    return {CLUSTER: cluster, MANAGED_BY: "kanri"}


def instance_labels(cluster: str, instance: str) -> dict[str, str]:
    """On an instance's StatefulSet, pod template and PVC."""
    return {**cluster_labels(cluster), INSTANCE: instance}


def role_selector(cluster: str, role: Role | None) -> dict[str, str]:
    """Selects the cluster's pods with ``role`` (every instance when None)."""
    selector = {CLUSTER: cluster}
    if role is not None:
        selector[ROLE] = role
    return selector
