"""The scheduler's filter checks and kube-scheduler's message, on plain dicts."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from kanri.local.node import fit

Obj = dict[str, Any]


def node(labels: dict[str, str] | None = None, taints: list[Obj] | None = None, **spec: Any) -> Obj:
    return {"metadata": {"name": "n1", "labels": labels or {}}, "spec": {"taints": taints or [], **spec}}


def pod(**spec: Any) -> Obj:
    return {"metadata": {"name": "p", "namespace": "ns"}, "spec": {"containers": [{"name": "c"}], **spec}}


def term(*expressions: Obj, fields: list[Obj] | None = None) -> Obj:
    return {"matchExpressions": list(expressions), "matchFields": fields or []}


def required(*terms: Obj) -> Obj:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


# --- selectors --------------------------------------------------------------------------------------------------------


def test_node_selector_needs_every_label_equal() -> None:
    labelled = node({"disk": "ssd", "zone": "a"})
    assert fit.check_node_selector(pod(nodeSelector={"disk": "ssd"}), labelled) is None
    assert fit.check_node_selector(pod(nodeSelector={"disk": "ssd", "zone": "b"}), labelled) == fit.REASON_SELECTOR
    assert fit.check_node_selector(pod(nodeSelector={"gpu": "yes"}), labelled) == fit.REASON_SELECTOR
    assert fit.check_node_selector(pod(), labelled) is None


@pytest.mark.parametrize(
    ("expression", "matches"),
    [
        ({"key": "disk", "operator": "In", "values": ["ssd", "nvme"]}, True),
        ({"key": "disk", "operator": "In", "values": ["hdd"]}, False),
        ({"key": "disk", "operator": "NotIn", "values": ["hdd"]}, True),
        ({"key": "absent", "operator": "NotIn", "values": ["x"]}, True),
        ({"key": "disk", "operator": "Exists"}, True),
        ({"key": "absent", "operator": "Exists"}, False),
        ({"key": "absent", "operator": "DoesNotExist"}, True),
        ({"key": "cores", "operator": "Gt", "values": ["4"]}, True),
        ({"key": "cores", "operator": "Lt", "values": ["4"]}, False),
        ({"key": "disk", "operator": "Gt", "values": ["4"]}, False),  # not a number: no match
    ],
)
def test_node_affinity_operators(expression: Obj, matches: bool) -> None:
    labelled = node({"disk": "ssd", "cores": "8"})
    assert (fit.check_node_selector(pod(affinity=required(term(expression))), labelled) is None) is matches


def test_affinity_terms_are_ored_and_their_expressions_anded() -> None:
    labelled = node({"disk": "ssd", "zone": "a"})
    ssd = {"key": "disk", "operator": "In", "values": ["ssd"]}
    zone_b = {"key": "zone", "operator": "In", "values": ["b"]}
    assert fit.check_node_selector(pod(affinity=required(term(ssd, zone_b))), labelled) == fit.REASON_SELECTOR
    assert fit.check_node_selector(pod(affinity=required(term(zone_b), term(ssd))), labelled) is None


def test_an_empty_term_matches_nothing_and_match_fields_see_the_node_name() -> None:
    assert not fit.term_matches({}, node())
    by_name = term(fields=[{"key": "metadata.name", "operator": "In", "values": ["n1"]}])
    assert fit.term_matches(by_name, node())
    assert fit.selector_matches(None, node())
    assert not fit.selector_matches({"nodeSelectorTerms": []}, node())


# --- taints -----------------------------------------------------------------------------------------------------------

TAINT = {"key": "dedicated", "value": "db", "effect": "NoSchedule"}


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "dedicated", "operator": "Equal", "value": "db", "effect": "NoSchedule"}, True),
        ({"key": "dedicated", "value": "db"}, True),  # Equal is the default operator; no effect means any
        ({"key": "dedicated", "operator": "Equal", "value": "web"}, False),
        ({"key": "dedicated", "operator": "Exists"}, True),
        ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"operator": "Exists"}, True),  # empty key + Exists tolerates everything
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_tolerations_match_taints_like_kubernetes(toleration: Obj, tolerated: bool) -> None:
    assert fit.tolerates(toleration, TAINT) is tolerated


def test_only_no_schedule_and_no_execute_taints_filter() -> None:
    soft = {"key": "soft", "effect": "PreferNoSchedule"}
    hard = {"key": "hard", "effect": "NoExecute"}
    assert fit.check_taints(pod(), node(taints=[soft])) is None
    assert fit.check_taints(pod(), node(taints=[soft, hard])) == fit.REASON_TAINT
    assert fit.untolerated_taint([], [soft, hard]) == hard
    assert fit.check_taints(pod(tolerations=[{"key": "hard", "operator": "Exists"}]), node(taints=[hard])) is None


def test_a_cordoned_node_takes_only_pods_tolerating_it() -> None:
    cordoned = node(unschedulable=True)
    assert fit.check_unschedulable(pod(), cordoned) == fit.REASON_UNSCHEDULABLE
    toleration = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    assert fit.check_unschedulable(pod(tolerations=[toleration]), cordoned) is None
    assert fit.check_unschedulable(pod(), node()) is None


# --- resources --------------------------------------------------------------------------------------------------------


def test_resources_report_each_shortage_and_the_pod_limit() -> None:
    allocatable = {"cpu": Decimal(4), "memory": Decimal(8 << 30), "pods": Decimal(2)}
    used = {"cpu": Decimal("3.5"), "memory": Decimal(1 << 30)}
    assert fit.check_resources({"cpu": Decimal("0.5")}, allocatable, used, pods_on_node=1) == []
    assert fit.check_resources({"cpu": Decimal("0.6")}, allocatable, used, pods_on_node=1) == ["Insufficient cpu"]
    assert fit.check_resources({"nvidia.com/gpu": Decimal(1)}, allocatable, used, pods_on_node=2) == [
        "Too many pods",
        "Insufficient nvidia.com/gpu",
    ]


# --- volumes ----------------------------------------------------------------------------------------------------------


def test_claims_must_exist_be_bound_and_live_on_this_node() -> None:
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}, {"name": "scratch", "ephemeral": {}}]
    waiting = pod(volumes=volumes)
    assert fit.claim_names(waiting) == ["data", "p-scratch"]
    bound: Obj = {"metadata": {}, "spec": {"volumeName": "pv1"}, "status": {"phase": "Bound"}}
    here = {"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        term(fields=[{"key": "metadata.name", "operator": "In", "values": ["n1"]}])]}}}}  # fmt: skip
    elsewhere = {"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": [
        term(fields=[{"key": "metadata.name", "operator": "In", "values": ["n2"]}])]}}}}  # fmt: skip

    assert fit.check_volumes(waiting, {"data": bound}, {"pv1": here}, node()) == (
        'persistentvolumeclaim "p-scratch" not found',
        None,
    )
    claims = {"data": bound, "p-scratch": bound}
    assert fit.check_volumes(waiting, claims, {"pv1": here}, node()) == (None, None)
    assert fit.check_volumes(waiting, claims, {"pv1": elsewhere}, node()) == (None, fit.REASON_VOLUME_NODE)
    pending = {"metadata": {}, "spec": {}, "status": {"phase": "Pending"}}
    assert fit.check_volumes(waiting, {"data": pending}, {}, node()) == (fit.REASON_UNBOUND_CLAIMS, None)
    deleting = {**bound, "metadata": {"deletionTimestamp": "2026-01-01T00:00:00Z"}}
    assert (
        fit.check_volumes(waiting, {"data": deleting}, {}, node())[0] == 'persistentvolumeclaim "data" is being deleted'
    )


# --- the message ------------------------------------------------------------------------------------------------------


def test_the_message_reads_like_kube_scheduler() -> None:
    assert fit.unschedulable_message([fit.REASON_TAINT, "Insufficient cpu", fit.REASON_TAINT]) == (
        "0/1 nodes are available: 1 Insufficient cpu, 1 node(s) had untolerated taint(s)."
    )
    assert fit.unschedulable_message([fit.REASON_TAINT], pre_filter=fit.REASON_UNBOUND_CLAIMS) == (
        "0/1 nodes are available: pod has unbound immediate PersistentVolumeClaims."
    )
