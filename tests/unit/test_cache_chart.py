"""The Helm chart's Cache operator (deploy/helm/kanri/templates/cache/, values ``cache``): off by default; on, its
ClusterRole grants exactly :func:`kanri.cache.permissions.permissions`, which is itself exactly what the code uses
(the kinds the controller watches, the writes kanri.cache and the kit helpers it calls send, and what the agents'
Role grants); its Deployment runs the Cache operator with arguments its command line accepts; and
deploy/operator/cache/cache-operator.yaml is the chart's render. Rendered by the real helm (tests/helm_support.py).

Regenerate deploy/operator/cache/cache-operator.yaml after editing the chart: ``python -m tests.unit.test_cache_chart``.
"""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from kanri import runtime as kr
from kanri.cache import children
from kanri.cache.api import KIND, VERSIONS
from kanri.cache.operator import controller
from kanri.cache.permissions import LEADER_ELECTION, WATCHED, WRITES, permissions
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

CACHE_SRC = ROOT / "src" / "kanri" / "cache"
MANIFEST = ROOT / "deploy" / "operator" / "cache" / "cache-operator.yaml"
# The values deploy/operator/cache/cache-operator.yaml is rendered with (release kanri in kanri-system); the file
# holds the documents whose source is templates/cache/.
MANIFEST_VALUES = ("cache.enabled=true", "createNamespace=true")
FIX_MANIFEST = "run `python -m tests.unit.test_cache_chart` and commit it (edit the chart, not the file)"
MANIFEST_HEADER = """\
# Generated from the Helm chart deploy/helm/kanri (templates/cache/, cache.enabled=true; release kanri, namespace
# kanri-system) by `python -m tests.unit.test_cache_chart`: edit the chart, not this file. The Cache (Valkey)
# operator without Helm, next to the PostgreSQL operator (whose namespace and metrics-auth role it uses):
#
#   kubectl apply --server-side -f deploy/crds/ -f deploy/operator/ -f deploy/operator/cache/
#
# It has a folder of its own so that deploy/operator/ alone (kanri up, kubectl apply -f deploy/operator/) still
# installs the PostgreSQL operator only (docs/cache.md, "Installing").
"""
ENABLED = ("cache.enabled=true",)
NAME = "kanri-cache-operator"


KIND_CONSTANTS: dict[str, kr.Kind] = {
    name: value for name, value in vars(builtin_kinds).items() if isinstance(value, kr.Kind)
} | {"KIND": KIND}  # fmt: skip
# What the kit and runtime send on the operator's behalf, outside kanri.cache: kit.finalize patches the finalizer
# (and re-reads the Cache after a conflict); the status ledger patches status (and re-reads); owner references with
# blockOwnerDeletion need finalizers/update; kit.carry_out deletes or releases (patches) the claims and the password
# per deletionPolicy (kit.data_of(..., [PVC, SECRET], ...)); the EventRecorder creates Events and patches their count.
KIT_WRITES: Needed = {
    (KIND, ""): frozenset({"get", "patch"}),
    (KIND, "status"): frozenset({"patch"}),
    (KIND, "finalizers"): frozenset({"update"}),
    (builtin_kinds.PVC, ""): frozenset({"patch", "delete"}),
    (builtin_kinds.SECRET, ""): frozenset({"patch", "delete"}),
    (builtin_kinds.EVENT, ""): frozenset({"create", "patch"}),
}


def writes_in_code() -> tuple[Needed, list[str]]:
    """(Every write the operator's part of kanri.cache sends, per kind; calls whose kind is not a constant). The
    in-pod agent (kanri.cache.agent) has its own identity and is not the operator."""
    return writes_in(CACHE_SRC, KIND_CONSTANTS, skip="agent")


