"""The Helm chart's Kafka operator (deploy/helm/kanri/templates/kafka/, values ``kafka``): off by default; on, its
ClusterRole grants exactly :func:`kanri.kafka.permissions.permissions`, which is itself exactly what the code uses
(the kinds both controllers watch, the writes kanri.kafka and the kit helpers it calls send); its Deployment runs
``kanri.kafka.operator`` from the operator image with arguments its command line accepts. Rendered by the real helm
(tests/helm_support.py); and deploy/operator/kafka/kafka-operator.yaml is the chart's render.

Regenerate deploy/operator/kafka/kafka-operator.yaml after editing the chart: ``python -m tests.unit.test_kafka_chart``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import typing

import yaml

from kanri import runtime as kr
from kanri.kafka.api import CLUSTER_KIND, TOPIC_KIND, KafkaClusterSpec
from kanri.kafka.cluster.children import IMAGE, IMAGES_ENV
from kanri.kafka.cluster.reconciler import controller as cluster_controller
from kanri.kafka.permissions import LEADER_ELECTION, WATCHED, WRITES, permissions
from kanri.kafka.topics.reconciler import controller as topic_controller
from kanri.kit import image_for
from kanri.runtime import kinds as builtin_kinds
from kanri.runtime._connection import Connection
from tests.helm_support import (
    CHART,
    ROOT,
    Needed,
    Obj,
    as_grants,
    helm,
    named,
    of_kind,
    rule_grants,
    template,
    template_text,
    writes_in,
)

KAFKA_SRC = ROOT / "src" / "kanri" / "kafka"
MANIFEST = ROOT / "deploy" / "operator" / "kafka" / "kafka-operator.yaml"
# The values deploy/operator/kafka/kafka-operator.yaml is rendered with (release kanri in kanri-system); the file
# holds the documents whose source is templates/kafka/.
MANIFEST_VALUES = ("kafka.enabled=true", "createNamespace=true")
MANIFEST_HEADER = """\
# Generated from the Helm chart deploy/helm/kanri (templates/kafka/, kafka.enabled=true; release kanri, namespace
# kanri-system) by `python -m tests.unit.test_kafka_chart`: edit the chart, not this file. The Kafka operator
# without Helm, next to the PostgreSQL operator (whose namespace and metrics-auth role it uses):
#
#   kubectl apply --server-side -f deploy/crds/ -f deploy/operator/ -f deploy/operator/kafka/
#
# It has a folder of its own so that deploy/operator/ alone (kanri up, kubectl apply -f deploy/operator/) still
# installs the PostgreSQL operator only (docs/kafka.md, "Installing").
"""
ENABLED = ("kafka.enabled=true",)
NAME = "kanri-kafka-operator"
KIND_CONSTANTS: dict[str, kr.Kind] = {
    name: value for name, value in vars(builtin_kinds).items() if isinstance(value, kr.Kind)
} | {"CLUSTER_KIND": CLUSTER_KIND, "TOPIC_KIND": TOPIC_KIND}  # fmt: skip
# What the kit and runtime send on the operator's behalf, outside kanri.kafka: kit.finalize patches the finalizer of
# both kinds (and re-reads after a conflict); the status ledger patches status; owner references with
# blockOwnerDeletion on the cluster's children need finalizers/update; kit.carry_out deletes or releases (patches)
# the claims and the cluster id's ConfigMap per deletionPolicy (kit.data_of(..., [PVC, CONFIG_MAP], ...)); the
# EventRecorder creates Events and patches their count.
KIT_WRITES: Needed = {
    (CLUSTER_KIND, ""): frozenset({"get", "patch"}),
    (CLUSTER_KIND, "status"): frozenset({"patch"}),
    (CLUSTER_KIND, "finalizers"): frozenset({"update"}),
    (TOPIC_KIND, ""): frozenset({"get", "patch"}),
    (TOPIC_KIND, "status"): frozenset({"patch"}),
    (builtin_kinds.PVC, ""): frozenset({"patch", "delete"}),
    (builtin_kinds.CONFIG_MAP, ""): frozenset({"patch", "delete"}),
    (builtin_kinds.EVENT, ""): frozenset({"create", "patch"}),
}


def container(objects: list[Obj]) -> Obj:
    (only,) = named(objects, "Deployment", NAME)["spec"]["template"]["spec"]["containers"]
    found: Obj = only
    return found


def test_off_by_default_the_chart_renders_nothing_of_the_kafka_operator() -> None:
    text = template_text()
    assert "templates/kafka/" not in text
    assert "kafka-operator" not in text


def test_the_chart_lints_with_the_kafka_operator_and_every_kafka_template_renders() -> None:
    result = helm("lint", "--strict", str(CHART), "--set", "kafka.enabled=true")
    assert "0 chart(s) failed" in result.stdout, result.stdout
    everything = template_text(*ENABLED, "monitoring.serviceMonitor.enabled=true")
    for path in sorted((CHART / "templates" / "kafka").glob("*.yaml")):
        assert f"# Source: kanri/templates/kafka/{path.name}" in everything, f"{path.name} renders nothing"


def test_the_cluster_role_is_exactly_the_permission_table() -> None:
    objects = template(*ENABLED)
    role = named(objects, "ClusterRole", NAME)
    assert rule_grants(role["rules"]) == as_grants(permissions()), (
        f"chart grants beyond the table: {rule_grants(role['rules']) - as_grants(permissions())}; "
        f"in the table but not granted: {as_grants(permissions()) - rule_grants(role['rules'])}"
    )
    binding = named(objects, "ClusterRoleBinding", NAME)
    assert binding["roleRef"]["name"] == NAME
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": "kanri-system"}]
    lease = named(objects, "Role", f"{NAME}-leader-election")
    assert lease["metadata"]["namespace"] == "kanri-system"
    assert rule_grants(lease["rules"]) == as_grants({(p.kind, p.subresource): p.verbs for p in LEADER_ELECTION})


def test_namespaced_mode_grants_the_table_in_each_watched_namespace_only_and_watches_just_those() -> None:
    objects = template(*ENABLED, "watchNamespaces={team-a,team-b}")
    assert [r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"] == NAME] == []
    assert [b for b in of_kind(objects, "ClusterRoleBinding") if b["metadata"]["name"] == NAME] == []
    roles = {r["metadata"]["namespace"]: r for r in of_kind(objects, "Role") if r["metadata"]["name"] == NAME}
    assert sorted(roles) == ["team-a", "team-b"]
    for role in roles.values():
        assert rule_grants(role["rules"]) == as_grants(permissions())
    bindings = [b for b in of_kind(objects, "RoleBinding") if b["metadata"]["name"] == NAME]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert container(objects)["args"][-2:] == ["--namespace=team-a", "--namespace=team-b"]


def test_the_table_watches_what_both_controllers_watch() -> None:
    manager = kr.Manager(kr.Client(Connection(host="http://127.0.0.1:1")), kr.ManagerOptions(name="t"))
    watched = {*cluster_controller(manager).kinds, *topic_controller(manager, registry=manager.registry).kinds}
    assert sorted(k.plural for k in watched) == sorted(k.plural for k in WATCHED)


def test_the_write_table_is_exactly_the_writes_the_code_sends() -> None:
    found, generic = writes_in(KAFKA_SRC, KIND_CONSTANTS, skip="broker")
    assert generic == [], f"writes whose kind this test cannot read: {generic}"
    in_code: Needed = dict(found)
    for key, verbs in KIT_WRITES.items():
        in_code[key] = in_code.get(key, frozenset()) | verbs
    table: Needed = {}
    for p in WRITES:
        table[(p.kind, p.subresource)] = table.get((p.kind, p.subresource), frozenset()) | p.verbs
    missing = {k: v - table.get(k, frozenset()) for k, v in in_code.items() if v - table.get(k, frozenset())}
    unused = {k: v - in_code.get(k, frozenset()) for k, v in table.items() if v - in_code.get(k, frozenset())}
    assert not missing, f"writes the code sends that WRITES lacks: {as_grants(missing)}"
    assert not unused, f"writes WRITES lists that no code sends: {as_grants(unused)}"


def test_the_operator_holds_no_right_to_rbac_or_into_pods_and_of_secrets_only_what_tls_needs() -> None:
    granted = as_grants(permissions())
    # TLS: the cluster's CA (created once, read back) and the brokers' certificate; never delete, update or list
    # beyond the informer's list + watch
    assert {v for _, r, v in granted if r == "secrets"} == {"get", "list", "watch", "create", "patch"}
    assert not {r for _, r, _ in granted if r in ("roles", "rolebindings", "clusterroles",
                                                  "pods/exec", "pods/attach", "pods/portforward", "nodes",
                                                  "namespaces", "serviceaccounts/token")}  # fmt: skip
    assert not {v for *_, v in granted if v in ("bind", "escalate", "impersonate", "*")}
    assert {r for _, r, v in granted if v == "update"} == {"kafkaclusters/finalizers"}


def test_the_deployment_runs_the_kafka_operator_from_the_operator_image() -> None:
    objects = template(*ENABLED)
    postgres = named(objects, "Deployment", "kanri-operator")["spec"]["template"]["spec"]["containers"][0]
    kafka = container(objects)
    deployment = named(objects, "Deployment", NAME)
    pod = deployment["spec"]["template"]
    assert kafka["image"] == postgres["image"], "one operator image holds every operator"
    assert kafka["command"] == ["/usr/bin/python3", "-m", "kanri.kafka.operator"]
    assert kafka["args"] == ["--health-host=0.0.0.0", "--health-port=8084", "--log-level=info", "--metrics-auth"]
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in kafka["env"]
    assert pod["spec"]["serviceAccountName"] == NAME
    assert (
        pod["metadata"]["labels"]
        == deployment["spec"]["selector"]["matchLabels"]
        == {"app.kubernetes.io/name": "kanri-kafka-operator"}
    )
    assert kafka["securityContext"] == postgres["securityContext"]
    auth = named(objects, "ClusterRoleBinding", f"{NAME}-metrics-auth")
    assert auth["roleRef"]["name"] == "kanri-operator-metrics-auth"


def test_the_operator_accepts_the_arguments_the_chart_passes() -> None:
    """The Deployment's args are parsed by the real command line: it gets past argparse and fails only at the
    missing kubeconfig (argparse exits 2 with "usage:" on an unknown or malformed argument)."""
    args = container(template(*ENABLED, "watchNamespaces={team-a,team-b}"))["args"]
    result = subprocess.run(
        [sys.executable, "-m", "kanri.kafka.operator", *args, "--kubeconfig", "/nonexistent/kubeconfig"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode not in (0, 2), result.stderr[-2000:]
    assert "usage:" not in result.stderr, result.stderr[-2000:]
    assert "nonexistent" in result.stderr, result.stderr[-2000:]


def test_users_get_kafka_clusters_and_topics_through_the_aggregated_roles() -> None:
    objects = template(*ENABLED)
    edit = named(objects, "ClusterRole", "kanri-kafka-edit")
    view = named(objects, "ClusterRole", "kanri-kafka-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert ("kanri.dev", "kafkatopics", "create") in rule_grants(edit["rules"])
    assert ("kanri.dev", "kafkaclusters/status", "patch") not in rule_grants(edit["rules"]), "status is the operator's"
    assert {v for _, _, v in rule_grants(view["rules"])} == {"get", "list", "watch"}


def test_the_operator_gets_a_pinned_broker_image_for_every_version_the_api_accepts() -> None:
    versions = list(typing.get_args(KafkaClusterSpec.model_fields["version"].annotation))
    env = {e["name"]: e.get("value") for e in container(template(*ENABLED))["env"]}
    table = json.loads(env[IMAGES_ENV])
    assert sorted(table) == sorted(versions)
    assert image_for(IMAGES_ENV, IMAGE, "4.4.0", {IMAGES_ENV: env[IMAGES_ENV]}) == "kanri.dev/kanri-kafka:4.4.0"
    digest = "sha256:" + "b" * 64
    pinned = template(*ENABLED, "image.registry=registry.example/kanri", f"kafka.brokers.digests.4\\.4\\.0={digest}")
    table = json.loads({e["name"]: e.get("value") for e in container(pinned)["env"]}[IMAGES_ENV])
    assert table == {"4.4.0": f"registry.example/kanri/kanri-kafka:4.4.0@{digest}"}


def test_metrics_service_servicemonitor_and_network_policy_select_the_kafka_operator_only() -> None:
    monitored = template(*ENABLED, "monitoring.serviceMonitor.enabled=true")
    service = named(monitored, "Service", f"{NAME}-metrics")
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "kanri-kafka-operator"}
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8084, "targetPort": "health"}]
    monitor = named(monitored, "ServiceMonitor", NAME)
    assert monitor["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    policy = named(template(*ENABLED), "NetworkPolicy", NAME)
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kanri-kafka-operator"}
    assert policy["spec"]["ingress"] == []
    scrapers = "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring"
    (rule,) = named(template(*ENABLED, scrapers), "NetworkPolicy", NAME)["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8084}]


def manifest_text() -> str:
    """What deploy/operator/kafka/kafka-operator.yaml holds: the header, then the documents of the chart's render
    whose source is templates/kafka/."""
    chunks = template_text(*MANIFEST_VALUES).split("---\n")
    kafka = [chunk for chunk in chunks if chunk.startswith("# Source: kanri/templates/kafka/")]
    return MANIFEST_HEADER + "".join(f"---\n{chunk.rstrip()}\n" for chunk in kafka)


def test_the_plain_manifest_is_the_charts_kafka_render() -> None:
    text = manifest_text()
    assert [d["kind"] for d in yaml.safe_load_all(text) if d].count("Deployment") == 1
    fix = "run `python -m tests.unit.test_kafka_chart` and commit it (edit the chart, not the file)"
    assert MANIFEST.read_text() == text, f"{MANIFEST.relative_to(ROOT)} is stale: {fix}"


if __name__ == "__main__":
    MANIFEST.write_text(manifest_text())
    print(f"wrote {MANIFEST.relative_to(ROOT)}", file=sys.stderr)
