"""deploy/monitoring/pooler-alerts.yaml checked with promtool: accepted, its unit tests pass (every alert has a case
that fires and one that does not, and moving a threshold makes them fail), each alert has a runbook
(docs/runbooks/pooler-*.md) with the usual sections and is in the runbook index, and the rules query only the series
each PgBouncer pod's agent exports (kanri.postgres.pooler.agent.metrics) — or Prometheus' own ``up`` of the job the
chart's PodMonitor names — with labels the agent or the PodMonitor gives them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests import alert_rules
from tests.unit.test_monitoring import TARGET_LABELS, pooler_agent_series, used_metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "monitoring" / "pooler-alerts.yaml"
TESTS = ROOT / "deploy" / "monitoring" / "pooler-alerts.test.yaml"
JOB = "kanri-pgbouncer"
"""The job the chart's PodMonitor (templates/pooler-metrics.yaml) gives every pooler target."""
POD_MONITOR_LABELS = {"pooler"}
"""Target labels the PodMonitor adds to Prometheus' own (the PostgresPooler's name)."""


def rules() -> list[dict[str, Any]]:
    return alert_rules.rules(ALERTS)


def test_promtool_accepts_the_rules_and_their_tests_pass() -> None:
    alert_rules.assert_promtool_passes(ALERTS, TESTS)


def test_every_alert_is_tested_firing_and_quiet() -> None:
    assert alert_rules.assert_every_alert_fires_and_stays_quiet(ALERTS, TESTS) == {
        "PoolerDown", "PoolerNoServerConnections", "PoolerClientsWaiting", "PoolerClientConnectionsNearLimit"
    }  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "alert"),
    [
        ("kanri_pgbouncer_max_wait_seconds) > 10", "kanri_pgbouncer_max_wait_seconds) > 60", "PoolerClientsWaiting"),
        ("for: 2m", "for: 5m", "PoolerNoServerConnections"),
        ("          unless on", "          or on", "PoolerNoServerConnections"),
        ('up{job="kanri-pgbouncer"} == 0 or ', "", "PoolerDown"),
        (
            "kanri_pgbouncer_max_client_connections\n          ) > 0.9",
            "kanri_pgbouncer_max_client_connections\n          ) > 0.99",
            "PoolerClientConnectionsNearLimit",
        ),
    ],
    ids=["wait-threshold", "duration", "servers-present", "not-scraped", "client-limit-share"],
)
def test_the_promtool_tests_fail_when_an_alert_changes(old: str, new: str, alert: str, tmp_path: Path) -> None:
    """The cases really compare: a moved threshold or a dropped clause makes them fail, naming the alert."""
    text = ALERTS.read_text()
    assert old in text
    (tmp_path / ALERTS.name).write_text(text.replace(old, new))
    (tmp_path / TESTS.name).write_text(TESTS.read_text())
    result = alert_rules.promtool("test", "rules", str(tmp_path / TESTS.name))
    assert result.returncode != 0, result.stdout
    assert alert in result.stdout + result.stderr


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_every_alert_has_a_runbook_with_meaning_how_to_look_and_recovery(rule: dict[str, Any]) -> None:
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    assert rule["annotations"]["summary"]
    assert rule["annotations"]["description"]
    url = rule["annotations"]["runbook_url"]
    assert url.startswith("docs/runbooks/pooler-"), url
    runbook = (ROOT / url).read_text()
    assert runbook.startswith(f"# {rule['alert']}\n")
    for section in ("## Meaning", "## How to look", "## Recovery"):
        assert section in runbook, f"{url} has no {section!r} section"


def test_every_pooler_runbook_belongs_to_an_alert() -> None:
    pages = {path.relative_to(ROOT).as_posix() for path in (ROOT / "docs" / "runbooks").glob("pooler-*.md")}
    assert pages == {rule["annotations"]["runbook_url"] for rule in rules()}


def test_the_runbook_index_names_every_alert_and_links_its_runbook() -> None:
    index = (ROOT / "docs" / "runbooks" / "README.md").read_text()
    for rule in rules():
        page = Path(rule["annotations"]["runbook_url"]).name
        assert f"{rule['alert']} " in index, f"docs/runbooks/README.md does not name {rule['alert']}"
        assert f"]({page})" in index, f"docs/runbooks/README.md does not link {page}"


def test_alerts_query_only_series_the_agent_exports_or_the_pooler_jobs_up() -> None:
    known = pooler_agent_series() | {"up": set()}
    problems = []
    for rule in rules():
        for name, labels in used_metrics(rule["expr"]).items():
            if name not in known:
                problems.append(f"{rule['alert']}: {name} is not a series the pooler's agent exports")
            elif unknown := labels - known[name] - TARGET_LABELS - POD_MONITOR_LABELS:
                problems.append(f"{rule['alert']}: {name} has no label {sorted(unknown)}")
        for selected in re.findall(r"\bup\{([^}]*)\}", rule["expr"]):
            if selected != f'job="{JOB}"':
                problems.append(f"{rule['alert']}: up is selected by {selected!r}, not by the pooler job {JOB!r}")
    assert problems == []


def test_the_metric_check_catches_a_misspelt_series() -> None:
    known = pooler_agent_series()
    assert "kanri_pgbouncer_clients_waiting" in known
    assert "kanri_pgbouncer_client_waiting" not in known
    assert known["kanri_pgbouncer_clients_waiting"] == {"database", "user"}


def test_docs_pooler_md_lists_every_series_the_agent_exports() -> None:
    text = (ROOT / "docs" / "pooler.md").read_text()
    table = text[text.index("| metric | labels | meaning |") : text.index("### Scraping")]
    documented: set[str] = set()
    for cell in re.findall(r"^\| ([^|]+) \|", table, flags=re.MULTILINE):
        for name in re.findall(r"`(\w+)`", cell):
            documented.add(name if name.startswith("kanri_") else f"kanri_pgbouncer{name}")
    assert documented - {"metric"} == set(pooler_agent_series())
