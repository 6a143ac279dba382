"""The cluster's NetworkPolicy as built: its shape, and what it lets in, read with NetworkPolicy's own semantics
(a connection is allowed when some ingress rule has a peer matching the source and a port matching the target)."""

from __future__ import annotations

from typing import Any

import pytest
from typer.testing import CliRunner

from kanri.cli import run as run_module
from kanri.cli.main import app
from kanri.postgres.children.networkpolicy import network_policy
from kanri.postgres.operator import OperatorOptions

Obj = dict[str, Any]
UID = "0d3c5a4e-0000-4000-8000-000000000001"
CLUSTER = {"apiVersion": "kanri.dev/v1alpha1", "kind": "PostgresCluster",
           "metadata": {"name": "orders", "namespace": "shop", "uid": UID}, "spec": {}}  # fmt: skip
INSTANCE = {"kanri.dev/cluster": "orders", "kanri.dev/instance": "orders-2", "app.kubernetes.io/name": "postgresql"}
OPERATOR = {"app.kubernetes.io/name": "kanri-operator", "pod-template-hash": "5d9"}


def _selects(selector: Obj | None, labels: dict[str, str]) -> bool:
    if selector is None:
        return True
    assert set(selector) <= {"matchLabels", "matchExpressions"}
    for expression in selector.get("matchExpressions") or ():
        assert expression["operator"] == "DoesNotExist", "the evaluator knows no other operator"
        if expression["key"] in labels:
            return False
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _peer_matches(peer: Obj, namespace: str, labels: dict[str, str]) -> bool:
    if "namespaceSelector" in peer:
        namespace_labels = {"kubernetes.io/metadata.name": namespace}
        return _selects(peer["namespaceSelector"], namespace_labels) and _selects(peer.get("podSelector"), labels)
    return namespace == "shop" and _selects(peer["podSelector"], labels)  # a podSelector alone: the policy's namespace


def admits(policy: Obj, namespace: str, labels: dict[str, str], port: int, target: dict[str, str] = INSTANCE) -> bool:
    spec = policy["spec"]
    if not _selects(spec["podSelector"], target):
        return True  # not a pod this policy isolates
    return any(
        ("from" not in rule or any(_peer_matches(peer, namespace, labels) for peer in rule["from"]))  # no from: all
        and any(p["port"] == port and p["protocol"] == "TCP" for p in rule["ports"])
        for rule in spec.get("ingress") or []
    )


def test_one_ingress_policy_over_the_clusters_pods_owned_by_the_cluster() -> None:
    policy = network_policy(CLUSTER)
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    assert (policy["metadata"]["name"], policy["metadata"]["namespace"]) == ("orders", "shop")
    (ref,) = policy["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["uid"], ref["controller"]) == ("PostgresCluster", UID, True)
    assert policy["spec"]["podSelector"] == {"matchLabels": {"kanri.dev/cluster": "orders",
                                                             "app.kubernetes.io/name": "postgresql"}}  # fmt: skip
    assert policy["spec"]["policyTypes"] == ["Ingress"]  # egress stays open (DNS, -rw, object stores)


@pytest.mark.parametrize(
    ("namespace", "labels", "port", "allowed"),
    [
        ("shop", {"app": "web"}, 5432, True),  # an application in the namespace
        ("shop", {"app": "web"}, 8008, False),  # ... never the instance API
        ("monitoring", {"app": "prometheus"}, 9187, True),  # the exporter, from wherever Prometheus runs
        ("monitoring", {"app": "prometheus"}, 5432, False),
        ("other", {"app": "web"}, 5432, False),  # another namespace
        ("shop", INSTANCE, 5432, True),  # replication between the instances
        ("kanri-system", OPERATOR, 8008, True),  # the operator reaches the instance API
        ("kanri-system", OPERATOR, 5432, False),  # ... and nothing else
        ("kanri-system", {"app": "other"}, 8008, False),  # another pod of the operator's namespace
        ("elsewhere", OPERATOR, 8008, False),  # the operator's labels in another namespace
        ("shop", {"app": "web"}, 22, False),  # any other port
    ],
)
def test_the_namespace_reaches_postgresql_and_only_the_operator_the_api(
    namespace: str, labels: dict[str, str], port: int, allowed: bool
) -> None:
    assert admits(network_policy(CLUSTER), namespace, labels, port) is allowed


def test_allowed_clients_replace_the_namespace_but_never_cut_replication() -> None:
    web = [{"podSelector": {"matchLabels": {"app": "web"}}}]
    policy = network_policy(CLUSTER, clients=web)
    assert admits(policy, "shop", {"app": "web"}, 5432)
    assert not admits(policy, "shop", {"app": "batch"}, 5432)
    assert admits(policy, "shop", INSTANCE, 5432)
    assert admits(policy, "kanri-system", OPERATOR, 8008)
    none = network_policy(CLUSTER, clients=[])
    assert not admits(none, "shop", {"app": "web"}, 5432)
    assert admits(none, "shop", INSTANCE, 5432)


@pytest.mark.parametrize("home", ["kanri-system", "platform-ops", "default"])
def test_the_operator_is_admitted_from_the_namespace_it_is_given_and_no_other(home: str) -> None:
    # A chart installed into any namespace: `kanri run` passes POD_NAMESPACE down (not a hard-coded kanri-system).
    policy = network_policy(CLUSTER, operator_namespace=home)
    assert admits(policy, home, OPERATOR, 8008)
    assert not admits(policy, home, OPERATOR, 5432)  # the API only
    for elsewhere in {"kanri-system", "platform-ops", "default", "shop"} - {home}:
        assert not admits(policy, elsewhere, OPERATOR, 8008), elsewhere


def test_another_operator_namespace_and_labels_are_honoured() -> None:
    policy = network_policy(CLUSTER, operator_namespace="ops", operator_labels={"app": "kanri"})
    assert admits(policy, "ops", {"app": "kanri"}, 8008)
    assert not admits(policy, "kanri-system", OPERATOR, 8008)


def test_another_clusters_instances_are_only_clients() -> None:
    other = {"kanri.dev/cluster": "billing", "kanri.dev/instance": "billing-1"}
    policy = network_policy(CLUSTER, clients=[])
    assert not admits(policy, "shop", other, 5432)


def test_kanri_run_hands_its_own_namespace_to_the_operator(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[OperatorOptions] = []

    async def capture(kubeconfig: str | None, options: OperatorOptions) -> None:
        seen.append(options)  # stop before connecting: only the options are under test

    monkeypatch.setattr(run_module, "_run", capture)
    # structlog would keep writing to the runner's stream, closed after the invocation, in every later test
    monkeypatch.setattr(run_module, "configure_logging", lambda level: None)
    result = CliRunner().invoke(app, ["run", "--leader-election-namespace", "leases"],
                                env={"POD_NAMESPACE": "platform-ops"})  # fmt: skip
    assert result.exit_code == 0, result.output
    (options,) = seen
    # the policy's namespace is where the pod runs, even when the Lease is kept elsewhere
    assert (options.operator_namespace, options.leader_election_namespace) == ("platform-ops", "leases")
