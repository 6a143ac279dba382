"""The cluster's NetworkPolicy (``<cluster>``): who may reach its instance pods, and on which port.

Ingress only, four rules, nothing else allowed in:

- PostgreSQL (5432) from the cluster's namespace — or, when ``clients`` is given, only from those peers (selectors
  the user allows, e.g. an application's pods or another namespace);
- PostgreSQL (5432) between the cluster's own instances (streaming replication, cloning, pg_rewind), whatever
  ``clients`` says;
- the instance manager's API (8008) from the operator's pods only: its own namespace (``operator_namespace``, which
  ``kanri run`` resolves from ``POD_NAMESPACE``, the chart's downward-API variable) and the chart's pod label
  ``app.kubernetes.io/name: kanri-operator``. An operator run outside the cluster (``kanri run`` on a laptop, no
  ``POD_NAMESPACE``: ``default``) is no pod, so where the policy is enforced nothing admits it to 8008 — run it
  in-cluster there;
- the instance exporter (9187) from anywhere: Prometheus runs in a namespace of the platform's choosing, and the
  metrics hold no credential or row.

Egress is left open: an instance reaches ``<cluster>-rw`` (its own pods, through the Service), DNS and, for
backups, an object store that this policy cannot know. The kubelet's probes come from the node, which network
plugins allow regardless. The local cluster does not enforce NetworkPolicy (docs/postgres-operator.md).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kanri.postgres.children import child_meta, owned
from kanri.postgres.children.services import POSTGRES_PORT
from kanri.postgres.children.statefulset import HTTP_PORT, METRICS_PORT
from kanri.postgres.labels import APP_NAME, cluster_labels, cluster_selector

__all__ = ["OPERATOR_LABELS", "OPERATOR_NAMESPACE", "network_policy", "network_policy_name"]

Obj = dict[str, Any]

OPERATOR_NAMESPACE = "kanri-system"  # the chart's documented release namespace; only a default for direct callers
OPERATOR_LABELS: Mapping[str, str] = {"app.kubernetes.io/name": "kanri-operator"}
_NAMESPACE_NAME = "kubernetes.io/metadata.name"  # set by the API server on every namespace


def network_policy_name(cluster: str) -> str:
    return cluster


def _port(number: int) -> Obj:
    return {"protocol": "TCP", "port": number}


def network_policy(
    cluster: Obj,
    *,
    clients: Sequence[Obj] | None = None,
    operator_namespace: str = OPERATOR_NAMESPACE,
    operator_labels: Mapping[str, str] = OPERATOR_LABELS,
    by_app: bool = True,
) -> Obj:
    """The policy for ``cluster``. ``clients``: NetworkPolicy peers allowed to reach PostgreSQL instead of the whole
    namespace (an empty list: none but the instances themselves). ``operator_namespace`` and ``operator_labels``:
    the operator's pods, the only peers allowed to the instance API (the reconciler passes the namespace the
    operator runs in). ``by_app``: the policy selects the pods by app name too (:func:`kanri.postgres.labels.
    isolates_by_app` says when an older cluster's may)."""
    name = cluster["metadata"]["name"]
    # Peers are ORed: the instances by app name, and those made before the label (which have no app name at all).
    legacy = {"key": APP_NAME, "operator": "DoesNotExist"}
    unlabelled = {"matchLabels": cluster_selector(name, by_app=False), "matchExpressions": [legacy]}
    instances = [{"podSelector": {"matchLabels": cluster_selector(name)}}, {"podSelector": unlabelled}]
    allowed = [dict(peer) for peer in clients] if clients is not None else [{"podSelector": {}}]
    operator = {
        "namespaceSelector": {"matchLabels": {_NAMESPACE_NAME: operator_namespace}},
        "podSelector": {"matchLabels": dict(operator_labels)},
    }
    ingress: list[Obj] = []
    if allowed:
        ingress.append({"from": allowed, "ports": [_port(POSTGRES_PORT)]})
    ingress += [
        {"from": instances, "ports": [_port(POSTGRES_PORT)]},
        {"from": [operator], "ports": [_port(HTTP_PORT)]},
        {"ports": [_port(METRICS_PORT)]},
    ]
    isolated = {"matchLabels": cluster_selector(name, by_app=by_app)}
    spec = {"podSelector": isolated, "policyTypes": ["Ingress"], "ingress": ingress}
    meta = child_meta(cluster, network_policy_name(name), cluster_labels(name))
    return owned("networking.k8s.io/v1", "NetworkPolicy", meta, spec=spec)
