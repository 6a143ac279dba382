"""The instances' identity: a ServiceAccount without an automounted token, and no Role at all.

The instance manager never calls the Kubernetes API: it reads its configuration and credentials from the files the
pod mounts (the ConfigMap and the Secrets, through volumes the kubelet fills) and talks only to PostgreSQL and to the
operator's requests on its own HTTP API. So the least it needs is nothing: no token is mounted and no Role binds the
account. Owning no Role also means the operator itself holds no rights on ``roles`` or ``rolebindings`` (RBAC lets
one grant only what one holds, and creating Roles is the first step of an escalation), see docs/security.md.

Clusters created by an earlier version own a ``<cluster>-instance`` Role and RoleBinding that allowed ``get`` on the
cluster's own ConfigMap and Secrets; they are left in place (the operator may no longer delete them) and go with the
cluster through garbage collection. They grant nothing usable, as the pods mount no token.
"""

from __future__ import annotations

from typing import Any

from kanri.postgres import names
from kanri.postgres.children import child_meta, owned
from kanri.postgres.labels import cluster_labels

__all__ = ["service_account"]

Obj = dict[str, Any]


def service_account(cluster: Obj) -> Obj:
    """The ServiceAccount ``<cluster>-instance`` the instance pods run as, with no token mounted."""
    name = cluster["metadata"]["name"]
    meta = child_meta(cluster, names.service_account(name), cluster_labels(name))
    return owned("v1", "ServiceAccount", meta, automountServiceAccountToken=False)
