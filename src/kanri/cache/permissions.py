"""The Cache operator's API rights: the one list the Helm chart's ClusterRole (deploy/helm/kanri/templates/cache/)
is checked against, and that is checked against the code (tests/unit/test_cache_chart.py: the kinds
:func:`kanri.cache.operator.controller` watches, and the writes kanri.cache and the kit helpers it calls send).

A new client call without its grant, or a grant no code needs, fails there rather than in a cluster.
"""

from __future__ import annotations

from kanri import runtime as kr
from kanri.cache.api import KIND
from kanri.kit import Permission, grant, needed
from kanri.runtime.kinds import (
    CONFIG_MAP,
    EVENT,
    LEASE,
    POD,
    PVC,
    ROLE,
    ROLE_BINDING,
    SECRET,
    SERVICE,
    SERVICE_ACCOUNT,
    STATEFUL_SET,
)

__all__ = ["LEADER_ELECTION", "WATCHED", "WRITES", "Permission", "permissions"]


# What the controller watches, each needing list + watch for its informer: the Cache, the children it owns (the
# agents' ServiceAccount, Role and RoleBinding among them), and the pods, claims and password it maps back by label.
WATCHED: tuple[kr.Kind, ...] = (
    KIND,
    CONFIG_MAP,
    SERVICE,
    STATEFUL_SET,
    SERVICE_ACCOUNT,
    ROLE,
    ROLE_BINDING,
    POD,
    PVC,
    SECRET,
)
# Every write the operator sends, per kind. Server-side apply is a PATCH that creates a missing object, and kit's
# children.apply patches again when the apply dropped a field, so an applied kind needs create and patch. Nothing
# is ever replaced (no update) but the owner's finalizers, and no verb reaches into a pod (no exec).
WRITES: tuple[Permission, ...] = (
    # finalizer add/remove (kit.finalize: JSON patches); the status ledger re-reads the Cache after a conflict
    grant(KIND, "get", "patch"),
    grant(KIND, "patch", subresource="status"),
    # blockOwnerDeletion on the children's owner references, where OwnerReferencesPermissionEnforcement is on
    grant(KIND, "update", subresource="finalizers"),
    grant(CONFIG_MAP, "create", "patch"),  # applied
    grant(SERVICE, "create", "patch"),  # applied
    grant(STATEFUL_SET, "create", "patch"),  # applied
    # the agents' identity, applied per Cache (garbage-collected with it). The Role lets an agent get + patch its
    # own pods; RBAC lets the operator grant only what it holds itself, hence get + patch on pods below.
    grant(SERVICE_ACCOUNT, "create", "patch"),
    grant(ROLE, "create", "patch"),
    grant(ROLE_BINDING, "create", "patch"),
    # the password: created once, not owned; at the Cache's deletion released or deleted (deletionPolicy)
    grant(SECRET, "create", "patch", "delete"),
    grant(PVC, "patch", "delete"),  # the volumes the StatefulSet creates: released or deleted (deletionPolicy)
    # role labels that steer -rw and -ro; a rolling replace deletes the pod it replaces; get: see the Role above
    grant(POD, "get", "patch", "delete"),
    grant(EVENT, "create", "patch"),  # the runtime's EventRecorder: a new Event, then its count
)
# Leader election (the runtime's LeaderElector): only in the operator's own namespace, so a Role of its own.
LEADER_ELECTION: tuple[Permission, ...] = (grant(LEASE, "get", "create", "update"),)


def permissions() -> dict[tuple[kr.Kind, str], frozenset[str]]:
    """Everything the operator needs outside leader election: list + watch on :data:`WATCHED`, plus :data:`WRITES`."""
    return needed(WATCHED, WRITES)
