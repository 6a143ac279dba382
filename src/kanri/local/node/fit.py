"""Whether a Pod fits a Node: the scheduler's filter checks, as pure functions over raw objects.

Each check returns the reason kube-scheduler would give (the same words, so messages look familiar), or None when
the pod passes. Covered: ``spec.unschedulable`` (cordon), ``nodeSelector`` and required node affinity, taints
(``NoSchedule``/``NoExecute``) against tolerations, and resource requests against what is left. Not covered:
inter-pod (anti-)affinity and topology spread constraints — with one node, there is nothing to spread over.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal, InvalidOperation
from typing import Any

from kanri.local.node.resources import insufficient

Obj = dict[str, Any]

REASON_UNSCHEDULABLE = "node(s) were unschedulable"
REASON_SELECTOR = "node(s) didn't match Pod's node affinity/selector"
REASON_TAINT = "node(s) had untolerated taint(s)"
REASON_TOO_MANY_PODS = "Too many pods"
REASON_VOLUME_NODE = "node(s) didn't match PersistentVolume's node affinity"

_UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
_FILTERED_EFFECTS = ("NoSchedule", "NoExecute")  # PreferNoSchedule only scores; it never filters


# --- node selectors -------------------------------------------------------------------------------------------------


def _requirement_matches(requirement: Mapping[str, Any], values: Mapping[str, str]) -> bool:
    key, operator = requirement.get("key", ""), requirement.get("operator", "")
    wanted: Sequence[str] = requirement.get("values") or ()
    present = key in values
    if operator == "In":
        return present and values[key] in wanted
    if operator == "NotIn":
        return not present or values[key] not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            actual, bound = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return False  # an unknown operator never matches (the API server validates them anyway)


def term_matches(term: Mapping[str, Any], node: Obj) -> bool:
    """One ``NodeSelectorTerm``: all its requirements hold. A term with none matches nothing (as in kube)."""
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False
    labels = node["metadata"].get("labels") or {}
    node_fields = {"metadata.name": node["metadata"]["name"]}
    return all(_requirement_matches(r, labels) for r in expressions) and all(
        _requirement_matches(r, node_fields) for r in fields
    )


def selector_matches(selector: Mapping[str, Any] | None, node: Obj) -> bool:
    """A ``NodeSelector``: any of its terms matches. None (no selector) matches every node."""
    if selector is None:
        return True
    return any(term_matches(term, node) for term in selector.get("nodeSelectorTerms") or ())


def check_node_selector(pod: Obj, node: Obj) -> str | None:
    """``spec.nodeSelector`` (every label equal) and required node affinity must both hold."""
    spec = pod.get("spec") or {}
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(key) != value for key, value in (spec.get("nodeSelector") or {}).items()):
        return REASON_SELECTOR
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return None if selector_matches(required, node) else REASON_SELECTOR


# --- taints and tolerations -----------------------------------------------------------------------------------------


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether one toleration tolerates one taint (k8s.io/api's ``Toleration.ToleratesTaint``)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"  # an empty key with Exists tolerates everything
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    if operator in ("Gt", "Lt"):
        try:
            actual, bound = Decimal(taint.get("value") or ""), Decimal(toleration.get("value") or "")
        except InvalidOperation:
            return False
        return actual > bound if operator == "Gt" else actual < bound
    return False


def untolerated_taint(tolerations: Iterable[Mapping[str, Any]], taints: Iterable[Mapping[str, Any]]) -> Obj | None:
    """The first ``NoSchedule``/``NoExecute`` taint no toleration tolerates, or None."""
    tolerations = list(tolerations)
    for taint in taints:
        if taint.get("effect") in _FILTERED_EFFECTS and not any(tolerates(t, taint) for t in tolerations):
            return dict(taint)
    return None


def check_unschedulable(pod: Obj, node: Obj) -> str | None:
    """A cordoned node (``spec.unschedulable``) takes only pods tolerating the unschedulable taint."""
    if not (node.get("spec") or {}).get("unschedulable"):
        return None
    tolerations = (pod.get("spec") or {}).get("tolerations") or ()
    return None if any(tolerates(t, _UNSCHEDULABLE_TAINT) for t in tolerations) else REASON_UNSCHEDULABLE


def check_taints(pod: Obj, node: Obj) -> str | None:
    tolerations = (pod.get("spec") or {}).get("tolerations") or ()
    taints = (node.get("spec") or {}).get("taints") or ()
    return None if untolerated_taint(tolerations, taints) is None else REASON_TAINT


# --- resources ------------------------------------------------------------------------------------------------------


def check_resources(
    requested: Mapping[str, Decimal],
    allocatable: Mapping[str, Decimal],
    used: Mapping[str, Decimal],
    pods_on_node: int,
) -> list[str]:
    """``Too many pods`` and one ``Insufficient <resource>`` per resource that does not fit."""
    reasons = []
    if pods_on_node + 1 > allocatable.get("pods", Decimal(0)):
        reasons.append(REASON_TOO_MANY_PODS)
    wanted = {name: amount for name, amount in requested.items() if name != "pods"}
    reasons.extend(f"Insufficient {name}" for name in insufficient(wanted, allocatable, used))
    return reasons


# --- volumes --------------------------------------------------------------------------------------------------------

REASON_UNBOUND_CLAIMS = "pod has unbound immediate PersistentVolumeClaims"


def claim_names(pod: Obj) -> list[str]:
    """The PersistentVolumeClaims a pod mounts, including generic ephemeral volumes (claim ``<pod>-<volume>``)."""
    names = []
    for volume in (pod.get("spec") or {}).get("volumes") or ():
        if claim := volume.get("persistentVolumeClaim"):
            names.append(str(claim["claimName"]))
        elif "ephemeral" in volume:
            names.append(f"{pod['metadata']['name']}-{volume['name']}")
    return names


def check_volumes(
    pod: Obj, claims: Mapping[str, Obj | None], volumes: Mapping[str, Obj | None], node: Obj
) -> tuple[str | None, str | None]:
    """(reason before any node is considered, reason about this node) for the pod's claims.

    ``claims`` maps each of :func:`claim_names` to its PVC (None: missing); ``volumes`` maps PV names to PVs. A
    claim must exist, not be deleting and be Bound (our StorageClasses bind immediately); its volume's node
    affinity must admit this node (a ``local`` PV lives on one node's disk).
    """
    for name in claim_names(pod):
        claim = claims.get(name)
        if claim is None:
            return f'persistentvolumeclaim "{name}" not found', None
        if claim["metadata"].get("deletionTimestamp"):
            return f'persistentvolumeclaim "{name}" is being deleted', None
        volume_name = (claim.get("spec") or {}).get("volumeName")
        if (claim.get("status") or {}).get("phase") != "Bound" or not volume_name:
            return REASON_UNBOUND_CLAIMS, None
        volume = volumes.get(volume_name)
        if volume is None:
            return REASON_UNBOUND_CLAIMS, None
        affinity = ((volume.get("spec") or {}).get("nodeAffinity") or {}).get("required")
        if not selector_matches(affinity, node):
            return None, REASON_VOLUME_NODE
    return None, None


# --- the message ----------------------------------------------------------------------------------------------------


def unschedulable_message(node_reasons: Iterable[str], *, pre_filter: str | None = None) -> str:
    """kube-scheduler's wording for our one node: ``0/1 nodes are available: 1 node(s) had untolerated taint(s).``

    ``pre_filter`` is a reason that holds before any node is looked at (an unbound PersistentVolumeClaim); it
    replaces the per-node reasons, as in kube-scheduler. Per-node reasons are counted (once each) and sorted.
    """
    message = "0/1 nodes are available:"
    if pre_filter:
        return f"{message} {pre_filter}."
    counted = sorted(f"1 {reason}" for reason in dict.fromkeys(node_reasons))
    return f"{message} {', '.join(counted)}." if counted else message
