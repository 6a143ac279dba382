"""The Kafka operator's API rights: the one list the Helm chart's ClusterRole (deploy/helm/kanri/templates/kafka/) is
checked against, and that is checked against the code (tests/unit/test_kafka_chart.py: the kinds both controllers
watch, and the writes kanri.kafka and the kit helpers it calls send).

A new client call without its grant, or a grant no code needs, fails there rather than in a cluster. The brokers
are reached over the Kafka protocol, not the API: no right of the operator is about them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kanri import runtime as kr
from kanri.kafka.api import CLUSTER_KIND, TOPIC_KIND
from kanri.runtime.kinds import CONFIG_MAP, EVENT, LEASE, POD, PVC, SERVICE, STATEFUL_SET

__all__ = ["LEADER_ELECTION", "WATCHED", "WRITES", "Permission", "permissions"]


@dataclass(frozen=True)
class Permission:
    """Verbs the operator needs on a kind, or on one of its subresources (``status``, ``finalizers``)."""

    kind: kr.Kind
    subresource: str
    verbs: frozenset[str]


def _grant(kind: kr.Kind, *verbs: str, subresource: str = "") -> Permission:
    return Permission(kind, subresource, frozenset(verbs))


# What the two controllers watch, each needing list + watch for its informer: the clusters and topics, the children
# a cluster owns, and the broker pods and volumes it maps back by label.
WATCHED: tuple[kr.Kind, ...] = (CLUSTER_KIND, TOPIC_KIND, STATEFUL_SET, SERVICE, CONFIG_MAP, POD, PVC)
# Every write the operator sends, per kind. Server-side apply is a PATCH that creates a missing object (kit's
# children.apply patches again when the apply dropped a field), so an applied kind needs create and patch.
WRITES: tuple[Permission, ...] = (
    # finalizer add/remove (kit.finalize: JSON patches, a re-read after a conflict), then the status ledger
    _grant(CLUSTER_KIND, "get", "patch"),
    _grant(CLUSTER_KIND, "patch", subresource="status"),
    _grant(TOPIC_KIND, "get", "patch"),
    _grant(TOPIC_KIND, "patch", subresource="status"),
    # blockOwnerDeletion on the cluster's children's owner references, where OwnerReferencesPermissionEnforcement is on
    _grant(CLUSTER_KIND, "update", subresource="finalizers"),
    # applied; the KRaft cluster id's ConfigMap is created once, and released or deleted with the volumes
    _grant(CONFIG_MAP, "create", "patch", "delete"),
    _grant(SERVICE, "create", "patch"),
    _grant(STATEFUL_SET, "create", "patch"),
    _grant(PVC, "patch", "delete"),  # the brokers' volumes: released or deleted at the cluster's deletion
    _grant(POD, "delete"),  # a rolling restart deletes one broker's pod at a time
    _grant(EVENT, "create", "patch"),  # the runtime's EventRecorder: a new Event, then its count
)
# Leader election (the runtime's LeaderElector): only in the operator's own namespace, so a Role of its own.
LEADER_ELECTION: tuple[Permission, ...] = (_grant(LEASE, "get", "create", "update"),)


def permissions() -> dict[tuple[kr.Kind, str], frozenset[str]]:
    """Everything the operator needs outside leader election: list + watch on :data:`WATCHED`, plus :data:`WRITES`."""
    needed: dict[tuple[kr.Kind, str], frozenset[str]] = {(kind, ""): frozenset({"list", "watch"}) for kind in WATCHED}
    for permission in WRITES:
        key = (permission.kind, permission.subresource)
        needed[key] = needed.get(key, frozenset()) | permission.verbs
    return needed
