"""PostgreSQL's labels and selectors: every selector also asks for ``app.kubernetes.io/name: postgresql``, so a
look-alike of another operator (same cluster name, same ``kanri.dev`` keys, another app name) is never selected;
objects made before the app name label keep being found, labelled in place, and routed to until every pod has it."""

from __future__ import annotations

from typing import Any

import pytest

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children.networkpolicy import network_policy
from kanri.postgres.children.pdb import disruption_budgets
from kanri.postgres.children.services import services
from kanri.postgres.children.statefulset import statefulset
from kanri.postgres.labels import (
    APP_NAME,
    CLUSTER,
    INSTANCE,
    MANAGED_BY,
    READS,
    ROLE,
    SERVES_READS,
    WITHHOLDS_READS,
    belongs,
    cluster_labels,
    foreign,
    instance_labels,
    isolates_by_app,
    missing_labels,
    role_selector,
    routes_by_app,
    routes_by_reads,
    selects_by_app,
    statefulset_by_app,
)
from kanri.postgres.operator import _by_cluster_label

Obj = dict[str, Any]
UID = "0d3c5a4e-0000-4000-8000-000000000002"
CLUSTER_OBJ: Obj = {"apiVersion": "kanri.dev/v1alpha1", "kind": "PostgresCluster",
                    "metadata": {"name": "orders", "namespace": "shop", "uid": UID}, "spec": {}}  # fmt: skip
SPEC = PostgresClusterSpec.model_validate({"version": 16, "replicas": 2, "storage": {"size": "1Gi"}})

# Another kanri operator's pod of a cluster also named "orders", reusing the kanri.dev keys (the worst case).
LOOKALIKE = {CLUSTER: "orders", INSTANCE: "orders-1", ROLE: "primary", APP_NAME: "valkey", MANAGED_BY: "kanri"}
# A pod the operator made before the app name label existed.
OLDER = {CLUSTER: "orders", INSTANCE: "orders-1", ROLE: "primary", MANAGED_BY: "kanri"}


def obj(labels: dict[str, str]) -> Obj:
    return {"metadata": {"name": "x", "namespace": "shop", "labels": dict(labels)}}


def selects(selector: Obj, labels: dict[str, str]) -> bool:
    """A LabelSelector (or a Service's plain map) evaluated as the API server does: matchLabels and the
    matchExpressions this code uses."""
    match = selector.get("matchLabels", selector if "matchExpressions" not in selector else {})
    if not all(labels.get(k) == v for k, v in match.items()):
        return False
    for expression in selector.get("matchExpressions") or ():
        assert expression["operator"] == "DoesNotExist", expression
        if expression["key"] in labels:
            return False
    return True


def pod_labels(sts: Obj) -> dict[str, str]:
    return dict(sts["spec"]["template"]["metadata"]["labels"])


def spreading(sts: Obj) -> list[Obj]:
    anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    return list(anti["preferredDuringSchedulingIgnoredDuringExecution"])


def test_every_child_carries_the_postgresql_app_name_with_the_kanri_dev_keys() -> None:
    assert cluster_labels("orders") == {CLUSTER: "orders", APP_NAME: "postgresql",
                                        "app.kubernetes.io/instance": "orders", MANAGED_BY: "kanri"}  # fmt: skip
    assert instance_labels("orders", "orders-1") == {**cluster_labels("orders"), INSTANCE: "orders-1"}


def test_the_older_instance_labels_are_exactly_those_of_before_the_app_name() -> None:
    # A StatefulSet made then keeps them in its pod template: anything else would restart its pod.
    assert instance_labels("orders", "orders-1", by_app=False) == {CLUSTER: "orders", MANAGED_BY: "kanri",
                                                                   INSTANCE: "orders-1"}  # fmt: skip


@pytest.mark.parametrize("role", ["primary", "replica", "fenced", None])
def test_role_selectors_never_match_a_lookalike_of_another_app(role: str | None) -> None:
    selector = role_selector("orders", role)
    assert selector[APP_NAME] == "postgresql"
    assert not selects(selector, {**LOOKALIKE, ROLE: role or "primary"})
    assert selects(selector, {**instance_labels("orders", "orders-1"), ROLE: role or "primary"})


