"""deploy/monitoring/kafka-alerts.yaml checked with promtool: accepted, its unit tests pass, every alert has a test
that fires and one that does not, a runbook (docs/runbooks/kafka-*.md) with the usual sections, and queries only
series the KafkaTopic controller registers, with their labels."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from kanri.kafka.topics.metrics import TopicMetrics
from tests.unit.test_monitoring import TARGET_LABELS, used_metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "monitoring" / "kafka-alerts.yaml"
TESTS = ROOT / "deploy" / "monitoring" / "kafka-alerts.test.yaml"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    assert found, "promtool not found: run `make system` (Debian's prometheus package ships it)"
    return subprocess.run([found, *args], capture_output=True, text=True, timeout=120, check=False)


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]]


def test_promtool_accepts_the_rules_and_their_tests_pass() -> None:
    checked = promtool("check", "rules", str(ALERTS))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", str(TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    cases = [case for test in yaml.safe_load(TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    names = {rule["alert"] for rule in rules()}
    assert names == {case["alertname"] for case in cases if case["exp_alerts"]}
    assert names == {case["alertname"] for case in cases if not case["exp_alerts"]}


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_every_alert_has_a_runbook_with_meaning_how_to_look_and_recovery(rule: dict[str, Any]) -> None:
    url = rule["annotations"]["runbook_url"]
    assert url.startswith("docs/runbooks/kafka-")
    runbook = (ROOT / url).read_text()
    assert runbook.startswith(f"# {rule['alert']}\n")
    for section in ("## Meaning", "## How to look", "## Recovery"):
        assert section in runbook, f"{url} has no {section!r} section"


def test_alerts_query_only_series_the_topic_controller_registers() -> None:
    metrics = TopicMetrics(CollectorRegistry())
    # private, but the only place a gauge keeps its name and labels (test_monitoring reads them the same way)
    known = {gauge._name: set(gauge._labelnames) for gauge in [*metrics.gauges.values(), metrics.lag]}
    problems = []
    for rule in rules():
        for name, labels in used_metrics(rule["expr"]).items():
            if name not in known:
                problems.append(f"{rule['alert']}: {name} is not a metric the topic controller registers")
            elif unknown := labels - known[name] - TARGET_LABELS:
                problems.append(f"{rule['alert']}: {name} has no label {sorted(unknown)}")
    assert problems == []
