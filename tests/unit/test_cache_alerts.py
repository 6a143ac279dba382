"""deploy/monitoring/cache-alerts.yaml checked with promtool: accepted, its unit tests pass, every alert has a test
that fires and one that does not, and a runbook that exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests import alert_rules

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "monitoring" / "cache-alerts.yaml"
TESTS = ROOT / "deploy" / "monitoring" / "cache-alerts.test.yaml"


def rules() -> list[dict[str, Any]]:
    return alert_rules.rules(ALERTS)


def test_promtool_accepts_the_rules_and_their_tests_pass() -> None:
    alert_rules.assert_promtool_passes(ALERTS, TESTS)


def test_every_alert_is_tested_firing_and_quiet_and_has_a_runbook() -> None:
    alert_rules.assert_every_alert_fires_and_stays_quiet(ALERTS, TESTS)
    runbooks = (ROOT / "docs" / "cache.md").read_text()
    for rule in rules():
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/cache.md"
        assert f"\n### {rule['alert']}\n" in runbooks
        assert anchor == rule["alert"].lower()
