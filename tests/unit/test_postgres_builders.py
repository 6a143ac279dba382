"""The PostgresCluster's child objects as built (pure functions; no API server)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from kanri.postgres import names
from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children.config import config_map, synchronous_standbys
from kanri.postgres.children.pdb import disruption_budgets, wants_budgets
from kanri.postgres.children.pvc import claim, grow_patch
from kanri.postgres.children.rbac import service_account
from kanri.postgres.children.services import services
from kanri.postgres.children.statefulset import (
    RESTART,
    bootstrap_role,
    image_major,
    postgres_image,
    statefulset,
    tag_major,
)
from kanri.postgres.cluster.diff import HASH_ANNOTATION, is_subset, needs_apply

Obj = dict[str, Any]
UID = "0d3c5a4e-0000-4000-8000-000000000001"


def cluster(**spec: Any) -> Obj:
    body = {"version": 15, "replicas": 3, "storage": {"size": "10Gi"}, **spec}
    return {"apiVersion": "kanri.dev/v1alpha1", "kind": "PostgresCluster",
            "metadata": {"name": "orders", "namespace": "shop", "uid": UID, "generation": 1}, "spec": body}  # fmt: skip


def parsed(obj: Obj) -> PostgresClusterSpec:
    return PostgresClusterSpec.model_validate(obj["spec"])


def build(instance: str = "orders-2", role: Any = "replica", running: bool = True, **spec: Any) -> Obj:
    c = cluster(**spec)
    return statefulset(c, parsed(c), instance, role=role, image="kanri.dev/postgres:15", running=running)


def env_of(sts: Obj) -> dict[str, Any]:
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_names_are_deterministic_and_parse_back() -> None:
    assert names.instance_name("orders", 3) == "orders-3"
    assert names.instance_number("orders", "orders-12") == 12
    assert names.instance_number("orders", "orders-rw") is None
    assert names.instance_number("orders", "orders-01") is None
    assert names.instance_number("orders", "other-1") is None
    assert names.pod_name("orders-3") == "orders-3-0"
    services = (names.read_write_service("o"), names.read_only_service("o"), names.read_service("o"))
    assert services == ("o-rw", "o-ro", "o-r")
    with pytest.raises(ValueError, match="start at 1"):
        names.instance_name("orders", 0)


def test_statefulset_runs_one_pod_of_the_instance_with_its_own_claim_and_owner() -> None:
    sts = build()
    assert sts["metadata"]["name"] == "orders-2"
    assert sts["spec"]["replicas"] == 1
    (ref,) = sts["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == ("PostgresCluster", "orders", UID, True)
    assert sts["spec"]["selector"]["matchLabels"] == {"kanri.dev/cluster": "orders", "kanri.dev/instance": "orders-2",
                                                      "app.kubernetes.io/name": "postgresql"}  # fmt: skip
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert labels["kanri.dev/instance"] == "orders-2"
    assert "kanri.dev/role" not in labels
    assert "volumeClaimTemplates" not in sts["spec"]
    assert HASH_ANNOTATION in sts["metadata"]["annotations"]
    assert build(running=False)["spec"]["replicas"] == 0


def test_environment_follows_the_instance_manager_contract() -> None:
    env = env_of(build(bootstrap={"initdb": {"database": "shop", "owner": "shopper"}}))
    assert env == {
        "KANRI_CLUSTER": "orders",
        "POD_NAME": "orders-2",
        "POD_NAMESPACE": {"fieldRef": {"fieldPath": "metadata.namespace"}},
        "POD_IP": {"fieldRef": {"fieldPath": "status.podIP"}},
        "PGDATA": "/var/lib/postgresql/data/pgdata",
        "KANRI_BOOTSTRAP": "replica",
        "KANRI_PRIMARY_HOST": "orders-rw",
        "KANRI_SUPERUSER_DIR": "/etc/kanri/superuser",
        "KANRI_REPLICATION_DIR": "/etc/kanri/replication",
        "KANRI_APP_DIR": "/etc/kanri/app",
        "KANRI_APP_DATABASE": "shop",
        "KANRI_API_TOKEN_FILE": "/etc/kanri/api/token",
        "KANRI_CONFIG_FILE": "/etc/kanri/config/instance.json",
        "KANRI_TLS_DIR": "/etc/kanri/tls",
        "TMPDIR": "/run/kanri-tmp",
    }
    assert env_of(build("orders-1", role="primary"))["KANRI_BOOTSTRAP"] == "primary"


def test_pod_mounts_volumes_probes_and_runs_as_the_postgres_user() -> None:
    pod = build()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == "postgres"
    assert container["image"] == "kanri.dev/postgres:15"
    assert "command" not in container
    assert "args" not in container
    assert pod["securityContext"] == {"runAsNonRoot": True, "runAsUser": 26, "runAsGroup": 26, "fsGroup": 26,
                                      "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    assert pod["automountServiceAccountToken"] is False
    assert pod["serviceAccountName"] == "orders-instance"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["data"] == {"name": "data", "persistentVolumeClaim": {"claimName": "orders-2"}}
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"orders-superuser", "orders-replication", "orders-app", "orders-api", "orders-server"}
    assert volumes["config"]["configMap"] == {"name": "orders-config"}
    assert volumes["run"]["emptyDir"] == {}
    assert volumes["tmp"]["emptyDir"] == {}  # TMPDIR: the root filesystem is read-only
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts == {"/var/lib/postgresql/data": "data", "/etc/kanri/superuser": "superuser",
                      "/etc/kanri/replication": "replication", "/etc/kanri/app": "app", "/etc/kanri/api": "api",
                      "/etc/kanri/config": "config", "/var/run/postgresql": "run", "/etc/kanri/tls": "tls",
                      "/run/kanri-tmp": "tmp"}  # fmt: skip
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"postgres": 5432, "http": 8008, "metrics": 9187}
    https = {"port": 8008, "scheme": "HTTPS"}  # the API serves TLS (the kubelet does not verify it)
    assert container["readinessProbe"] == {"httpGet": {"path": "/readyz", **https}, "periodSeconds": 2,
                                           "failureThreshold": 3}  # fmt: skip
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", **https}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", **https}


def test_pod_template_and_resources_reach_the_pod() -> None:
    sts = build(
        resources={"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}},
        podTemplate={"labels": {"team": "a"}, "annotations": {"x": "y"}, "nodeSelector": {"disk": "ssd"},
                     "tolerations": [{"key": "db", "operator": "Exists"}], "priorityClassName": "high"},
    )  # fmt: skip
    template = sts["spec"]["template"]
    assert template["metadata"]["labels"]["team"] == "a"
    assert template["metadata"]["annotations"] == {"x": "y"}
    pod = template["spec"]
    assert pod["nodeSelector"] == {"disk": "ssd"}
    assert pod["priorityClassName"] == "high"
    assert pod["tolerations"] == [{"key": "db", "operator": "Exists"}]
    assert pod["containers"][0]["resources"] == {"requests": {"cpu": "500m"}, "limits": {"memory": "1Gi"}}
    # Default placement: prefer spreading the cluster's pods over nodes.
    assert "preferredDuringSchedulingIgnoredDuringExecution" in build()["spec"]["template"]["spec"]["affinity"][
        "podAntiAffinity"]  # fmt: skip


def test_the_pod_meets_pod_security_restricted() -> None:
    """Every check of the "restricted" standard the pod could fail: non-root, seccomp RuntimeDefault, every
    capability dropped, no privilege escalation, only the volume types it allows, no host namespaces or ports."""
    pod = build()["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["readOnlyRootFilesystem"] is True
    assert not context.get("privileged")
    assert not {"hostNetwork", "hostPID", "hostIPC"} & pod.keys()
    assert all("hostPort" not in port for port in container["ports"])
    allowed = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
               "secret"}  # fmt: skip
    assert all(set(volume) - {"name"} <= allowed for volume in pod["volumes"])
    # What the root filesystem being read-only relies on: the instance manager's writable places are volumes.
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {"/var/lib/postgresql/data", "/var/run/postgresql", "/run/kanri-tmp"}
    env = env_of(build())
    assert env["TMPDIR"] == "/run/kanri-tmp"  # Barman Cloud's staging files (no /tmp is writable)
    # The kubelet keeps a failed run's last log lines in its status, which the operator quotes (CrashLoopBackOff).
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def anti_affinity_keys(pod: Obj) -> list[tuple[int, str, Obj]]:
    terms = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    return [(t["weight"], t["podAffinityTerm"]["topologyKey"], t["podAffinityTerm"]["labelSelector"]) for t in terms]


def test_instances_prefer_other_nodes_and_zones_by_default() -> None:
    mine = {"matchLabels": {"kanri.dev/cluster": "orders", "app.kubernetes.io/name": "postgresql"}}
    pod = build()["spec"]["template"]["spec"]
    assert anti_affinity_keys(pod) == [
        (100, "kubernetes.io/hostname", mine),
        (100, "topology.kubernetes.io/zone", mine),
    ]
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in pod["affinity"]["podAntiAffinity"]


def test_a_users_node_affinity_keeps_the_spreading_and_a_users_anti_affinity_replaces_it() -> None:
    node = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["db"]}]}]}}  # fmt: skip
    pinned = build(podTemplate={"affinity": {"nodeAffinity": node}})["spec"]["template"]["spec"]
    assert pinned["affinity"]["nodeAffinity"] == node
    assert [key for _, key, _ in anti_affinity_keys(pinned)] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    strict = {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}]}  # fmt: skip
    own = build(podTemplate={"affinity": {"podAntiAffinity": strict}})["spec"]["template"]["spec"]
    assert own["affinity"] == {"podAntiAffinity": strict}
    # An empty podAntiAffinity is how a user turns the default spreading off.
    off = build(podTemplate={"affinity": {"podAntiAffinity": {}}})["spec"]["template"]["spec"]
    assert "affinity" not in off


def test_bootstrap_role_and_major_are_read_back_from_an_existing_statefulset() -> None:
    assert bootstrap_role(build("orders-1", role="primary")) == "primary"
    assert image_major(build()) == 15
    assert bootstrap_role({"spec": {}}) is None
    assert image_major({"spec": {}}) is None


@pytest.mark.parametrize(
    ("image", "major"),
    [
        ("kanri.dev/postgres:17", 17),
        ("kanri.dev/postgres:17.11", 17),
        ("registry.example:5000/kanri/postgres:14.23", 14),
        ("registry.example:5000/kanri/postgres", None),
        ("kanri.dev/postgres", None),
        ("kanri.dev/postgres:latest", None),
    ],
)
def test_the_major_of_an_image_is_read_from_its_tag(image: str, major: int | None) -> None:
    assert tag_major(image) == major


def sts_with(image: str) -> Obj:
    return {"spec": {"template": {"spec": {"containers": [{"name": "postgres", "image": image}]}}}}


def test_the_image_is_the_pinned_minor_or_the_majors_default_and_kept_while_a_major_upgrade_waits() -> None:
    pinned = parsed(cluster(version=17, imageName="kanri.dev/postgres:17.10"))
    assert postgres_image(pinned, 17, None) == "kanri.dev/postgres:17.10"
    # a minor update: the spec's image wins over the one the instance runs
    assert postgres_image(pinned, 17, sts_with("kanri.dev/postgres:17.11")) == "kanri.dev/postgres:17.10"
    assert postgres_image(parsed(cluster(version=17)), 17, sts_with("kanri.dev/postgres:17.10")) == (
        "kanri.dev/postgres:17"
    ), "removing imageName returns to the platform's default"
    # version raised to 18 (waiting for approval): the 17 instances keep their pinned 17.10, no silent minor update
    waiting = parsed(cluster(version=18, imageName="kanri.dev/postgres:18.6"))
    assert postgres_image(waiting, 17, sts_with("kanri.dev/postgres:17.10")) == "kanri.dev/postgres:17.10"
    assert postgres_image(parsed(cluster(version=18)), 17, sts_with("kanri.dev/postgres:17.10")) == (
        "kanri.dev/postgres:17.10"
    )
    # a new instance, or one whose image is of another major (a hand edit), gets the data's major's default
    assert postgres_image(waiting, 17, None) == "kanri.dev/postgres:17"
    assert postgres_image(waiting, 17, sts_with("kanri.dev/postgres:16")) == "kanri.dev/postgres:17"
    # after the upgrade the data is of 18: imageName applies again
    assert postgres_image(waiting, 18, sts_with("kanri.dev/postgres:17.10")) == "kanri.dev/postgres:18.6"


def test_claim_is_labelled_unowned_and_only_ever_grows() -> None:
    pvc = claim(cluster(), "orders-1", "10Gi", "fast")
    assert pvc["metadata"]["labels"]["kanri.dev/instance"] == "orders-1"
    assert "ownerReferences" not in pvc["metadata"]
    assert pvc["spec"] == {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "10Gi"}},
                           "storageClassName": "fast"}  # fmt: skip
    assert "storageClassName" not in claim(cluster(), "orders-1", "10Gi", None)["spec"]
    assert grow_patch(pvc, "20Gi") == {"spec": {"resources": {"requests": {"storage": "20Gi"}}}}
    assert grow_patch(pvc, "10240Mi") is None  # same size in other units
    assert grow_patch(pvc, "5Gi") is None  # never shrinks


def test_config_map_holds_parameters_instances_and_sync_standbys_as_stable_json() -> None:
    c = cluster(postgresql={"parameters": {"work_mem": "8MB"}}, replication={"mode": "Sync", "syncStandbys": 2})
    cm = config_map(c, parsed(c), ["orders-1", "orders-2"])
    assert cm["metadata"]["name"] == "orders-config"
    assert json.loads(cm["data"]["instance.json"]) == {
        "parameters": {"work_mem": "8MB"}, "instances": ["orders-1", "orders-2"], "synchronousStandbys": 2}  # fmt: skip
    assert cm == config_map(c, parsed(c), ["orders-1", "orders-2"])  # same input, same bytes and hash
    # Once a primary reported it, the system identifier: an empty volume then never runs initdb.
    known = config_map(c, parsed(c), ["orders-1"], "7329117425863524378")
    assert json.loads(known["data"]["instance.json"])["systemIdentifier"] == "7329117425863524378"
    assert synchronous_standbys(parsed(cluster())) == 0
    assert synchronous_standbys(parsed(cluster(replication={"mode": "Sync"}))) == 1


def test_services_select_pods_by_role() -> None:
    selectors = {s["metadata"]["name"]: s["spec"]["selector"] for s in services(cluster())}
    mine = {"kanri.dev/cluster": "orders", "app.kubernetes.io/name": "postgresql"}
    reads = {"kanri.dev/reads": "serve"}  # a replica too far behind is labelled withheld (kanri.postgres.ha.reads)
    assert selectors == {
        "orders-rw": {**mine, "kanri.dev/role": "primary"},
        "orders-ro": {**mine, "kanri.dev/role": "replica", **reads},
        "orders-r": {**mine, **reads},
    }
    # a cluster whose pods are not all labelled yet keeps the older selectors until they are
    older = {s["metadata"]["name"]: s["spec"]["selector"] for s in services(cluster(), by_reads=False)}
    assert older["orders-ro"] == {**mine, "kanri.dev/role": "replica"}
    assert older["orders-r"] == mine
    assert all(s["spec"]["ports"][0]["port"] == 5432 for s in services(cluster()))


def test_the_instances_identity_is_a_service_account_with_no_token_and_no_role() -> None:
    # The instance manager calls no Kubernetes API (its ConfigMap and Secrets arrive as volumes): nothing to grant.
    account = service_account(cluster())
    assert (account["kind"], account["metadata"]["name"]) == ("ServiceAccount", "orders-instance")
    assert account["automountServiceAccountToken"] is False
    pod = build()["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "orders-instance"
    assert pod["automountServiceAccountToken"] is False
    assert not [v for v in pod["volumes"] if "projected" in v or "serviceAccountToken" in str(v)]


def test_disruption_budgets_protect_the_primary_and_one_replica_at_a_time() -> None:
    primary, replicas = disruption_budgets(cluster())
    assert (primary["metadata"]["name"], primary["spec"]["minAvailable"]) == ("orders-primary", 1)
    assert primary["spec"]["selector"]["matchLabels"]["kanri.dev/role"] == "primary"
    assert (replicas["metadata"]["name"], replicas["spec"]["maxUnavailable"]) == ("orders-replicas", 1)
    assert wants_budgets(2, hibernated=False)
    assert not wants_budgets(3, hibernated=True)


def test_a_single_instance_is_kept_from_a_drain_unless_a_maintenance_window_allows_it() -> None:
    # issue 29 item 10: a drain evicted a 1-instance cluster's only pod at once (it had no budget at all)
    assert wants_budgets(1, hibernated=False)
    (alone,) = disruption_budgets(cluster(), instances=1)
    assert (alone["metadata"]["name"], alone["spec"]["minAvailable"]) == ("orders-primary", 1)
    assert not wants_budgets(1, hibernated=False, maintenance=True)
    assert wants_budgets(2, hibernated=False, maintenance=True)  # replicas: the primary is switched over instead
    assert not wants_budgets(1, hibernated=True)


def test_a_child_is_rewritten_only_when_it_differs() -> None:
    desired = build()
    stored = json.loads(json.dumps(desired))
    stored["spec"]["template"]["spec"]["containers"][0]["terminationMessagePath"] = "/dev/termination-log"  # default
    stored["metadata"]["resourceVersion"] = "7"
    assert not needs_apply(desired, stored)
    assert needs_apply(desired, None)
    tampered = json.loads(json.dumps(stored))
    tampered["spec"]["replicas"] = 0
    assert needs_apply(desired, tampered)
    # A field we stop setting changes the hash, which a subset check alone would miss.
    assert needs_apply(build(podTemplate={"nodeSelector": {"a": "b"}}), stored) is True
    assert is_subset({"resources": {"limits": {"cpu": "1000m"}}}, {"resources": {"limits": {"cpu": "1"}}})
    assert not is_subset({"image": "a:1"}, {"image": "a:2"})


def test_the_restart_annotation_reaches_every_pod_template_so_a_new_value_rolls_them() -> None:
    plain = build()
    asked = cluster()
    asked["metadata"]["annotations"] = {RESTART: "2026-12-02T07:30:00Z"}
    restarted = statefulset(
        asked, parsed(asked), "orders-2", role="replica", image="kanri.dev/postgres:15", running=True
    )
    assert "annotations" not in plain["spec"]["template"]["metadata"]
    assert restarted["spec"]["template"]["metadata"]["annotations"] == {RESTART: "2026-12-02T07:30:00Z"}
    assert not is_subset(restarted["spec"]["template"], plain["spec"]["template"]), "the template differs: it rolls"


@pytest.mark.parametrize(
    ("resources", "expected"),
    [
        (None, {"requests": {"cpu": "100m", "memory": "256Mi"}}),
        ({"requests": {"cpu": "2"}}, {"requests": {"cpu": "2", "memory": "256Mi"}}),
        # a limit alone is the request too (Kubernetes defaults it): a default request could exceed it
        ({"limits": {"cpu": "50m"}}, {"requests": {"memory": "256Mi"}, "limits": {"cpu": "50m"}}),
        (
            {"requests": {"memory": "1Gi"}, "limits": {"cpu": "1"}},
            {"requests": {"memory": "1Gi"}, "limits": {"cpu": "1"}},
        ),
    ],
    ids=["nothing-named", "cpu-named", "cpu-limit-only", "both-named"],
)
def test_an_instance_is_never_best_effort_it_requests_the_defaults_the_spec_does_not_name(
    resources: Obj | None, expected: Obj
) -> None:
    spec: dict[str, Any] = {} if resources is None else {"resources": resources}
    assert build(**spec)["spec"]["template"]["spec"]["containers"][0]["resources"] == expected
