"""deploy/monitoring/ checked with the real tools: promtool accepts the rules and passes their unit tests (every alert
firing and not firing), the PrometheusRule is the same rules, every alert has a runbook, and every metric the alerts
and the dashboard query is one kanri's code registers (with the labels it has).

Regenerate the PrometheusRule after editing alerts.yaml: ``make monitoring`` (``python -m tests.unit.test_monitoring``),
which also writes the Helm chart's copies of every rule file (tests/unit/test_chart_prometheus_rules.py).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from kanri.instance import exporter
from kanri.postgres.backup.archiving import BackupMetrics
from kanri.postgres.cluster.problems import SEVERITY
from kanri.postgres.metrics import PostgresMetrics
from kanri.postgres.pooler.agent import metrics as pooler_agent
from kanri.postgres.pooler.agent import primary_watch
from kanri.runtime import Client, LeaderElector
from kanri.runtime._client import ClientMetrics
from kanri.runtime._connection import Connection
from kanri.runtime._controller_metrics import ControllerMetrics
from kanri.runtime._queue_metrics import WorkQueueMetrics

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
ALERTS = MONITORING / "alerts.yaml"
PROMETHEUS_RULE = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "dashboard.json"
RUNBOOKS = ROOT / "docs" / "runbooks"
FIX = "run `make monitoring` (python -m tests.unit.test_monitoring) and commit deploy/monitoring/prometheusrule.yaml"

# Labels Prometheus adds to every scraped series (target labels), on top of those the code sets.
TARGET_LABELS = {"job", "instance", "namespace", "pod", "service", "container", "endpoint"}
SEVERITIES = {"critical", "warning", "info"}
# kafka-ops (marked edit): docs/runbooks/kafka-*.md are the runbooks of deploy/monitoring/kafka-alerts.yaml, checked
# (alert, sections, metrics) by tests/unit/test_kafka_alerts.py; this file checks alerts.yaml's.
KAFKA_RUNBOOKS = {path.stem for path in (ROOT / "docs" / "runbooks").glob("kafka-*.md")}
# cache-helm (marked edit): docs/runbooks/cache-*.md are the runbooks of deploy/monitoring/cache-alerts.yaml, checked
# (alert, sections, each page an alert's) by tests/unit/test_cache_alerts.py.
CACHE_RUNBOOKS = {path.stem for path in (ROOT / "docs" / "runbooks").glob("cache-*.md")}
# pooler-monitoring (marked edit): docs/runbooks/pooler-*.md are the runbooks of deploy/monitoring/pooler-alerts.yaml,
# checked (alert, sections, each page an alert's, the index) by tests/unit/test_pooler_alerts.py.
POOLER_RUNBOOKS = {path.stem for path in (ROOT / "docs" / "runbooks").glob("pooler-*.md")}

# --- the PrometheusRule, generated from alerts.yaml ------------------------------------------------------------------

PROMETHEUS_RULE_HEAD = """\
# Generated from deploy/monitoring/alerts.yaml by `python -m tests.unit.test_monitoring`; do not edit.
# The same rules as a Prometheus Operator PrometheusRule (monitoring.coreos.com/v1).
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: kanri
  namespace: kanri-system
  labels:
    app.kubernetes.io/name: kanri
    app.kubernetes.io/part-of: kanri
