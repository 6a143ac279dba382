"""deploy/monitoring/cache-alerts.yaml checked with promtool: accepted, its unit tests pass, every alert has a test
that fires and one that does not, and a runbook (docs/runbooks/cache-*.md) with the usual sections."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import alert_rules

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "monitoring" / "cache-alerts.yaml"
TESTS = ROOT / "deploy" / "monitoring" / "cache-alerts.test.yaml"


def rules() -> list[dict[str, Any]]:
    return alert_rules.rules(ALERTS)


def test_promtool_accepts_the_rules_and_their_tests_pass() -> None:
    alert_rules.assert_promtool_passes(ALERTS, TESTS)


def test_every_alert_is_tested_firing_and_quiet() -> None:
    alert_rules.assert_every_alert_fires_and_stays_quiet(ALERTS, TESTS)


@pytest.mark.parametrize("rule", rules(), ids=lambda rule: rule["alert"])
def test_every_alert_has_a_runbook_with_meaning_how_to_look_and_recovery(rule: dict[str, Any]) -> None:
    url = rule["annotations"]["runbook_url"]
    assert url.startswith("docs/runbooks/cache-"), url
    runbook = (ROOT / url).read_text()
    assert runbook.startswith(f"# {rule['alert']}\n")
    for section in ("## Meaning", "## How to look", "## Recovery"):
        assert section in runbook, f"{url} has no {section!r} section"


def test_every_cache_runbook_belongs_to_an_alert() -> None:
    pages = {path.relative_to(ROOT).as_posix() for path in (ROOT / "docs" / "runbooks").glob("cache-*.md")}
    assert pages == {rule["annotations"]["runbook_url"] for rule in rules()}


def test_the_runbook_index_links_every_cache_runbook() -> None:
    index = (ROOT / "docs" / "runbooks" / "README.md").read_text()
    for rule in rules():
        page = Path(rule["annotations"]["runbook_url"]).name
        assert f"{rule['alert']} " in index, f"docs/runbooks/README.md does not name {rule['alert']}"
        assert f"]({page})" in index, f"docs/runbooks/README.md does not link {page}"
