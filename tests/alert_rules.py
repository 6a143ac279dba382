"""What the operators' alert-file tests share: promtool, the rules of a file, its promtool tests' cases."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    found = shutil.which("promtool")
    assert found, "promtool not found: run `make system` (Debian's prometheus package ships it)"
    return subprocess.run([found, *args], capture_output=True, text=True, timeout=120, check=False)


def rules(alerts: Path) -> list[dict[str, Any]]:
    """Every rule of a PrometheusRule-style file (its groups flattened)."""
    return [rule for group in yaml.safe_load(alerts.read_text())["groups"] for rule in group["rules"]]


def assert_promtool_passes(alerts: Path, tests: Path) -> None:
    """promtool accepts the rules, and their unit tests pass."""
    checked = promtool("check", "rules", str(alerts))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", str(tests))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def assert_every_alert_fires_and_stays_quiet(alerts: Path, tests: Path) -> set[str]:
    """Each alert has a promtool case where it fires and one where it does not; returns the alert names."""
    cases = [case for test in yaml.safe_load(tests.read_text())["tests"] for case in test["alert_rule_test"]]
    names = {rule["alert"] for rule in rules(alerts)}
    assert names == {case["alertname"] for case in cases if case["exp_alerts"]}
    assert names == {case["alertname"] for case in cases if not case["exp_alerts"]}
    return names