spec:
"""


def render_prometheus_rule(alerts_text: str) -> str:
    """alerts.yaml's ``groups`` under a PrometheusRule's ``spec`` (its comments and layout kept, indented by two)."""
    body = alerts_text[alerts_text.index("groups:") :]
    return PROMETHEUS_RULE_HEAD + "".join(f"  {line}" if line.strip() else line for line in body.splitlines(True))


def alerts() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(ALERTS.read_text())
    return loaded


def alert_rules() -> list[dict[str, Any]]:
    return [rule for group in alerts()["groups"] for rule in group["rules"] if "alert" in rule]


# --- promtool --------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    # Not a skip: `make setup` installs it (Debian's prometheus package), and CI must run these checks.
    assert found, "promtool not found: run `make system` (installs Debian's prometheus package, which ships it)"
    return found


def run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def test_promtool_accepts_the_rules(promtool: str) -> None:
    result = run([promtool, "check", "rules", str(ALERTS)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(alert_rules())} rules found" in result.stdout


def test_promtool_accepts_the_prometheus_rules_spec(promtool: str, tmp_path: Path) -> None:
    spec = yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]
    extracted = tmp_path / "spec.yaml"
    extracted.write_text(yaml.safe_dump(spec))
    result = run([promtool, "check", "rules", str(extracted)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_pass(promtool: str) -> None:
    files = sorted(str(path) for path in (MONITORING / "tests").glob("*.yaml"))
    assert files
    result = run([promtool, "test", "rules", *files])
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("SUCCESS") == len(files), result.stdout


def test_promtool_unit_tests_fail_when_an_alert_changes(promtool: str, tmp_path: Path) -> None:
    """The unit tests really compare: a threshold moved in the rules makes them fail."""
    broken = ALERTS.read_text().replace("pending_seconds > 1800", "pending_seconds > 7200")
    assert broken != ALERTS.read_text()
    (tmp_path / "alerts.yaml").write_text(broken)
    (tmp_path / "tests").mkdir()
    for path in (MONITORING / "tests").glob("*.yaml"):
        (tmp_path / "tests" / path.name).write_text(path.read_text())
    result = run([promtool, "test", "rules", str(tmp_path / "tests" / "operator.yaml")])
    assert result.returncode != 0
    assert "KanriFinalizerStuck" in result.stdout + result.stderr


def unit_tests() -> Iterator[dict[str, Any]]:
    for path in sorted((MONITORING / "tests").glob("*.yaml")):
        for test in yaml.safe_load(path.read_text())["tests"]:
            yield from test.get("alert_rule_test") or []


def test_every_alert_is_unit_tested_firing_and_not_firing() -> None:
    firing = {case["alertname"] for case in unit_tests() if case.get("exp_alerts")}
    quiet = {case["alertname"] for case in unit_tests() if not case.get("exp_alerts")}
    names = {rule["alert"] for rule in alert_rules()}
    assert names - firing == set(), "alerts with no test that expects them to fire"
    assert names - quiet == set(), "alerts with no test that expects them not to fire"
    assert (firing | quiet) - names == set(), "tests of alerts that do not exist"


# --- the PrometheusRule is alerts.yaml -------------------------------------------------------------------------------


def test_prometheus_rule_is_generated_from_alerts() -> None:
    assert PROMETHEUS_RULE.read_text() == render_prometheus_rule(ALERTS.read_text()), FIX


def test_prometheus_rule_holds_the_same_groups() -> None:
    rule = yaml.safe_load(PROMETHEUS_RULE.read_text())
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"] == alerts()


# --- every alert is documented ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("rule", alert_rules(), ids=lambda rule: rule["alert"])
def test_alert_has_severity_summary_and_an_existing_runbook(rule: dict[str, Any]) -> None:
    name = rule["alert"]
    assert rule["labels"]["severity"] in SEVERITIES
    assert rule["annotations"]["summary"]
    assert rule["annotations"]["description"]
    assert rule["annotations"]["runbook_url"] == f"docs/runbooks/{name}.md"
    runbook = (ROOT / rule["annotations"]["runbook_url"]).read_text()
    assert runbook.startswith(f"# {name}\n")
    for section in ("## Meaning", "## How to look", "## Recovery"):
        assert section in runbook, f"{name}'s runbook has no {section!r} section"


def test_no_runbook_without_an_alert_or_a_condition_reason() -> None:
    # A runbook is for an alert, or for a Degraded reason the status links to (kanri.postgres.cluster.problems.runbook).
    names = {rule["alert"] for rule in alert_rules()} | set(SEVERITY)
    orphans = sorted(
        path.stem
        for path in RUNBOOKS.glob("*.md")
        if path.stem not in names | {"README"} | KAFKA_RUNBOOKS | CACHE_RUNBOOKS | POOLER_RUNBOOKS
    )
    assert orphans == []


# --- every queried metric exists --------------------------------------------------------------------------------------


_SUFFIXES = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "summary": ["_sum", "_count"]}


def registered() -> dict[str, set[str]]:
    """Every sample name kanri's code exposes (counters with ``_total``, histograms' ``_bucket``...) -> its labels."""
    registry = CollectorRegistry()
    PostgresMetrics(registry)
    BackupMetrics(registry)
    ControllerMetrics(registry)
    WorkQueueMetrics(registry)
    ClientMetrics(registry)
    LeaderElector(Client(Connection(host="http://127.0.0.1:1")), namespace="n", name="l", identity="i",
                  registry=registry)  # fmt: skip
    names: dict[str, set[str]] = {}
    for collector in list(registry._collector_to_names):  # private, but the only place labels are kept
        families = collector.describe() if hasattr(collector, "describe") else []
        labels = set(getattr(collector, "_labelnames", ()))
        for family in families or collector.collect():
            family_labels = labels or set(getattr(family, "_labelnames", ()))
            for suffix in _SUFFIXES.get(family.type, [""]):
                extra = {"le"} if suffix == "_bucket" else set()
                names[family.name + suffix] = family_labels | extra
    for name, _, exported in exporter.described():  # the instance exporter renders snapshots: its table is the truth
        names[name] = set(exported)
    names.update(pooler_agent_series())
    return names


def pooler_agent_series() -> dict[str, set[str]]:
    """Every series the PgBouncer pods' agent exports -> its label names (one scrape of a pool, its stats, lists
    and config: kanri.postgres.pooler.agent.metrics.samples, which the agent renders at each scrape)."""
    pool = {column: 1 for column in pooler_agent.POOL_GAUGES} | {"database": "app", "user": "app", "maxwait": 1}
    stats = {column: 1 for column in pooler_agent.STATS_COUNTERS} | {"database": "app"}
    lists = [{"list": "used_clients", "items": 1}]
    config = [{"key": "max_client_conn", "value": "1000"}]
    found: dict[str, set[str]] = {}
    for family in [
        *pooler_agent.samples([pool], [stats], lists, config),
        *primary_watch.Renewals().collect(),
        *primary_watch.Ended().collect(),
    ]:
        for sample in family.samples:
            found.setdefault(sample.name, set()).update(sample.labels)
    return found


_STRING = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")
_SELECTOR = re.compile(r"([a-zA-Z_:][\w:]*)\s*\{([^}]*)\}")
_NOISE = re.compile(r"\{[^}]*\}|\[[^\]]*\]|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)|\$\w+")
_IDENT = re.compile(r"(?<![\w:.])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()")
_KEYWORDS = {"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right",
             "inf", "nan", "Inf", "NaN"}  # fmt: skip


def used_metrics(expr: str) -> dict[str, set[str]]:
    """The metric names a PromQL expression selects -> the label names its matchers use."""
    used: dict[str, set[str]] = {}
    for name, matchers in _SELECTOR.findall(expr):
        used.setdefault(name, set()).update(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", _STRING.sub('""', matchers)))
    for name in _IDENT.findall(_NOISE.sub(" ", _STRING.sub('""', expr))):
        if name not in _KEYWORDS:
            used.setdefault(name, set())
    return used


def test_used_metrics_parses_promql() -> None:
    expr = 'histogram_quantile(0.9, sum by (le) (rate(a_bucket{x="1", y=~"$v"}[$__rate_interval]))) > 1e3 and on () b'
    assert used_metrics(expr) == {"a_bucket": {"x", "y"}, "b": set()}


def dashboard_exprs() -> list[str]:
    """Every panel's PromQL, and the metric selectors of the template variables' ``label_values(selector, label)``."""
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            exprs.append(re.fullmatch(r"label_values\((.*),\s*\w+\)", variable["query"]["query"]).group(1))  # type: ignore[union-attr]
    return exprs


def check_metrics(exprs: list[str]) -> list[str]:
    known = registered()
    problems = []
    for expr in exprs:
        for name, labels in used_metrics(expr).items():
            if name not in known:
                problems.append(f"{name} (in {expr!r}) is not a metric kanri registers")
            elif unknown := labels - known[name] - TARGET_LABELS:
                problems.append(f"{name} has no label {sorted(unknown)} (in {expr!r})")
    return problems


def test_alerts_query_only_registered_metrics() -> None:
    assert check_metrics([rule["expr"] for rule in alert_rules()]) == []


def test_dashboard_queries_only_registered_metrics() -> None:
    exprs = dashboard_exprs()
    assert len(exprs) >= 10
    assert check_metrics(exprs) == []


def test_promtool_parses_every_dashboard_query(promtool: str, tmp_path: Path) -> None:
    """Each panel's PromQL as a recording rule, so promtool's parser checks it (Grafana's interval made concrete)."""
    exprs = [expr.replace("$__rate_interval", "5m") for expr in dashboard_exprs()]
    rules = [{"record": f"dashboard:query_{index}", "expr": expr} for index, expr in enumerate(exprs)]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = run([promtool, "check", "rules", str(path)])
    assert result.returncode == 0, result.stdout + result.stderr


def test_metric_check_catches_a_misspelt_metric_and_label() -> None:
    problems = check_metrics(['kanri_postgres_cluster_conditions{type="Ready"}', 'workqueue_depth{queue="x"}'])
    assert len(problems) == 2


def test_dashboard_panels_are_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"]
    assert dashboard["title"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["title"]
        assert panel["targets"], panel["title"]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]


if __name__ == "__main__":
    from tests.unit.test_chart_prometheus_rules import write_chart_copies

    PROMETHEUS_RULE.write_text(render_prometheus_rule(ALERTS.read_text()))
    print(f"wrote {PROMETHEUS_RULE.relative_to(ROOT)}", file=sys.stderr)
    # The Helm chart's copies of every rule file (its PrometheusRules; tests/unit/test_chart_prometheus_rules.py).
    for path in write_chart_copies():
        print(f"wrote {path.relative_to(ROOT)}", file=sys.stderr)


def test_the_runbook_index_lists_every_alert_with_its_severity_and_every_other_page() -> None:
    index = (RUNBOOKS / "README.md").read_text()
    rows = re.findall(r"^\| (\w+) \| (?:(\w+) \| )?\[(\w+)\.md\]\(\3\.md\) \|$", index, flags=re.MULTILINE)
    listed = {name: severity for name, severity, _ in rows}
    expected = {rule["alert"]: rule["labels"]["severity"] for rule in alert_rules()}
    assert {name: listed.get(name) for name in expected} == expected
    pages = {path.stem for path in RUNBOOKS.glob("*.md")} - {"README"} - KAFKA_RUNBOOKS - CACHE_RUNBOOKS
    pages -= POOLER_RUNBOOKS
    assert set(listed) == pages
