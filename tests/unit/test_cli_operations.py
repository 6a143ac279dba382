"""The operation commands' rules: which annotation or field each writes, and when each refuses (writing nothing)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from typer.testing import CliRunner

from kanri.cli.main import app
from kanri.cli.operations import (
    HIBERNATED_REPLICAS,
    RESTORE_TEST,
    Planned,
    Refused,
    hibernate,
    promote,
    restart,
    restore_test,
    wake,
)
from kanri.postgres.children.statefulset import RESTART
from kanri.postgres.ha.failover import APPROVE, SWITCHOVER

NOW = datetime(2026, 12, 2, 7, 30, tzinfo=UTC)


def cluster(replicas: int = 3, phase: str | None = None, annotations: dict[str, str] | None = None,
            backup: bool = True) -> dict[str, Any]:  # fmt: skip
    status: dict[str, Any] = {
        "currentPrimary": "pg-1",
        "instances": [{"name": f"pg-{i}", "role": "Primary" if i == 1 else "Replica"} for i in (1, 2, 3)],
    }
    if phase:
        status["failover"] = {"phase": phase}
    spec: dict[str, Any] = {"replicas": replicas}
    if backup:
        spec["backup"] = {"retentionDays": 14}
    return {"metadata": {"name": "pg", "namespace": "team", "annotations": annotations or {}}, "spec": spec,
            "status": status}  # fmt: skip


def written(outcome: Planned | Refused) -> dict[str, Any]:
    assert isinstance(outcome, Planned), outcome
    result: dict[str, Any] = outcome.patch["metadata"]["annotations"]
    return result


def test_promote_asks_for_a_switchover_of_a_healthy_cluster() -> None:
    assert written(promote(cluster(), "pg-2")) == {SWITCHOVER: "pg-2"}


def test_promote_approves_a_blocked_failover_instead() -> None:
    assert written(promote(cluster(phase="Blocked"), "pg-3")) == {APPROVE: "pg-3"}


def test_promote_refuses_an_unknown_instance_the_primary_and_a_failover_in_progress() -> None:
    unknown = promote(cluster(), "pg-9")
    assert isinstance(unknown, Refused)
    assert "pg-9 is not an instance of pg (instances: pg-1, pg-2, pg-3)" in unknown.reason
    primary = promote(cluster(), "pg-1")
    assert isinstance(primary, Refused)
    assert "primary of pg already" in primary.reason
    busy = promote(cluster(phase="Promoting"), "pg-2")
    assert isinstance(busy, Refused)
    assert "phase Promoting" in busy.reason


def test_restart_and_restore_test_write_a_new_value_each_time() -> None:
    assert written(restart(cluster(), NOW)) == {RESTART: "2026-12-02T07:30:00Z"}
    assert written(restore_test(cluster(), NOW)) == {RESTORE_TEST: "2026-12-02T07:30:00Z"}
    assert isinstance(restart(cluster(replicas=0), NOW), Refused)
    no_backup = restore_test(cluster(backup=False), NOW)
    assert isinstance(no_backup, Refused)
    assert "no spec.backup" in no_backup.reason


def test_hibernate_keeps_the_count_and_wake_restores_it() -> None:
    asleep = hibernate(cluster(replicas=3))
    assert isinstance(asleep, Planned)
    assert asleep.patch == {"metadata": {"annotations": {HIBERNATED_REPLICAS: "3"}}, "spec": {"replicas": 0}}
    assert isinstance(hibernate(cluster(replicas=0)), Refused)
    woken = wake(cluster(replicas=0, annotations={HIBERNATED_REPLICAS: "3"}), None)
    assert isinstance(woken, Planned)
    assert woken.patch == {"metadata": {"annotations": {HIBERNATED_REPLICAS: None}}, "spec": {"replicas": 3}}
    assert wake(cluster(replicas=0, annotations={HIBERNATED_REPLICAS: "3"}), 1).patch["spec"] == {"replicas": 1}  # type: ignore[union-attr]
    unknown = wake(cluster(replicas=0), None)
    assert isinstance(unknown, Refused)
    assert "--replicas" in unknown.reason
    assert isinstance(wake(cluster(replicas=2), None), Refused)


def test_the_commands_are_installed() -> None:
    result = CliRunner().invoke(app, ["--help"])
    for command in ("promote", "restart", "restore-test", "hibernate", "wake", "status"):
        assert command in result.output
