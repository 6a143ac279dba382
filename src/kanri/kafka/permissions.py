"""The Kafka operator's API rights: the one list the Helm chart's ClusterRole (deploy/helm/kanri/templates/kafka/) is
checked against, and that is checked against the code (tests/unit/test_kafka_chart.py: the kinds both controllers
watch, and the writes kanri.kafka and the kit helpers it calls send).

A new client call without its grant, or a grant no code needs, fails there rather than in a cluster. The brokers
are reached over the Kafka protocol, not the API: no right of the operator is about them.
"""

from __future__ import annotations

from kanri import runtime as kr
from kanri.kafka.api import CLUSTER_KIND, TOPIC_KIND
from kanri.kit import Permission, grant, needed
from kanri.runtime.kinds import CONFIG_MAP, EVENT, LEASE, POD, PVC, SECRET, SERVICE, STATEFUL_SET

__all__ = ["LEADER_ELECTION", "WATCHED", "WRITES", "Permission", "permissions"]


# What the two controllers watch, each needing list + watch for its informer: the clusters and topics, the children
# a cluster owns, and the broker pods and volumes it maps back by label.
WATCHED: tuple[kr.Kind, ...] = (CLUSTER_KIND, TOPIC_KIND, STATEFUL_SET, SERVICE, CONFIG_MAP, SECRET, POD, PVC)
# Every write the operator sends, per kind. Server-side apply is a PATCH that creates a missing object (kit's
# children.apply patches again when the apply dropped a field), so an applied kind needs create and patch.
WRITES: tuple[Permission, ...] = (
    # finalizer add/remove (kit.finalize: JSON patches, a re-read after a conflict), then the status ledger
    grant(CLUSTER_KIND, "get", "patch"),
    grant(CLUSTER_KIND, "patch", subresource="status"),
    grant(TOPIC_KIND, "get", "patch"),
    grant(TOPIC_KIND, "patch", subresource="status"),
    # blockOwnerDeletion on the cluster's children's owner references, where OwnerReferencesPermissionEnforcement is on
    grant(CLUSTER_KIND, "update", subresource="finalizers"),
    # applied; the KRaft cluster id's ConfigMap is created once, and released or deleted with the volumes
    grant(CONFIG_MAP, "create", "patch", "delete"),
    grant(SERVICE, "create", "patch"),
    grant(SECRET, "get", "create", "patch"),  # TLS on: the cluster's CA (created once, read back) and certificate
    grant(STATEFUL_SET, "create", "patch"),
    grant(PVC, "patch", "delete"),  # the brokers' volumes: released or deleted at the cluster's deletion
    grant(POD, "delete"),  # a rolling restart deletes one broker's pod at a time
    grant(EVENT, "create", "patch"),  # the runtime's EventRecorder: a new Event, then its count
)
# Leader election (the runtime's LeaderElector): only in the operator's own namespace, so a Role of its own.
LEADER_ELECTION: tuple[Permission, ...] = (grant(LEASE, "get", "create", "update"),)


def permissions() -> dict[tuple[kr.Kind, str], frozenset[str]]:
    """Everything the operator needs outside leader election: list + watch on :data:`WATCHED`, plus :data:`WRITES`."""
    return needed(WATCHED, WRITES)