def test_services_select_by_app_name_and_never_the_lookalike() -> None:
    by_name = {s["metadata"]["name"]: s for s in services(CLUSTER_OBJ)}
    assert set(by_name) == {"orders-rw", "orders-ro", "orders-r"}
    ours = {**instance_labels("orders", "orders-1"), ROLE: "primary", READS: SERVES_READS}
    for service in by_name.values():
        assert service["spec"]["selector"][APP_NAME] == "postgresql"
        assert not selects(service["spec"]["selector"], LOOKALIKE)
    assert selects(by_name["orders-rw"]["spec"]["selector"], ours)
    assert selects(by_name["orders-r"]["spec"]["selector"], ours)
    assert not selects(by_name["orders-ro"]["spec"]["selector"], ours)
    assert all(s["metadata"]["labels"][APP_NAME] == "postgresql" for s in by_name.values())


def test_read_services_select_the_reads_label_once_every_pod_carries_it() -> None:
    # a cluster made before kanri.dev/reads: its Services switch only once no pod would drop out of -ro and -r
    labelled = {"metadata": {"labels": {READS: SERVES_READS}}}
    unlabelled: dict[str, Any] = {"metadata": {"labels": {}}}
    old_ro = {"spec": {"selector": {CLUSTER: "orders", ROLE: "replica"}}}
    assert not routes_by_reads(old_ro, [labelled, unlabelled])
    assert routes_by_reads(old_ro, [labelled, labelled])
    assert routes_by_reads(None, [])  # a new cluster
    new_ro = {"spec": {"selector": {CLUSTER: "orders", ROLE: "replica", READS: SERVES_READS}}}
    assert routes_by_reads(new_ro, [unlabelled])  # once switched, a new unlabelled pod does not switch it back
    withheld = {**instance_labels("orders", "orders-2"), ROLE: "replica", READS: WITHHOLDS_READS}
    ro = next(s for s in services(CLUSTER_OBJ) if s["metadata"]["name"] == "orders-ro")
    assert not selects(ro["spec"]["selector"], withheld)
    assert selects(ro["spec"]["selector"], {**withheld, READS: SERVES_READS})


def test_older_services_keep_the_selector_that_still_routes_to_unlabelled_pods() -> None:
    rw = next(s for s in services(CLUSTER_OBJ, by_app=False) if s["metadata"]["name"] == "orders-rw")
    assert rw["spec"]["selector"] == {CLUSTER: "orders", ROLE: "primary"}
    assert selects(rw["spec"]["selector"], OLDER)


def test_budgets_select_by_app_name_and_never_the_lookalike() -> None:
    for budget in disruption_budgets(CLUSTER_OBJ):
        selector = budget["spec"]["selector"]
        assert selector["matchLabels"][APP_NAME] == "postgresql"
        assert not selects(selector, LOOKALIKE)
        assert not selects(selector, {**LOOKALIKE, ROLE: "replica"})
    older = disruption_budgets(CLUSTER_OBJ, by_app=False)
    assert selects(older[0]["spec"]["selector"], OLDER)


def test_a_new_statefulset_selects_by_app_name_and_its_template_matches_its_selector() -> None:
    sts = statefulset(CLUSTER_OBJ, SPEC, "orders-1", role="primary", image="kanri.dev/postgres:16", running=True)
    selector = sts["spec"]["selector"]
    assert selector == {"matchLabels": {CLUSTER: "orders", APP_NAME: "postgresql", INSTANCE: "orders-1"}}
    assert selects(selector, pod_labels(sts))  # the API server refuses a template its selector does not match
    assert not selects(selector, LOOKALIKE)
    assert statefulset_by_app(sts)
    terms = spreading(sts)
    assert all(t["podAffinityTerm"]["labelSelector"]["matchLabels"][APP_NAME] == "postgresql" for t in terms)


def test_an_older_statefulset_keeps_its_selector_and_pod_template() -> None:
    new = statefulset(CLUSTER_OBJ, SPEC, "orders-1", role="primary", image="kanri.dev/postgres:16", running=True)
    old = statefulset(CLUSTER_OBJ, SPEC, "orders-1", role="primary", image="kanri.dev/postgres:16", running=True,
                      by_app=False)  # fmt: skip
    assert old["spec"]["selector"] == {"matchLabels": {CLUSTER: "orders", INSTANCE: "orders-1"}}  # immutable
    assert pod_labels(old) == {CLUSTER: "orders", MANAGED_BY: "kanri", INSTANCE: "orders-1"}
    terms = spreading(old)
    assert all(t["podAffinityTerm"]["labelSelector"] == {"matchLabels": {CLUSTER: "orders"}} for t in terms)
    assert not statefulset_by_app(old)
    assert statefulset_by_app(None)  # one still to make gets the stricter selector
    # nothing else differs: the StatefulSet object's own labels may change in place
    assert old["metadata"]["labels"] == new["metadata"]["labels"]
    old_spec = {**old["spec"]["template"]["spec"], "affinity": None}
    assert old_spec == {**new["spec"]["template"]["spec"], "affinity": None}


