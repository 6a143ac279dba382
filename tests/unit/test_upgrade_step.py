"""The major upgrade executor's pure parts (kanri.postgres.upgrade.step): when the instances are kept stopped, the
ConfigMap's note for the replicas, and how a one-off pod's verdict is read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from kanri.postgres.upgrade.step import _verdict, config_note, in_progress, stops_instances

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def _record(phase: str, step: str | None = None) -> dict[str, object]:
    record: dict[str, object] = {"phase": phase, "from": 14, "to": 15, "primary": "up-2"}
    if step is not None:
        record["step"] = step
    return record


def test_the_instances_stay_stopped_only_while_stopping_and_upgrading() -> None:
    assert stops_instances({"upgrade": _record("Upgrading", "Stopping")})
    assert stops_instances({"upgrade": _record("Upgrading", "Upgrading")})
    assert not stops_instances({"upgrade": _record("Upgrading", "Starting")})
    for phase in ("Checking", "Failed", "Succeeded", "WaitingForPreconditions"):
        assert not stops_instances({"upgrade": _record(phase)})
    assert not stops_instances({})


def test_replicas_are_told_to_reclone_only_once_the_primary_is_upgraded() -> None:
    assert config_note({"upgrade": _record("Upgrading", "Upgrading")}) is None
    assert config_note({"upgrade": _record("Upgrading", "Starting")}) == {"to": 15, "primary": "up-2"}
    assert config_note({"upgrade": _record("Succeeded")}) == {"to": 15, "primary": "up-2"}
    assert config_note({"upgrade": _record("Failed")}) is None
    assert in_progress({"upgrade": _record("Upgrading", "Stopping")}) is not None
    assert in_progress({"upgrade": _record("Checking")}) is None


def _pod(phase: str, message: str | None = None, created: datetime = NOW, **terminated: object) -> dict[str, object]:
    state = {"exitCode": 0, "reason": "Completed", **terminated}
    if message is not None:
        state["message"] = message
    return {"metadata": {"creationTimestamp": created.isoformat()},
            "status": {"phase": phase, "containerStatuses": [{"state": {"terminated": state}}]}}  # fmt: skip


def test_a_verdict_is_the_last_json_line_of_the_termination_message() -> None:
    pod = _pod("Succeeded", 'noise\n{"result": "Succeeded", "message": "ok", "pgUpgradeSeconds": 3.2}\n')
    assert _verdict(pod, timedelta(hours=1), NOW) == {"result": "Succeeded", "message": "ok", "pgUpgradeSeconds": 3.2}


def test_a_pod_without_a_verdict_failed_and_says_how() -> None:
    found = _verdict(_pod("Failed", "Traceback: boom", exitCode=1, reason="Error"), timedelta(hours=1), NOW)
    assert found is not None
    assert found["result"] == "Failed"
    assert "without a verdict (Error, exit code 1)" in found["message"]
    assert "boom" in found["message"]
    # a Succeeded pod that wrote nothing is not a success
    assert _verdict(_pod("Succeeded"), timedelta(hours=1), NOW)["result"] == "Failed"  # type: ignore[index]


def test_a_running_pod_has_no_verdict_until_its_timeout() -> None:
    running = {"metadata": {"creationTimestamp": NOW.isoformat()}, "status": {"phase": "Running"}}
    assert _verdict(running, timedelta(hours=1), NOW + timedelta(minutes=59)) is None
    late = _verdict(running, timedelta(hours=1), NOW + timedelta(hours=2))
    assert late is not None
    assert late["result"] == "Failed"
