"""kanri.kit one-shot pods: the verdict written in the pod is the verdict read by the operator."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from kanri.kit import one_shot, read_verdict, write_verdict
from kanri.kit._oneshot import MESSAGE_LIMIT

NOW = datetime(2026, 12, 6, 7, 0, tzinfo=UTC)


def ended(message: str, *, phase: str = "Succeeded", reason: str = "Completed", code: int = 0) -> dict[str, Any]:
    terminated = {"exitCode": code, "reason": reason, "message": message}
    return {"metadata": {"name": "p", "creationTimestamp": "2026-12-06T06:00:00Z"},
            "status": {"phase": phase, "containerStatuses": [{"state": {"terminated": terminated}}]}}  # fmt: skip


def test_the_pods_verdict_is_read_back_with_its_details(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "termination-log"
    line = write_verdict("Succeeded", "restored 3 tables", path=log, durationSeconds=12.5)
    assert capsys.readouterr().out.strip() == line  # also the last line of stdout
    verdict = read_verdict(ended("some log line\n" + log.read_text()), timeout=timedelta(hours=1), now=NOW)
    assert verdict is not None
    assert verdict.succeeded
    assert verdict.message == "restored 3 tables"
    assert verdict.details == {"durationSeconds": 12.5}


def test_a_long_message_is_shortened_to_fit_the_kubelets_limit(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    write_verdict("Failed", "ü" * 10_000, path=log, table="t")
    text = log.read_text()
    assert len(text.encode()) <= MESSAGE_LIMIT
    verdict = read_verdict(ended(text, phase="Failed"), timeout=timedelta(hours=1), now=NOW)
    assert verdict is not None
    assert verdict.result == "Failed"
    assert verdict.message.endswith("…")
    assert verdict.details == {"table": "t"}


def test_details_too_long_to_fit_are_dropped_but_the_verdict_stays(tmp_path: Path) -> None:
    log = tmp_path / "termination-log"
    write_verdict("Failed", "why", path=log, dump="x" * 5000)
    assert json.loads(log.read_text()) == {"result": "Failed", "message": "why"}


def test_a_pod_that_ended_without_a_verdict_failed_with_its_logs_tail() -> None:
    verdict = read_verdict(ended("panic: out of memory", phase="Failed", reason="Error", code=2),
                           timeout=timedelta(hours=1), now=NOW)  # fmt: skip
    assert verdict is not None
    assert not verdict.succeeded
    assert verdict.message == "the pod ended without a verdict (Error, exit code 2): panic: out of memory"


def test_a_running_pod_has_no_verdict_until_its_timeout() -> None:
    running = {"metadata": {"name": "p", "creationTimestamp": "2026-12-06T06:30:00Z"}, "status": {"phase": "Running"}}
    assert read_verdict(running, timeout=timedelta(hours=1), now=NOW) is None
    late = read_verdict(running, timeout=timedelta(minutes=10), now=NOW)
    assert late is not None
    assert late.result == "Failed"
    assert "did not finish within 0:10:00" in late.message


def test_a_forged_verdict_of_an_unknown_result_is_no_verdict() -> None:
    verdict = read_verdict(ended('{"result": "Approved", "message": "trust me"}'), timeout=timedelta(hours=1), now=NOW)
    assert verdict is not None
    assert verdict.result == "Failed"


def test_one_shot_pods_never_restart_and_fall_back_to_their_logs() -> None:
    pod: dict[str, Any] = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a"}, {"name": "b"}]}}
    made = one_shot(pod)
    assert made["spec"]["restartPolicy"] == "Never"
    assert {c["terminationMessagePolicy"] for c in made["spec"]["containers"]} == {"FallbackToLogsOnError"}
    assert "restartPolicy" not in pod["spec"]  # the input is not changed