def test_the_network_policy_admits_older_and_newer_instances_but_not_the_lookalike() -> None:
    policy = network_policy(CLUSTER_OBJ)
    isolated = policy["spec"]["podSelector"]
    assert selects(isolated, {**instance_labels("orders", "orders-1"), ROLE: "primary"})
    assert not selects(isolated, LOOKALIKE)  # another app's pod is not put under PostgreSQL's policy
    replication = next(rule for rule in policy["spec"]["ingress"]
                       if any("podSelector" in p and "namespaceSelector" not in p and p["podSelector"]
                              for p in rule.get("from") or ()))  # fmt: skip
    peers = [p["podSelector"] for p in replication["from"]]
    assert any(selects(peer, instance_labels("orders", "orders-2")) for peer in peers)
    assert any(selects(peer, OLDER) for peer in peers)  # an instance not labelled yet still replicates
    assert not any(selects(peer, LOOKALIKE) for peer in peers)
    older = network_policy(CLUSTER_OBJ, by_app=False)
    assert selects(older["spec"]["podSelector"], OLDER)  # an unlabelled pod is never left without a policy


def test_belongs_takes_postgresql_and_older_objects_never_another_apps() -> None:
    assert belongs(obj(instance_labels("orders", "orders-1")), "orders")
    assert belongs(obj(OLDER), "orders")
    assert not belongs(obj(LOOKALIKE), "orders")
    assert not belongs(obj(instance_labels("billing", "billing-1")), "orders")
    assert foreign(obj(LOOKALIKE))
    assert not foreign(obj(OLDER))
    assert not foreign(obj({}))


def test_missing_labels_are_what_an_older_object_lacks_and_nothing_of_another_apps() -> None:
    assert missing_labels(obj(OLDER), "orders") == {APP_NAME: "postgresql", "app.kubernetes.io/instance": "orders"}
    assert missing_labels(obj(instance_labels("orders", "orders-1")), "orders") == {}
    assert missing_labels(obj(OLDER), "billing") == {}
    assert missing_labels(obj(LOOKALIKE), "orders") == {}  # a Valkey claim is never relabelled
    # a pod its StatefulSet proves ours, given another app name by a pod template label: replaced
    assert missing_labels(obj(LOOKALIKE), "orders", owned=True)[APP_NAME] == "postgresql"


def _service(by_app: bool) -> Obj:
    return next(s for s in services(CLUSTER_OBJ, by_app=by_app) if s["metadata"]["name"] == "orders-rw")


def test_services_switch_only_once_every_pod_carries_the_app_name_and_then_stay() -> None:
    labelled = obj(instance_labels("orders", "orders-1"))
    assert routes_by_app(None, [])  # a new cluster: by app name from the start
    assert not routes_by_app(_service(False), [labelled, obj(OLDER)])  # one pod still unlabelled: keep routing it
    assert routes_by_app(_service(False), [labelled])
    assert routes_by_app(_service(True), [labelled, obj(OLDER)])  # switched: a recreated older pod waits for its patch
    assert not routes_by_app(_service(False), [obj({**OLDER, APP_NAME: "orders-db"})])  # its app name is replaced first


def test_the_network_policy_switches_once_no_statefulset_makes_unlabelled_pods() -> None:
    new = statefulset(CLUSTER_OBJ, SPEC, "orders-2", role="replica", image="kanri.dev/postgres:16", running=True)
    old = statefulset(CLUSTER_OBJ, SPEC, "orders-1", role="primary", image="kanri.dev/postgres:16", running=True,
                      by_app=False)  # fmt: skip
    assert isolates_by_app([])
    assert isolates_by_app([new])
    assert not isolates_by_app([new, old])


def test_selects_by_app_reads_both_selector_shapes() -> None:
    assert selects_by_app({"matchLabels": {APP_NAME: "postgresql"}})
    assert selects_by_app({APP_NAME: "postgresql", CLUSTER: "orders"})
    assert not selects_by_app({CLUSTER: "orders"})
    assert not selects_by_app(None)
    assert not selects_by_app({"matchLabels": {APP_NAME: "valkey"}})


def test_another_apps_objects_never_wake_the_postgresql_cluster_of_that_name() -> None:
    assert _by_cluster_label(obj(LOOKALIKE)) == []
    assert [r.name for r in _by_cluster_label(obj(OLDER))] == ["orders"]
    assert [r.name for r in _by_cluster_label(obj(instance_labels("orders", "orders-1")))] == ["orders"]