def granted_to_agents() -> Needed:
    """What the agents' Role grants (RBAC lets the operator grant only what it holds itself)."""
    needed: Needed = {}
    by_resource = {(k.group, k.plural): k for k in KIND_CONSTANTS.values()}
    for rule in children.agent_role("c", 3)["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                key = (by_resource[(group, resource)], "")
                needed[key] = needed.get(key, frozenset()) | frozenset(rule["verbs"])
    return needed


def manifest_text() -> str:
    """What deploy/operator/cache/cache-operator.yaml holds: the header, then the documents of the chart's render
    whose source is templates/cache/."""
    chunks = template_text(*MANIFEST_VALUES).split("---\n")
    cached = [chunk for chunk in chunks if chunk.startswith("# Source: kanri/templates/cache/")]
    return MANIFEST_HEADER + "".join(f"---\n{chunk.rstrip()}\n" for chunk in cached)


def container(objects: list[Obj]) -> Obj:
    (only,) = named(objects, "Deployment", NAME)["spec"]["template"]["spec"]["containers"]
    found: Obj = only
    return found


def test_off_by_default_the_chart_renders_nothing_of_the_cache_operator() -> None:
    text = template_text()
    assert "templates/cache/" not in text
    assert "cache-operator" not in text


def test_the_chart_lints_with_the_cache_operator_and_every_cache_template_renders() -> None:
    result = helm("lint", "--strict", str(CHART), "--set", "cache.enabled=true")
    assert "0 chart(s) failed" in result.stdout, result.stdout
    everything = template_text(*ENABLED, "monitoring.serviceMonitor.enabled=true")
    for path in sorted((CHART / "templates" / "cache").glob("*.yaml")):
        assert f"# Source: kanri/templates/cache/{path.name}" in everything, f"{path.name} renders nothing"


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
    """watchNamespaces (the PostgreSQL operator's setting) makes the Cache operator namespaced too: a Role with the
    whole table in each namespace, no cluster-wide grant, and one --namespace per namespace."""
    objects = template(*ENABLED, "watchNamespaces={team-a,team-b}")
    assert [r for r in of_kind(objects, "ClusterRole") if r["metadata"]["name"] == NAME] == []
    assert [b for b in of_kind(objects, "ClusterRoleBinding") if b["metadata"]["name"] == NAME] == []
    roles = {r["metadata"]["namespace"]: r for r in of_kind(objects, "Role") if r["metadata"]["name"] == NAME}
    assert sorted(roles) == ["team-a", "team-b"]
    for role in roles.values():
        assert rule_grants(role["rules"]) == as_grants(permissions())
    bindings = [b for b in of_kind(objects, "RoleBinding") if b["metadata"]["name"] == NAME]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    assert all(b["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": "kanri-system"}]
               for b in bindings)  # fmt: skip
    assert container(objects)["args"][-2:] == ["--namespace=team-a", "--namespace=team-b"]


def test_the_table_watches_what_the_controller_watches() -> None:
    manager = kr.Manager(kr.Client(Connection(host="http://127.0.0.1:1")), kr.ManagerOptions(name="t"))
    watched = controller(manager).kinds
    assert sorted(k.plural for k in watched) == sorted(k.plural for k in WATCHED)


def test_the_write_table_is_exactly_the_writes_the_code_sends_and_the_rights_it_grants() -> None:
    found, generic = writes_in_code()
    assert generic == [], f"writes whose kind this test cannot read: {generic}"
    in_code: Needed = dict(found)
    for extra in (KIT_WRITES, granted_to_agents()):
        for key, verbs in extra.items():
            in_code[key] = in_code.get(key, frozenset()) | verbs
    table: Needed = {}
    for p in WRITES:
        table[(p.kind, p.subresource)] = table.get((p.kind, p.subresource), frozenset()) | p.verbs
    missing = {k: v - table.get(k, frozenset()) for k, v in in_code.items() if v - table.get(k, frozenset())}
    unused = {k: v - in_code.get(k, frozenset()) for k, v in table.items() if v - in_code.get(k, frozenset())}
    assert not missing, f"writes the code sends that WRITES lacks: {as_grants(missing)}"
    assert not unused, f"writes WRITES lists that no code sends: {as_grants(unused)}"


def test_the_operator_holds_no_right_to_escalate_or_reach_into_pods() -> None:
    granted = as_grants(permissions())
    rbac = {(r, v) for g, r, v in granted if g == "rbac.authorization.k8s.io"}
    assert {r for r, _ in rbac} <= {"roles", "rolebindings"}, "no ClusterRole or ClusterRoleBinding"
    assert not {v for _, v in rbac} & {"bind", "escalate", "update", "delete"}
    assert not {v for *_, v in granted if v in ("bind", "escalate", "impersonate", "*")}
    assert not {r for _, r, _ in granted if r in ("pods/exec", "pods/attach", "pods/portforward", "nodes",
                                                  "nodes/proxy", "namespaces", "serviceaccounts/token")}  # fmt: skip
    assert not {(r, v) for _, r, v in granted if v == "update" and r != "caches/finalizers"}


