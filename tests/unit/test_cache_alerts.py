"""deploy/monitoring/cache-alerts.yaml checked with promtool: accepted, its unit tests pass, every alert has a test
that fires and one that does not, and a runbook that exists."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "monitoring" / "cache-alerts.yaml"
TESTS = ROOT / "deploy" / "monitoring" / "cache-alerts.test.yaml"


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


def test_every_alert_is_tested_firing_and_quiet_and_has_a_runbook() -> None:
    cases = [case for test in yaml.safe_load(TESTS.read_text())["tests"] for case in test["alert_rule_test"]]
    names = {rule["alert"] for rule in rules()}
    assert names == {case["alertname"] for case in cases if case["exp_alerts"]}
    assert names == {case["alertname"] for case in cases if not case["exp_alerts"]}
    runbooks = (ROOT / "docs" / "cache.md").read_text()
    for rule in rules():
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/cache.md"
        assert f"\n### {rule['alert']}\n" in runbooks
        assert anchor == rule["alert"].lower()
