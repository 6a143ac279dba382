"""The chart's PrometheusRules (values ``monitoring.prometheusRules``, templates/prometheusrules.yaml): none by
default; on, one monitoring.coreos.com/v1 PrometheusRule per rule file of deploy/monitoring/ — ``<fullname>-postgres``
and ``<fullname>-pooler`` always, ``<fullname>-kafka`` and ``<fullname>-cache`` only with the operator that needs
them — in the release namespace, labelled as the values say, each holding exactly its file's groups (parsed YAML
compared, runbook_url annotations included) and accepted by the real promtool. Rendered by the real helm
(tests/helm_support.py).

Helm cannot read files outside the chart, so it reads copies in files/prometheus-rules/, written together with
deploy/monitoring/prometheusrule.yaml by ``make monitoring`` (``python -m tests.unit.test_monitoring``, which calls
:func:`write_chart_copies`); a stale copy fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from kanri.images.chart import package_chart
from tests import alert_rules
from tests.helm_support import CHART, ROOT, Obj, helm, of_kind, template

MONITORING = ROOT / "deploy" / "monitoring"
COPIES = CHART / "files" / "prometheus-rules"
RULE_FILES: dict[str, Path] = {
    "postgres": MONITORING / "alerts.yaml",
    "pooler": MONITORING / "pooler-alerts.yaml",
    "kafka": MONITORING / "kafka-alerts.yaml",
    "cache": MONITORING / "cache-alerts.yaml",
}
"""Each PrometheusRule's name suffix -> the rule file it carries."""
FIX = (
    "run `make monitoring` (python -m tests.unit.test_monitoring) and commit deploy/helm/kanri/files/prometheus-rules/"
)
COPY_HEAD = """\
# Generated from deploy/{source} by `make monitoring` (python -m tests.unit.test_monitoring): do not edit.
# The chart's copy of it (Helm reads no file outside the chart), the groups of the PrometheusRule <fullname>-{name}
# (templates/prometheusrules.yaml, value monitoring.prometheusRules.enabled).
"""
ON = "monitoring.prometheusRules.enabled=true"
EVERY_OPERATOR = ("kafka.enabled=true", "cache.enabled=true")


def chart_copy(name: str) -> Path:
    return COPIES / f"{name}.yaml"


def render_chart_copy(name: str, source_text: str) -> str:
    """The chart's copy of the rule file ``name``: a header naming its source, then the file's text from ``groups:`` on
    (its comments and layout kept, as deploy/monitoring/prometheusrule.yaml keeps them)."""
    source = RULE_FILES[name].relative_to(ROOT / "deploy").as_posix()
    return COPY_HEAD.format(source=source, name=name) + source_text[source_text.index("groups:") :]


def write_chart_copies() -> list[Path]:
    """Write every chart copy from its rule file; returns the paths written."""
    COPIES.mkdir(parents=True, exist_ok=True)
    for name, source in RULE_FILES.items():
        chart_copy(name).write_text(render_chart_copy(name, source.read_text()))
    return [chart_copy(name) for name in RULE_FILES]


def prometheus_rules(objects: list[Obj]) -> dict[str, Obj]:
    """The rendered PrometheusRules by name."""
    return {rule["metadata"]["name"]: rule for rule in of_kind(objects, "PrometheusRule")}


def groups(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(RULE_FILES[name].read_text())
    return loaded


# --- the chart's copies are deploy/monitoring/'s files ----------------------------------------------------------------


def test_every_rule_file_of_deploy_monitoring_has_a_chart_copy() -> None:
    """A rule file added to deploy/monitoring/ without a PrometheusRule in the chart fails here."""
    rule_files = {
        path for path in MONITORING.glob("*.yaml")
        if not path.name.endswith(".test.yaml") and path.name != "prometheusrule.yaml"
    }  # fmt: skip
    assert rule_files == set(RULE_FILES.values())
    assert {path.stem for path in COPIES.glob("*")} == set(RULE_FILES), f"files/prometheus-rules/ differs: {FIX}"


@pytest.mark.parametrize("name", RULE_FILES)
def test_the_chart_copy_is_generated_from_its_rule_file(name: str) -> None:
    assert chart_copy(name).read_text() == render_chart_copy(name, RULE_FILES[name].read_text()), FIX


def test_a_changed_rule_makes_its_copy_stale() -> None:
    """The comparison above really sees an edit of a rule file (a threshold moved)."""
    text = RULE_FILES["postgres"].read_text()
    edited = text.replace("pending_seconds > 1800", "pending_seconds > 7200")
    assert edited != text
    assert render_chart_copy("postgres", edited) != chart_copy("postgres").read_text()


# --- what the chart renders -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [(), EVERY_OPERATOR, ("monitoring.serviceMonitor.enabled=true", *EVERY_OPERATOR)],
    ids=["defaults", "every-operator", "service-monitor"],
)
def test_off_renders_no_prometheus_rule(values: tuple[str, ...]) -> None:
    assert of_kind(template(*values), "PrometheusRule") == []


