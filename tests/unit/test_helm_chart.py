"""The Helm chart deploy/helm/kanri: it lints, its default render is deploy/operator/operator.yaml (one source of
truth), its CRDs are deploy/crds/, and its namespaced mode grants rights on namespaced resources through Roles only."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kanri.images.catalog import BuiltImage
from kanri.images.chart import package_chart
from kanri.postgres.backup.archiving import load_repository
from kanri.postgres.children.images import PostgresImages
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER, POSTGRES_POOLER
from kanri.postgres.operator import UPGRADE_CRDS_ENV, operator_crds
from kanri.runtime import Kind
from kanri.runtime import kinds as builtin_kinds
from tests.helm_support import CHART, ROOT, Obj, helm, of_kind, template, template_text

OPERATOR_MANIFEST = ROOT / "deploy" / "operator" / "operator.yaml"
DEPLOY_CRDS = ROOT / "deploy" / "crds"
# The values `make manifests` renders deploy/operator/operator.yaml with (release kanri in kanri-system).
MANIFEST_VALUES = ("createNamespace=true",)
FIX_MANIFEST = "run `make manifests` and commit deploy/operator/operator.yaml (edit the chart, not the file)"

# Whether each (API group, resource) the chart's rules name is namespaced: kanri's built-in kinds and its CRD.
_KINDS: list[Kind] = [k for k in vars(builtin_kinds).values() if isinstance(k, Kind)]
_KINDS += [POSTGRES_CLUSTER, POSTGRES_BACKUP, POSTGRES_POOLER]
NAMESPACED = {(k.group, k.plural): k.namespaced for k in _KINDS} | {("events.k8s.io", "events"): True}

Grant = tuple[str, str, str]


def grants(rules: list[Obj]) -> set[Grant]:
    """Every (group, resource, verb) the rules allow (subresources as written: "postgresclusters/status")."""
    return {(g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]}


def namespaced(group: str, resource: str) -> bool:
    base = resource.split("/", 1)[0]
    assert (group, base) in NAMESPACED, f"the chart grants {group or 'core'}/{base}, a kind this test cannot classify"
    return NAMESPACED[(group, base)]


METRICS_AUTH: set[Grant] = {
    ("authentication.k8s.io", "tokenreviews", "create"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
}


def operator_cluster_roles(objects: list[Obj]) -> list[Obj]:
    """The ClusterRoles bound to the operator for its work: neither the users' aggregated roles (bound by the
    built-in admin/edit/view), the scrapers' role (bound by the platform), nor the metrics' review rights."""
    bound = {b["roleRef"]["name"] for b in of_kind(objects, "ClusterRoleBinding")}
    return [r for r in of_kind(objects, "ClusterRole")
            if r["metadata"]["name"] in bound and not r["metadata"]["name"].endswith("-metrics-auth")]  # fmt: skip


def named(objects: list[Obj], kind: str, name: str) -> Obj:
    (found,) = [o for o in of_kind(objects, kind) if o["metadata"]["name"] == name]
    return found


def deployment_args(objects: list[Obj]) -> list[str]:
    (deployment,) = of_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args: list[str] = container["args"]
    return args


def test_chart_lints_in_both_modes() -> None:
    for values in ([], ["--set", "watchNamespaces={team-a}"]):
        result = helm("lint", "--strict", str(CHART), *values)
        assert "0 chart(s) failed" in result.stdout, result.stdout


def test_operator_manifest_is_the_charts_default_render() -> None:
    text = OPERATOR_MANIFEST.read_text()
    rendered = template_text(*MANIFEST_VALUES)
    assert text.endswith(rendered), f"deploy/operator/operator.yaml is stale: {FIX_MANIFEST}"
    header = text.removesuffix(rendered).splitlines()
    assert header, "deploy/operator/operator.yaml lost its header saying it is generated"
    assert all(line.startswith("#") for line in header), f"only a comment may precede the render: {FIX_MANIFEST}"


def test_chart_crds_are_deploy_crds() -> None:
    chart_crds = {p.name: p.read_text() for p in (CHART / "crds").glob("*.yaml")}
    deploy_crds = {p.name: p.read_text() for p in DEPLOY_CRDS.glob("*.yaml")}
    assert chart_crds == deploy_crds, "the chart's crds/ differ from deploy/crds/: run `make crds` and commit both"


def test_default_mode_is_cluster_wide() -> None:
    objects = template()
    (role,) = operator_cluster_roles(objects)
    binding = named(objects, "ClusterRoleBinding", "kanri-operator")
    assert binding["roleRef"]["name"] == role["metadata"]["name"] == "kanri-operator"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kanri-operator", "namespace": "kanri-system"}]
    # The only Role is the Lease's, in the operator's own namespace.
    assert [(r["metadata"]["name"], r["metadata"]["namespace"]) for r in of_kind(objects, "Role")] == [
        ("kanri-operator-leader-election", "kanri-system")
    ]
    assert not any(arg.startswith("--namespace") for arg in deployment_args(objects))
    assert of_kind(objects, "Namespace") == [], "Helm installs use --create-namespace; only the manifests render one"


def test_namespaced_mode_grants_namespaced_resources_through_roles_only() -> None:
    objects = template("watchNamespaces={team-a}", namespace="kanri-ops")
    for cluster_role in operator_cluster_roles(objects):
        scoped = sorted({(g, r) for g, r, _ in grants(cluster_role["rules"]) if namespaced(g, r)})
        assert scoped == [], f"ClusterRole {cluster_role['metadata']['name']} grants namespaced resources: {scoped}"
    # The cluster-scoped remainder is read-only, but for replacing the operator's own two CRDs, by name.
    cluster_rules = [rule for c in operator_cluster_roles(objects) for rule in c["rules"]]
    writing = [rule for rule in cluster_rules if set(rule["verbs"]) - {"get", "list", "watch"}]
    assert writing == [CRD_UPGRADE_RULE], writing
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in of_kind(objects, "Role")}
    assert set(roles) == {("team-a", "kanri-operator"), ("kanri-ops", "kanri-operator-leader-election")}
    bindings = {(b["metadata"]["namespace"], b["metadata"]["name"]): b for b in of_kind(objects, "RoleBinding")}
    assert set(bindings) == set(roles)
    for binding in bindings.values():
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kanri-operator", "namespace": "kanri-ops"}]
    assert "--namespace=team-a" in deployment_args(objects)


def test_both_modes_grant_the_same_rights() -> None:
    """Namespaced mode moves the cluster-wide rules into a Role; it neither drops nor adds a right."""
    (cluster_wide,) = operator_cluster_roles(template())
    namespaced_objects = template("watchNamespaces={team-a}")
    roles = [r for r in of_kind(namespaced_objects, "Role") if r["metadata"]["namespace"] == "team-a"]
    split = {g for o in [*roles, *operator_cluster_roles(namespaced_objects)] for g in grants(o["rules"])}
    assert split == grants(cluster_wide["rules"])


def test_several_watched_namespaces_get_a_role_each_and_one_watch_flag_each() -> None:
    objects = template("watchNamespaces={team-a,team-b}", namespace="kanri-ops")
    (cluster_wide,) = operator_cluster_roles(template())
    for namespace in ("team-a", "team-b"):
        (role,) = [r for r in of_kind(objects, "Role") if r["metadata"]["namespace"] == namespace]
        assert role["rules"] == [r for r in cluster_wide["rules"] if namespaced(r["apiGroups"][0], r["resources"][0])]
        (binding,) = [b for b in of_kind(objects, "RoleBinding") if b["metadata"]["namespace"] == namespace]
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"][0]["namespace"] == "kanri-ops"
    (deployment,) = of_kind(objects, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert [a for a in args if a.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


def test_a_namespace_listed_twice_or_misspelt_is_refused() -> None:
    twice = helm("template", "kanri", str(CHART), "--set", "watchNamespaces={a,a}", check=False)
    assert twice.returncode != 0
    assert "listed twice" in twice.stderr
    bad = helm("template", "kanri", str(CHART), "--set", "watchNamespaces={Team_A}", check=False)
    assert bad.returncode != 0
    assert '"Team_A" is not a namespace name' in bad.stderr


REPOSITORY = ("backup.defaultRepository.endpoint=https://s3.eu-west-1.amazonaws.com",
              "backup.defaultRepository.bucket=acme-backups", "backup.defaultRepository.path=prod",
              "backup.defaultRepository.credentialsSecret.name=backup-keys")  # fmt: skip


def test_the_default_backup_repository_reaches_the_operator_as_the_file_it_parses(tmp_path: Path) -> None:
    objects = template(*REPOSITORY, namespace="kanri-ops")
    (config,) = [c for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"].endswith("-backup-repository")]
    assert config["metadata"]["namespace"] == "kanri-ops"
    written = tmp_path / "repository.yaml"
    written.write_text(config["data"]["repository.yaml"])
    parsed = load_repository(written)  # the operator's own parser (kanri run --default-backup-repository)
    assert (parsed.endpoint, parsed.bucket, parsed.path) == (
        "https://s3.eu-west-1.amazonaws.com",
        "acme-backups",
        "prod",
    )
    assert parsed.credentials_secret.name == "backup-keys"
    (deployment,) = of_kind(objects, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (mount,) = pod["containers"][0]["volumeMounts"]
    assert f"--default-backup-repository={mount['mountPath']}/repository.yaml" in deployment_args(objects)
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == config["metadata"]["name"]
    assert not [r for r in of_kind(objects, "Role") if r["metadata"]["name"].endswith("-backup-repository")], (
        "cluster-wide mode reads Secrets through its ClusterRole already"
    )


def test_namespaced_mode_may_read_the_repository_key_secret_and_keep_the_watched_namespaces_identities_only() -> None:
    objects = template(*REPOSITORY, "watchNamespaces={team-a,team-b}", namespace="kanri-ops")
    (role,) = [r for r in of_kind(objects, "Role") if r["metadata"]["name"].endswith("-backup-repository")]
    assert role["metadata"]["namespace"] == "kanri-ops"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["backup-keys"], "verbs": ["get"]},
        # each watched namespace's own identity in the default repository (kanri.postgres.backup.tenant_identity)
        {"apiGroups": [""], "resources": ["secrets"],
         "resourceNames": ["kanri-backup-tenant-team-a", "kanri-backup-tenant-team-b"],
         "verbs": ["get", "create", "patch"]},
    ]  # fmt: skip
    (binding,) = [b for b in of_kind(objects, "RoleBinding") if b["roleRef"]["name"] == role["metadata"]["name"]]
    assert binding["metadata"]["namespace"] == "kanri-ops"
    shared = template(*REPOSITORY, "backup.defaultRepository.tenantIsolation=Shared", "watchNamespaces={team-a}",
                      namespace="kanri-ops")  # fmt: skip
    (role,) = [r for r in of_kind(shared, "Role") if r["metadata"]["name"].endswith("-backup-repository")]
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["backup-keys"],
                              "verbs": ["get"]}]  # fmt: skip


def test_no_default_repository_renders_nothing_for_it_and_a_bad_one_is_refused() -> None:
    assert not [c for c in of_kind(template(), "ConfigMap") if c["metadata"]["name"].endswith("-backup-repository")]
    assert "--default-backup-repository" not in " ".join(deployment_args(template()))
    url = helm("template", "kanri", str(CHART), "--set", "backup.defaultRepository=s3://bucket", check=False)
    assert url.returncode != 0
    assert "give the fields of backup.repository.s3" in url.stderr
    partial = helm("template", "kanri", str(CHART), "--set", "backup.defaultRepository.endpoint=http://s3:8333",
                   check=False)  # fmt: skip
    assert partial.returncode != 0
    assert "backup.defaultRepository.bucket is required" in partial.stderr


def test_image_resources_and_names_come_from_values() -> None:
    objects = template(
        "image.registry=registry.example", "image.repository=kanri", "image.tag=9.9.9", "resources.limits.memory=1Gi",
        "logLevel=debug", release="pg",
    )  # fmt: skip
    (deployment,) = of_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example/kanri:9.9.9"
    assert container["resources"]["limits"]["memory"] == "1Gi"
    assert "--log-level=debug" in container["args"]
    assert deployment["metadata"]["name"] == "pg-operator"
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == "pg-operator"
    # The pods keep their fixed label whatever the release: NetworkPolicies select the operator by it.
    assert deployment["spec"]["template"]["metadata"]["labels"] == {"app.kubernetes.io/name": "kanri-operator"}


def test_monitoring_toggles() -> None:
    assert of_kind(template(), "Service") == []
    assert of_kind(template(), "ServiceMonitor") == []
    objects = template("monitoring.serviceMonitor.enabled=true", "monitoring.serviceMonitor.labels.release=prom")
    (service,) = of_kind(objects, "Service")
    (monitor,) = of_kind(objects, "ServiceMonitor")
    (deployment,) = of_kind(objects, "Deployment")
    assert service["spec"]["selector"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 8081, "targetPort": "health"}]
    assert monitor["metadata"]["labels"] == {"release": "prom"}
    assert monitor["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    (annotated,) = of_kind(template("monitoring.podAnnotations=true"), "Deployment")
    assert annotated["spec"]["template"]["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true", "prometheus.io/port": "8081", "prometheus.io/path": "/metrics",
    }  # fmt: skip


KANRI_KINDS = ["postgresclusters", "postgresbackups", "postgrespoolers"]
ALL_VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
AGGREGATE = "rbac.authorization.k8s.io/aggregate-to-"


@pytest.mark.parametrize("values", [(), ("watchNamespaces={team-a}",)], ids=["cluster-wide", "namespaced"])
def test_the_users_roles_aggregate_kanris_kinds_into_admin_edit_and_view(values: tuple[str, ...]) -> None:
    objects = template(*values, release="pg")
    edit, view = named(objects, "ClusterRole", "pg-edit"), named(objects, "ClusterRole", "pg-view")
    assert {k for k, v in edit["metadata"]["labels"].items() if v == "true"} == {
        f"{AGGREGATE}admin",
        f"{AGGREGATE}edit",
    }
    assert {k for k, v in view["metadata"]["labels"].items() if v == "true"} == {
        f"{AGGREGATE}admin", f"{AGGREGATE}edit", f"{AGGREGATE}view"
    }  # fmt: skip
    assert grants(edit["rules"]) == {("kanri.dev", kind, verb) for kind in KANRI_KINDS for verb in ALL_VERBS} | {
        ("kanri.dev", f"{kind}/status", verb) for kind in KANRI_KINDS for verb in ("get", "list", "watch")
    }, "admin and edit manage both kinds; status stays the operator's"
    assert grants(view["rules"]) == {
        ("kanri.dev", kind, verb) for kind in [*KANRI_KINDS, *(f"{k}/status" for k in KANRI_KINDS)]
        for verb in ("get", "list", "watch")
    }, "view reads, and writes nothing"  # fmt: skip
    bound = {b["roleRef"]["name"] for b in of_kind(objects, "ClusterRoleBinding") + of_kind(objects, "RoleBinding")}
    assert not bound & {"pg-edit", "pg-view", "pg-metrics-reader"}, "the built-in roles' bindings decide who"


def test_metrics_are_authenticated_by_default_and_the_scrapers_role_ships() -> None:
    objects = template("monitoring.serviceMonitor.enabled=true")
    assert "--no-metrics-auth" not in deployment_args(objects)
    review = named(objects, "ClusterRole", "kanri-operator-metrics-auth")
    assert grants(review["rules"]) == METRICS_AUTH
    binding = named(objects, "ClusterRoleBinding", "kanri-operator-metrics-auth")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kanri-operator", "namespace": "kanri-system"}]
    reader = named(objects, "ClusterRole", "kanri-metrics-reader")
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    (monitor,) = of_kind(objects, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["bearerTokenFile"] == "/var/run/secrets/kubernetes.io/serviceaccount/token"

    opted_out = template("monitoring.authenticateMetrics=false", "monitoring.serviceMonitor.enabled=true")
    assert "--no-metrics-auth" in deployment_args(opted_out)
    assert not [r for r in of_kind(opted_out, "ClusterRole") if r["metadata"]["name"].endswith("-metrics-auth")]
    assert "bearerTokenFile" not in of_kind(opted_out, "ServiceMonitor")[0]["spec"]["endpoints"][0]


def test_the_operators_pod_admits_only_the_named_scrapers() -> None:
    (policy,) = of_kind(template(), "NetworkPolicy")
    (deployment,) = of_kind(template(), "Deployment")
    assert policy["metadata"]["namespace"] == "kanri-system"
    assert policy["spec"]["podSelector"]["matchLabels"] == deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [], "by default nothing may connect (the kubelet's probes come from the node)"
    monitoring = "networkPolicy.metricsFrom[0].namespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name=monitoring"
    (scraped,) = of_kind(template(monitoring), "NetworkPolicy")
    assert scraped["spec"]["ingress"] == [{
        "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        "ports": [{"protocol": "TCP", "port": 8081}],
    }]  # fmt: skip
    assert of_kind(template("networkPolicy.enabled=false"), "NetworkPolicy") == []


@pytest.mark.parametrize("path", sorted((CHART / "templates").glob("*.yaml")), ids=lambda p: Path(p).name)
def test_every_template_renders_in_some_mode(path: Path) -> None:
    """No dead template: each one contributes an object with the defaults or with every toggle on."""
    everything = template_text(
        "monitoring.serviceMonitor.enabled=true", "monitoring.prometheusRules.enabled=true", "createNamespace=true"
    ) + template_text("watchNamespaces={team-a}", *REPOSITORY)
    assert f"# Source: kanri/templates/{path.name}" in everything


CRD_UPGRADE_RULE = {
    "apiGroups": ["apiextensions.k8s.io"],
    "resources": ["customresourcedefinitions"],
    "resourceNames": [crd["metadata"]["name"] for crd in operator_crds()],
    "verbs": ["get", "update"],
}


@pytest.mark.parametrize("values", [(), ("watchNamespaces={team-a}",)])
def test_the_operator_upgrades_its_own_crds_unless_told_not_to(values: tuple[str, ...]) -> None:
    """Default: KANRI_UPGRADE_CRDS=true and get + update on exactly the CRDs the operator carries; off: neither."""

    def upgrade_env(objects: list[Obj]) -> list[object]:
        return [e.get("value") for e in operator_container(objects)["env"] if e["name"] == UPGRADE_CRDS_ENV]

    def crd_rules(objects: list[Obj]) -> list[Obj]:
        rules = [rule for c in operator_cluster_roles(objects) for rule in c["rules"]]
        return [rule for rule in rules if "customresourcedefinitions" in rule["resources"]]

    objects = template(*values)
    assert upgrade_env(objects) == ["true"]
    assert crd_rules(objects) == [CRD_UPGRADE_RULE]
    off = template(*values, "upgradeCRDs=false")
    assert upgrade_env(off) == []
    assert crd_rules(off) == []


def test_allowed_backup_endpoints_reach_the_operator_as_one_flag_each() -> None:
    assert not [a for a in deployment_args(template()) if a.startswith("--allowed-backup-endpoint")]
    objects = template("backup.allowedEndpoints={https://s3.eu-west-1.amazonaws.com,minio.storage.svc:9000}")
    assert [a for a in deployment_args(objects) if a.startswith("--allowed-backup-endpoint")] == [
        "--allowed-backup-endpoint=https://s3.eu-west-1.amazonaws.com",
        "--allowed-backup-endpoint=minio.storage.svc:9000",
    ]


def test_allowed_priority_classes_reach_the_operator_as_one_flag_each() -> None:
    assert not [a for a in deployment_args(template()) if a.startswith("--node-monitor-grace")]
    assert "--node-monitor-grace=50" in deployment_args(template("nodeMonitorGracePeriod=50"))
    assert not [a for a in deployment_args(template()) if a.startswith("--allowed-priority-class")]
    objects = template("allowedPriorityClasses={database-high,database-normal}")
    assert [a for a in deployment_args(objects) if a.startswith("--allowed-priority-class")] == [
        "--allowed-priority-class=database-high",
        "--allowed-priority-class=database-normal",
    ]


DIGEST = "sha256:" + "ab" * 32


def operator_container(objects: list[Obj]) -> Obj:
    (deployment,) = of_kind(objects, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container  # type: ignore[no-any-return]


def postgres_images(objects: list[Obj]) -> PostgresImages:
    """What the operator reads from its environment (KANRI_POSTGRES_IMAGES), parsed as the operator parses it."""
    env = {e["name"]: e.get("value") for e in operator_container(objects)["env"]}
    return PostgresImages.from_environment(env)


def test_the_chart_in_git_names_images_by_tag_under_one_registry() -> None:
    objects = template()
    assert operator_container(objects)["image"] == "kanri.dev/kanri-operator:0.1.0"
    images = postgres_images(objects)
    assert dict(images.instance) == {m: f"kanri.dev/kanri-postgres:{m}" for m in (14, 15, 16, 17, 18)}
    # nothing upgrades to the lowest major
    assert dict(images.upgrade) == {m: f"kanri.dev/kanri-postgres-upgrade:{m}" for m in (15, 16, 17, 18)}


def test_values_name_the_registry_and_digests_of_every_image() -> None:
    objects = template(
        "image.registry=registry.example.com:5000/platform", f"image.digest={DIGEST}",
        f"postgres.digests.17={DIGEST}", f"postgres.upgradeDigests.17={DIGEST}", "postgres.registry=mirror.example",
    )  # fmt: skip
    assert operator_container(objects)["image"] == f"registry.example.com:5000/platform/kanri-operator:0.1.0@{DIGEST}"
    images = postgres_images(objects)
    assert images.for_major(17) == f"mirror.example/kanri-postgres:17@{DIGEST}"
    assert images.for_major(16) == "mirror.example/kanri-postgres:16"
    assert images.for_upgrade(17) == f"mirror.example/kanri-postgres-upgrade:17@{DIGEST}"


def test_a_digest_that_is_not_sha256_is_refused() -> None:
    result = helm("template", "kanri", str(CHART), "--set", "image.digest=latest", check=False)
    assert result.returncode != 0
    assert "is not sha256:<64 hex digits>" in result.stderr


def test_the_packaged_chart_names_the_built_images_by_digest(tmp_path: Path) -> None:
    def built(repository: str, tag: str, digest: str) -> BuiltImage:
        return BuiltImage(repository, repository, tag, digest, tmp_path, tmp_path, "", "", "65532", 1, 1)

    other = "sha256:" + "cd" * 32
    images = [built("kanri-operator", "0.1.0", DIGEST), built("kanri-postgres", "17", other),
              built("kanri-postgres-upgrade", "18", DIGEST)]  # fmt: skip
    package = package_chart(CHART, images, tmp_path / "out")
    assert package.name == "kanri-0.1.0.tgz"
    # reproducible: the same chart and digests give the same bytes
    assert package_chart(CHART, images, tmp_path / "again").read_bytes() == package.read_bytes()
    text = helm("template", "kanri", str(package), "--namespace", "kanri-system").stdout
    objects = [d for d in yaml.safe_load_all(text) if d]
    assert operator_container(objects)["image"] == f"kanri.dev/kanri-operator:0.1.0@{DIGEST}"
    pg = postgres_images(objects)
    assert (pg.for_major(17), pg.for_major(16)) == (
        f"kanri.dev/kanri-postgres:17@{other}",
        "kanri.dev/kanri-postgres:16",
    )
    assert pg.for_upgrade(18) == f"kanri.dev/kanri-postgres-upgrade:18@{DIGEST}"
    # a value still wins over the package's digest
    override = "sha256:" + "ef" * 32
    text = helm("template", "kanri", str(package), "--set", f"image.digest={override}").stdout
    objects = [d for d in yaml.safe_load_all(text) if d]
    assert operator_container(objects)["image"].endswith(f"@{override}")
