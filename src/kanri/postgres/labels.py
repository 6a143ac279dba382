"""Labels the operator puts on its children, and the selectors built from them.

The keys are :data:`POSTGRES`, a :class:`kanri.kit.LabelSet`: ``kanri.dev/cluster``, ``kanri.dev/instance`` and
``kanri.dev/role``, plus ``app.kubernetes.io/name: postgresql`` on every child and in every selector, so no other
kanri operator's objects of the same cluster name (a Valkey ``orders``) are ever routed to, counted or deleted. The
keys stay in ``kanri.dev``, PostgreSQL's since the first release: renaming them would change every StatefulSet's
selector, which the API server refuses in place; the app name alone keeps other operators out.

``kanri.dev/cluster`` and ``kanri.dev/instance`` are fixed for an object's life (StatefulSet selectors are
immutable); ``kanri.dev/role`` is set on pods only, by the operator, from what each instance manager reports, so the
``-rw`` and ``-ro`` Services follow a failover without touching a StatefulSet. ``fenced`` is selected by neither:
an instance fenced after a split brain gets no traffic (``-r``, "any instance", still selects it, but a fenced
instance's PostgreSQL is stopped and its pod not ready).

Objects made before the app name label existed (docs/postgres-operator.md, "Labels and selectors") carry the cluster
label and no app name at all: they are still this cluster's (:func:`belongs`), the operator adds the label in place
(:func:`missing_labels`), and Services, budgets and the NetworkPolicy select by app name only once nothing relies on
the older selector (:func:`routes_by_app`, :func:`isolates_by_app`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal

from kanri.kit import APP_INSTANCE, APP_NAME, MANAGED_BY, LabelSet
from kanri.postgres import names
from kanri.runtime import Cache, Kind, controller_of, is_controlled_by
from kanri.runtime.kinds import POD, SERVICE, STATEFUL_SET

__all__ = ["APP_NAME", "CLUSTER", "FENCED", "INSTANCE", "MANAGED_BY", "POSTGRES", "PRIMARY", "READS", "REPLICA",
           "ROLE", "SERVES_READS", "WITHHOLDS_READS", "Role", "belongs", "cluster_labels", "cluster_routes_by_app",
           "cluster_routes_by_reads", "cluster_selector", "foreign", "instance_labels", "instance_selector",
           "isolates_by_app", "missing_labels", "of_cluster", "role_selector", "routes_by_app", "routes_by_reads",
           "runs_instance", "selects_by_app", "statefulset_by_app"]  # fmt: skip

POSTGRES = LabelSet("kanri.dev", "postgresql")
CLUSTER = POSTGRES.owner
INSTANCE = POSTGRES.key("instance")
ROLE = POSTGRES.key("role")
READS = POSTGRES.key("reads")
"""On pods only, set by the operator: ``serve`` or ``withheld`` (a replica too far behind in replay, or not
streaming: :mod:`kanri.postgres.ha.reads`). ``-ro`` and ``-r`` select ``serve`` (:func:`routes_by_reads`)."""
SERVES_READS = "serve"
WITHHOLDS_READS = "withheld"

Role = Literal["primary", "replica"]
PRIMARY: Role = "primary"
REPLICA: Role = "replica"
FENCED = "fenced"
"""A pod label value only (never a bootstrap role): the instance was fenced."""

Obj = dict[str, Any]


def cluster_labels(cluster: str) -> dict[str, str]:
    """On every child: which cluster it belongs to, that it is PostgreSQL's, and who manages it."""
    return POSTGRES.labels(cluster)


def instance_labels(cluster: str, instance: str, *, by_app: bool = True) -> dict[str, str]:
    """On an instance's StatefulSet, pod template and PVC; ``by_app=False``: those of before the app name label (the
    pod template of a StatefulSet made then, which keeps them)."""
    if not by_app:
        return {CLUSTER: cluster, MANAGED_BY: POSTGRES.managed_by, INSTANCE: instance}
    return POSTGRES.labels(cluster, instance=instance)


def cluster_selector(cluster: str, *, by_app: bool = True) -> dict[str, str]:
    """Selects the cluster's objects; ``by_app=False`` is the selector of before the app name label (which would
    also select another operator's objects carrying ``kanri.dev/cluster``)."""
    return POSTGRES.selector(cluster) if by_app else {CLUSTER: cluster}


def role_selector(cluster: str, role: str | None, *, by_app: bool = True) -> dict[str, str]:
    """Selects the cluster's pods with ``role`` (every instance when None)."""
    selector = cluster_selector(cluster, by_app=by_app)
    if role is not None:
        selector[ROLE] = role
    return selector


def instance_selector(cluster: str, instance: str, *, by_app: bool = True) -> dict[str, str]:
    """Selects one instance's pod (a StatefulSet's ``spec.selector``)."""
    return {**cluster_selector(cluster, by_app=by_app), INSTANCE: instance}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    return (obj.get("metadata") or {}).get("labels") or {}


def foreign(obj: Mapping[str, Any]) -> bool:
    """Whether ``obj``'s app name says it is another application's (a Valkey pod, a Kafka claim)."""
    return _labels(obj).get(APP_NAME, POSTGRES.app) != POSTGRES.app


