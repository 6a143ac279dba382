"""The three Services: ``-rw`` (the primary), ``-ro`` (the replicas), ``-r`` (any instance), all on 5432.

They select pods by ``app.kubernetes.io/name: postgresql``, the cluster label and the ``kanri.dev/role`` label the
operator maintains from the instances' reported roles, so a failover moves ``-rw`` by relabelling two pods — no
Service or StatefulSet changes. ``-ro`` and ``-r`` also select ``kanri.dev/reads: serve``: a replica too far behind
in replay is relabelled ``withheld`` and gets no reads until it caught up (:mod:`kanri.postgres.ha.reads`).
"""

from __future__ import annotations

from typing import Any

from kanri.postgres import names
from kanri.postgres.children import child_meta, owned
from kanri.postgres.labels import PRIMARY, READS, REPLICA, SERVES_READS, Role, cluster_labels, role_selector

__all__ = ["POSTGRES_PORT", "services"]

Obj = dict[str, Any]
POSTGRES_PORT = 5432


def _service(cluster: Obj, name: str, role: Role | None, by_app: bool, reads: bool = False) -> Obj:
    cluster_name = cluster["metadata"]["name"]
    selector = role_selector(cluster_name, role, by_app=by_app)
    if reads:
        selector[READS] = SERVES_READS
    spec = {
        "type": "ClusterIP",
        "selector": selector,
        "ports": [{"name": "postgres", "port": POSTGRES_PORT, "targetPort": "postgres", "protocol": "TCP"}],
    }
    return owned("v1", "Service", child_meta(cluster, name, cluster_labels(cluster_name)), spec=spec)


def services(cluster: Obj, *, by_app: bool = True, by_reads: bool = True) -> list[Obj]:
    """``-rw``, ``-ro`` and ``-r`` for ``cluster``. ``by_app``: they select by app name too, so never another
    operator's pods (:func:`kanri.postgres.labels.routes_by_app` says when an older cluster's may); ``by_reads``:
    ``-ro`` and ``-r`` select only pods labelled to serve reads (:func:`kanri.postgres.labels.routes_by_reads`)."""
    name = cluster["metadata"]["name"]
    return [
        _service(cluster, names.read_write_service(name), PRIMARY, by_app),
        _service(cluster, names.read_only_service(name), REPLICA, by_app, by_reads),
        _service(cluster, names.read_service(name), None, by_app, by_reads),
    ]