@pytest.mark.parametrize(
    ("values", "names"),
    [
        ((), ["postgres", "pooler"]),
        (("kafka.enabled=true",), ["postgres", "pooler", "kafka"]),
        (("cache.enabled=true",), ["postgres", "pooler", "cache"]),
        (EVERY_OPERATOR, ["postgres", "pooler", "kafka", "cache"]),
    ],
    ids=["postgres-only", "kafka", "cache", "every-operator"],
)
def test_on_renders_the_rules_of_the_operators_the_chart_runs(values: tuple[str, ...], names: list[str]) -> None:
    """A disabled operator's rules are not rendered: they would only watch series nobody exports."""
    rendered = prometheus_rules(template(ON, *values))
    assert sorted(rendered) == sorted(f"kanri-operator-{name}" for name in names)


@pytest.mark.parametrize("name", RULE_FILES)
def test_each_prometheus_rule_holds_exactly_its_files_groups(name: str) -> None:
    rule = prometheus_rules(template(ON, *EVERY_OPERATOR))[f"kanri-operator-{name}"]
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["metadata"]["namespace"] == "kanri-system"
    assert rule["spec"] == groups(name)
    # What Helm must not have touched: the annotations' own templates and the runbooks' paths.
    rules = [r for group in rule["spec"]["groups"] for r in group["rules"]]
    assert all(r["annotations"]["runbook_url"].startswith("docs/runbooks/") for r in rules)
    assert any("{{ $labels." in r["annotations"]["summary"] for r in rules)


def test_release_namespace_fullname_and_labels_come_from_values() -> None:
    objects = template(
        ON,
        "monitoring.prometheusRules.labels.release=prometheus",
        "fullnameOverride=pg-operator",
        release="pg",
        namespace="monitoring-test",
    )
    rendered = prometheus_rules(objects)
    assert sorted(rendered) == ["pg-operator-pooler", "pg-operator-postgres"]
    for rule in rendered.values():
        assert rule["metadata"]["namespace"] == "monitoring-test"
        assert rule["metadata"]["labels"] == {"release": "prometheus"}
    unlabelled = prometheus_rules(template(ON))
    assert all("labels" not in rule["metadata"] for rule in unlabelled.values())


@pytest.mark.parametrize("name", RULE_FILES)
def test_promtool_accepts_the_rendered_rules(name: str, tmp_path: Path) -> None:
    rule = prometheus_rules(template(ON, *EVERY_OPERATOR))[f"kanri-operator-{name}"]
    spec = tmp_path / f"{name}.yaml"
    spec.write_text(yaml.safe_dump(rule["spec"]))
    result = alert_rules.promtool("check", "rules", str(spec))
    assert result.returncode == 0, result.stdout + result.stderr
    count = sum(len(group["rules"]) for group in groups(name)["groups"])
    assert f"SUCCESS: {count} rules found" in result.stdout, result.stdout


def test_the_operators_service_monitors_keep_the_labels_the_rules_group_by() -> None:
    """The operators' series carry the watched object's ``namespace`` (the PostgreSQL ones also ``instance``), which
    the rules group by: without honorLabels Prometheus renames them ``exported_*`` and gives every object the operator
    pod's namespace. The PgBouncer agent's series have no such label, so its PodMonitor keeps the target's."""
    objects = template("monitoring.serviceMonitor.enabled=true", *EVERY_OPERATOR)
    monitors = {m["metadata"]["name"]: m["spec"]["endpoints"] for m in of_kind(objects, "ServiceMonitor")}
    assert sorted(monitors) == ["kanri-cache-operator", "kanri-kafka-operator", "kanri-operator"]
    assert {name: [e.get("honorLabels") for e in endpoints] for name, endpoints in monitors.items()} == {
        name: [True] for name in monitors
    }
    (pod_monitor,) = of_kind(objects, "PodMonitor")
    assert [e.get("honorLabels") for e in pod_monitor["spec"]["podMetricsEndpoints"]] == [None]
    exprs = [r["expr"] for name in RULE_FILES for g in groups(name)["groups"] for r in g["rules"]]
    assert any("by (namespace, cluster" in expr for expr in exprs)


def test_chart_lints_with_every_prometheus_rule() -> None:
    result = helm("lint", "--strict", str(CHART), "--set", ON, *(a for v in EVERY_OPERATOR for a in ("--set", v)))
    assert "0 chart(s) failed" in result.stdout, result.stdout


def test_the_packaged_chart_carries_the_rules(tmp_path: Path) -> None:
    """files/ goes into the package `make images` writes, so an installed package renders the same rules."""
    package = package_chart(CHART, [], tmp_path)
    text = helm("template", "kanri", str(package), "--namespace", "kanri-system", "--set", ON).stdout
    rendered = prometheus_rules([d for d in yaml.safe_load_all(text) if d])
    assert {name: rule["spec"] for name, rule in rendered.items()} == {
        "kanri-operator-postgres": groups("postgres"),
        "kanri-operator-pooler": groups("pooler"),
    }