def belongs(obj: Mapping[str, Any], cluster: str) -> bool:
    """Whether ``obj`` is ``cluster``'s: it names the cluster and carries PostgreSQL's app name, or no app name at
    all (made before the label existed; every other kanri operator's objects carry theirs)."""
    return _labels(obj).get(CLUSTER) == cluster and not foreign(obj)


def of_cluster(cache: Cache, kind: Kind, namespace: str, cluster: str) -> list[Obj]:
    """The cluster's objects of ``kind`` in the cache (:func:`belongs`): never another operator's of the same name."""
    return [obj for obj in cache.list(kind, namespace, {CLUSTER: cluster}) if not foreign(obj)]


def runs_instance(cache: Cache, cluster: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    """Whether ``pod`` is the pod of a StatefulSet ``cluster`` controls: the cluster's by ownership, whatever its
    labels say (a pod template label may have given an older pod another app name)."""
    ref = controller_of(pod)
    if ref is None or ref.get("kind") != STATEFUL_SET.kind:
        return False
    sts = cache.get(STATEFUL_SET, str(ref.get("name")), str((pod.get("metadata") or {}).get("namespace") or ""))
    return sts is not None and is_controlled_by(pod, sts) and is_controlled_by(sts, cluster)


def missing_labels(obj: Mapping[str, Any], cluster: str, *, owned: bool = False) -> dict[str, str]:
    """The app labels ``cluster``'s object made before they existed lacks (empty when it has them, or is not the
    cluster's): added in place, they let the stricter selectors find it. ``owned``: ownership proves the object the
    cluster's (:func:`runs_instance`), so another app name on it is replaced too."""
    labels = _labels(obj)
    if labels.get(CLUSTER) != cluster or labels.get(APP_NAME) == POSTGRES.app or (APP_NAME in labels and not owned):
        return {}
    return {APP_NAME: POSTGRES.app, APP_INSTANCE: cluster}


def selects_by_app(selector: Mapping[str, Any] | None) -> bool:
    """Whether a selector (a Service's map, or a ``LabelSelector``'s ``matchLabels``) asks for the app name."""
    selector = selector or {}
    match = selector.get("matchLabels", selector)
    return isinstance(match, Mapping) and match.get(APP_NAME) == POSTGRES.app


def statefulset_by_app(sts: Mapping[str, Any] | None) -> bool:
    """Whether a StatefulSet selects its pod by app name (None, one still to make: it will)."""
    return sts is None or selects_by_app((sts.get("spec") or {}).get("selector"))


def routes_by_app(read_write: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the Services and budgets select by app name: once they do, they keep doing so; before that, once
    every pod of the cluster carries the label — switching earlier would drop an unlabelled pod's traffic.

    ``read_write`` is the ``-rw`` Service in the cache (None for a new cluster), ``pods`` the cluster's (by labels
    or by ownership, as :func:`cluster_routes_by_app` finds them). After the switch a pod an older StatefulSet
    makes without the label gets it in the same patch as its role, before ``-rw`` or ``-ro`` could select it anyway."""
    if read_write is not None and selects_by_app((read_write.get("spec") or {}).get("selector")):
        return True
    return all(_labels(pod).get(APP_NAME) == POSTGRES.app for pod in pods)


def cluster_routes_by_app(cache: Cache, cluster: Mapping[str, Any]) -> bool:
    """:func:`routes_by_app` for ``cluster`` as the cache has it: its pods by labels, and by ownership."""
    namespace, name = cluster["metadata"]["namespace"], cluster["metadata"]["name"]
    read_write = cache.get(SERVICE, names.read_write_service(name), namespace)
    pods = [pod for pod in cache.list(POD, namespace, {CLUSTER: name})
            if belongs(pod, name) or runs_instance(cache, cluster, pod)]  # fmt: skip
    return routes_by_app(read_write, pods)


def routes_by_reads(read_only: Mapping[str, Any] | None, pods: Iterable[Mapping[str, Any]]) -> bool:
    """Whether ``-ro`` and ``-r`` select :data:`READS` ``serve``: once they do, they keep doing so; before that, once
    every pod of the cluster carries the label (a cluster made before it existed: its pods are labelled first, so
    no replica's reads are dropped by the switch)."""
    if read_only is not None and READS in ((read_only.get("spec") or {}).get("selector") or {}):
        return True
    return all(READS in _labels(pod) for pod in pods)


def cluster_routes_by_reads(cache: Cache, cluster: Mapping[str, Any]) -> bool:
    """:func:`routes_by_reads` for ``cluster`` as the cache has it."""
    namespace, name = cluster["metadata"]["namespace"], cluster["metadata"]["name"]
    read_only = cache.get(SERVICE, names.read_only_service(name), namespace)
    pods = [pod for pod in cache.list(POD, namespace, {CLUSTER: name})
            if belongs(pod, name) or runs_instance(cache, cluster, pod)]  # fmt: skip
    return routes_by_reads(read_only, pods)


def isolates_by_app(statefulsets: Iterable[Mapping[str, Any]]) -> bool:
    """Whether the NetworkPolicy selects the cluster's pods by app name: only once no StatefulSet of the cluster
    still makes pods without the label (one made before it existed keeps its selector and template), since a pod no
    policy selects accepts traffic from anywhere until it is labelled."""
    return all(statefulset_by_app(sts) for sts in statefulsets)