def test_the_deployment_runs_the_cache_operator_from_the_operator_image() -> None:
    objects = template(*ENABLED)
    postgres = named(objects, "Deployment", "kanri-operator")["spec"]["template"]["spec"]["containers"][0]
    cache = container(objects)
    deployment = named(objects, "Deployment", NAME)
    pod = deployment["spec"]["template"]
    assert cache["image"] == postgres["image"], "one operator image holds both operators"
    assert cache["command"] == ["/usr/bin/python3", "-m", "kanri.cache.operator"]
    assert cache["args"] == ["--health-host=0.0.0.0", "--health-port=8082", "--log-level=info", "--metrics-auth"]
    assert {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in cache["env"]
    assert pod["spec"]["serviceAccountName"] == NAME
    assert named(objects, "ServiceAccount", NAME)["metadata"]["namespace"] == "kanri-system"
    assert (
        pod["metadata"]["labels"]
        == deployment["spec"]["selector"]["matchLabels"]
        == {"app.kubernetes.io/name": "kanri-cache-operator"}
    )
    assert cache["readinessProbe"]["httpGet"]["port"] == "health"
    assert cache["ports"] == [{"name": "health", "containerPort": 8082}]
    assert cache["securityContext"] == postgres["securityContext"]
    # /metrics authenticated: the same TokenReview + SubjectAccessReview role as the PostgreSQL operator's
    auth = named(objects, "ClusterRoleBinding", f"{NAME}-metrics-auth")
    assert auth["roleRef"]["name"] == "kanri-operator-metrics-auth"
    assert auth["subjects"][0]["name"] == NAME
    open_metrics = template(*ENABLED, "monitoring.authenticateMetrics=false", "cache.logLevel=debug")
    assert container(open_metrics)["args"][-2:] == ["--log-level=debug", "--no-metrics-auth"]
    assert [
        b for b in of_kind(open_metrics, "ClusterRoleBinding") if b["metadata"]["name"].endswith("metrics-auth")
    ] == []


def test_the_operator_accepts_the_arguments_the_chart_passes() -> None:
    """The Deployment's args are parsed by the real command line: it gets past argparse and fails only at the
    missing kubeconfig (argparse exits 2 with "usage:" on an unknown or malformed argument)."""
    args = container(template(*ENABLED, "watchNamespaces={team-a,team-b}"))["args"]
    result = subprocess.run(
        [sys.executable, "-m", "kanri.cache.operator", *args, "--kubeconfig", "/nonexistent/kubeconfig"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode not in (0, 2), result.stderr[-2000:]
    assert "usage:" not in result.stderr, result.stderr[-2000:]
    assert "nonexistent" in result.stderr, result.stderr[-2000:]


def test_metrics_service_servicemonitor_and_network_policy_select_the_cache_operator_only() -> None:
    monitored = template(*ENABLED, "monitoring.serviceMonitor.enabled=true")
    service = named(monitored, "Service", f"{NAME}-metrics")
    assert service["spec"]["selector"] == {"app.kubernetes.io/name": "kanri-cache-operator"}
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8082, "targetPort": "health"}]
    monitor = named(monitored, "ServiceMonitor", NAME)
    assert monitor["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    policy = named(template(*ENABLED), "NetworkPolicy", NAME)
    assert policy["spec"]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "kanri-cache-operator"}
    assert policy["spec"]["ingress"] == []
    scrapers = "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.team=monitoring"
    (rule,) = named(template(*ENABLED, scrapers), "NetworkPolicy", NAME)["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8082}]
    assert [p for p in of_kind(template(*ENABLED, "networkPolicy.enabled=false"), "NetworkPolicy")] == []


def test_users_get_caches_through_the_aggregated_roles() -> None:
    objects = template(*ENABLED)
    edit = named(objects, "ClusterRole", "kanri-cache-edit")
    view = named(objects, "ClusterRole", "kanri-cache-view")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert ("kanri.dev", "caches", "create") in rule_grants(edit["rules"])
    assert ("kanri.dev", "caches/status", "patch") not in rule_grants(edit["rules"]), "status is the operator's"
    assert {v for _, _, v in rule_grants(view["rules"])} == {"get", "list", "watch"}


def test_the_operator_gets_a_pinned_valkey_image_for_every_version_the_api_accepts() -> None:
    env = {e["name"]: e.get("value") for e in container(template(*ENABLED))["env"]}
    table = json.loads(env[children.IMAGES_ENV])
    assert sorted(table) == sorted(VERSIONS)
    digest = "sha256:" + "c" * 64
    pinned = template(*ENABLED, "image.registry=registry.example/kanri", f"cache.valkey.digests.9\\.1={digest}")
    table = json.loads({e["name"]: e.get("value") for e in container(pinned)["env"]}[children.IMAGES_ENV])
    assert table == {"9.1": f"registry.example/kanri/kanri-valkey:9.1@{digest}"}


def test_the_plain_manifest_is_the_charts_cache_render() -> None:
    text = manifest_text()
    assert [d["kind"] for d in yaml.safe_load_all(text) if d].count("Deployment") == 1
    assert MANIFEST.read_text() == text, f"{MANIFEST.relative_to(ROOT)} is stale: {FIX_MANIFEST}"


if __name__ == "__main__":
    MANIFEST.write_text(manifest_text())
    print(f"wrote {MANIFEST.relative_to(ROOT)}", file=sys.stderr)
