"""The instances' identity: a ServiceAccount without an automounted token, and a Role that may only ``get`` the
cluster's own ConfigMap and Secrets by name. The instance manager does not call the API today; this is the least it
could need, so a compromised pod can read nothing else."""

from __future__ import annotations

from typing import Any

from kanri.postgres import names
from kanri.postgres.children import child_meta, owned
from kanri.postgres.labels import cluster_labels

__all__ = ["rbac"]

Obj = dict[str, Any]
RBAC_API = "rbac.authorization.k8s.io/v1"


def rbac(cluster: Obj) -> list[Obj]:
    """ServiceAccount, Role and RoleBinding, all named ``<cluster>-instance``."""
    name = cluster["metadata"]["name"]
    account = names.service_account(name)
    labels = cluster_labels(name)
    secrets = [names.superuser_secret(name), names.replication_secret(name), names.app_secret(name),
               names.api_secret(name)]  # fmt: skip
    rules = [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": [names.config_map(name)], "verbs": ["get"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": secrets, "verbs": ["get"]},
    ]
    return [
        owned("v1", "ServiceAccount", child_meta(cluster, account, labels), automountServiceAccountToken=False),
        owned(RBAC_API, "Role", child_meta(cluster, account, labels), rules=rules),
        owned(
            RBAC_API,
            "RoleBinding",
            child_meta(cluster, account, labels),
            roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": account},
            subjects=[{"kind": "ServiceAccount", "name": account, "namespace": cluster["metadata"]["namespace"]}],
        ),
    ]
