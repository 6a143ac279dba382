"""The chart's PodMonitor of PostgresPooler pods (deploy/helm/kanri/templates/pooler-metrics.yaml), rendered by the
real helm: off by default and on with the operator's ServiceMonitor (``monitoring.serviceMonitor.*``); it selects
exactly the pods :func:`kanri.postgres.pooler.children.deployment` builds (never a PostgreSQL instance's), scrapes the
container port that carries the agent's metrics, and gives each target the ``pooler`` label and the job that
deploy/monitoring/pooler-alerts.yaml groups and selects by; in namespaced mode it looks in the watched namespaces
only."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from kanri.local import imagemap
from kanri.local.node.images import ImageEntry, ImageMap
from kanri.postgres.api.v1alpha1.postgres_pooler import PostgresPoolerSpec
from kanri.postgres.labels import POSTGRES
from kanri.postgres.pooler import children
from tests.helm_support import Obj, of_kind, template
from tests.unit.test_pooler_alerts import ALERTS, JOB, POD_MONITOR_LABELS

ON = ("monitoring.serviceMonitor.enabled=true",)


def pod_monitor(*values: str) -> Obj:
    (monitor,) = of_kind(template(*values), "PodMonitor")
    return monitor


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's matchLabels and matchExpressions (the operators a PodMonitor uses here) against labels."""
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        if operator == "Exists" and key not in labels:
            return False
        if operator == "In" and labels.get(key) not in expression["values"]:
            return False
        if operator not in {"Exists", "In"}:
            raise AssertionError(f"operator {operator} not modelled here")
    return True


def pooler_pod() -> Obj:
    deployment = children.deployment("orders-pool", "shop", PostgresPoolerSpec(cluster="orders"), "hash")
    pod: Obj = deployment["spec"]["template"]
    return pod


def test_off_by_default_and_on_with_the_service_monitor() -> None:
    assert of_kind(template(), "PodMonitor") == []
    labelled = ("monitoring.serviceMonitor.labels.release=prom", "monitoring.serviceMonitor.interval=15s")
    monitor = pod_monitor(*ON, *labelled)
    assert monitor["metadata"] == {"name": "kanri-pgbouncer", "namespace": "kanri-system",
                                   "labels": {"release": "prom"}}  # fmt: skip
    assert [endpoint["interval"] for endpoint in monitor["spec"]["podMetricsEndpoints"]] == ["15s"]


def test_it_selects_the_pooler_pods_the_operator_builds_and_no_postgresql_pod() -> None:
    selector = pod_monitor(*ON)["spec"]["selector"]
    assert selects(selector, pooler_pod()["metadata"]["labels"])
    assert not selects(selector, POSTGRES.labels("orders-pool", instance="orders-pool-1"))
    assert not selects(selector, {"app.kubernetes.io/name": "pgbouncer"}), "a PgBouncer kanri does not run"


def test_it_scrapes_the_agents_metrics_port() -> None:
    (endpoint,) = pod_monitor(*ON)["spec"]["podMetricsEndpoints"]
    (container,) = pooler_pod()["spec"]["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports[endpoint["port"]] == children.METRICS_PORT
    assert endpoint["path"] == "/metrics"
    assert "bearerTokenFile" not in endpoint, "the agent serves plain HTTP, without a token"


def test_each_target_gets_the_pooler_label_and_the_job_the_alerts_select() -> None:
    (endpoint,) = pod_monitor(*ON)["spec"]["podMetricsEndpoints"]
    relabel = {rule["targetLabel"]: rule for rule in endpoint["relabelings"]}
    assert set(relabel) == POD_MONITOR_LABELS | {"job"}
    # Prometheus' name for the pod label kanri.dev/pooler: every character outside [a-zA-Z0-9_] becomes _
    owner_key = next(key for key in pooler_pod()["metadata"]["labels"] if key.endswith("/pooler"))
    assert relabel["pooler"]["sourceLabels"] == ["__meta_kubernetes_pod_label_" + re.sub(r"\W", "_", owner_key)]
    assert relabel["job"]["replacement"] == JOB
    assert f'up{{job="{JOB}"}}' in ALERTS.read_text()


def test_cluster_wide_it_looks_in_every_namespace_and_namespaced_in_the_watched_ones() -> None:
    assert pod_monitor(*ON)["spec"]["namespaceSelector"] == {"any": True}
    namespaced = pod_monitor(*ON, "watchNamespaces={team-a,team-b}")
    assert namespaced["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def _pgbouncer_image(*values: str) -> str:
    (operator,) = [o for o in of_kind(template(*values), "Deployment") if o["metadata"]["name"] == "kanri-operator"]
    (container,) = operator["spec"]["template"]["spec"]["containers"]
    (env,) = [e for e in container["env"] if e["name"] == children.IMAGE_ENV]
    value = env["value"]
    assert isinstance(value, str)
    return value


def test_the_chart_names_the_built_pgbouncer_image_and_the_operator_uses_it() -> None:
    assert _pgbouncer_image() == "kanri.dev/kanri-pgbouncer:1.18.0"
    digest = "sha256:" + "ab" * 32
    given = _pgbouncer_image("postgres.registry=registry.example:5000", f"postgres.pgbouncer.digest={digest}")
    assert given == f"registry.example:5000/kanri-pgbouncer:1.18.0@{digest}"
    spec = PostgresPoolerSpec.model_validate({"cluster": "pg", "type": "rw"})
    pods = children.deployment("p", "ns", spec, "h", image=children.image({children.IMAGE_ENV: given}))
    (container,) = pods["spec"]["template"]["spec"]["containers"]
    assert container["image"] == given
    assert children.image({}) == children.image({children.IMAGE_ENV: " "}) == children.IMAGE


def test_the_home_made_node_runs_the_chart_s_built_pgbouncer_reference_and_the_local_name(tmp_path: Path) -> None:
    """The e2e tier's home-made node maps both ``kanri.dev/pgbouncer:1.18`` (the operator's default) and what the
    chart passes, ``<registry>/kanri-pgbouncer:1.18.0@sha256:…``, to the agent with the host's pgbouncer."""
    binary = tmp_path / "pgbouncer"
    binary.write_text("")
    entries = imagemap.pgbouncer_entries("/usr/bin/python3", {}, binary)
    images = ImageMap(ImageEntry.parse(e) for e in [*entries, *imagemap.registry_aliases(entries)])
    for ref in (children.IMAGE, _pgbouncer_image(f"postgres.pgbouncer.digest=sha256:{'cd' * 32}")):
        entry = images.resolve(ref)
        assert entry is not None, ref
        assert entry.command[-1] == "kanri.postgres.pooler.agent", ref
