"""deploy/monitoring/kafka-alerts.yaml checked with promtool: accepted, its unit tests pass, every alert has a test
that fires and one that does not, a runbook (docs/runbooks/kafka-*.md) with the usual sections, and queries only
series the KafkaCluster and KafkaTopic controllers register, with their labels; docs/runbooks/README.md's index
names every alert and links its runbook."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kanri.kafka.cluster.metrics import ClusterMetrics
from kanri.kafka.topics.metrics import TopicMetrics
from tests import alert_rules
from tests.unit.test_monitoring import TARGET_LABELS, used_metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "monitoring" / "kafka-alerts.yaml"
TESTS = ROOT / "deploy" / "monitoring" / "kafka-alerts.test.yaml"


def rules() -> list[dict[str, Any]]:
    return alert_rules.rules(ALERTS)


def test_promtool_accepts_the_rules_and_their_tests_pass() -> None:
    alert_rules.assert_promtool_passes(ALERTS, TESTS)


def test_every_alert_is_tested_firing_and_quiet() -> None:
    alert_rules.assert_every_alert_fires_and_stays_quiet(ALERTS, TESTS)


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_every_alert_has_a_runbook_with_meaning_how_to_look_and_recovery(rule: dict[str, Any]) -> None:
    url = rule["annotations"]["runbook_url"]
    assert url.startswith("docs/runbooks/kafka-")
    runbook = (ROOT / url).read_text()
    assert runbook.startswith(f"# {rule['alert']}\n")
    for section in ("## Meaning", "## How to look", "## Recovery"):
        assert section in runbook, f"{url} has no {section!r} section"


def test_alerts_query_only_series_the_controllers_register() -> None:
    metrics = TopicMetrics(CollectorRegistry())
    gauges = [*metrics.gauges.values(), metrics.lag, *ClusterMetrics(CollectorRegistry()).gauges.values()]
    # private, but the only place a gauge keeps its name and labels (test_monitoring reads them the same way)
    known = {gauge._name: set(gauge._labelnames) for gauge in gauges}
    problems = []
    for rule in rules():
        for name, labels in used_metrics(rule["expr"]).items():
            if name not in known:
                problems.append(f"{rule['alert']}: {name} is not a metric the Kafka controllers register")
            elif unknown := labels - known[name] - TARGET_LABELS:
                problems.append(f"{rule['alert']}: {name} has no label {sorted(unknown)}")
    assert problems == []


def test_the_runbook_index_names_every_alert_and_links_its_runbook() -> None:
    index = (ROOT / "docs" / "runbooks" / "README.md").read_text()
    for rule in rules():
        page = Path(rule["annotations"]["runbook_url"]).name
        assert f"{rule['alert']} " in index, f"docs/runbooks/README.md does not name {rule['alert']}"
        assert f"]({page})" in index, f"docs/runbooks/README.md does not link {page}"
