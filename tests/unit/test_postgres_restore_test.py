"""Restore rehearsals on the operator's side: when one is due, the pod, and reading what it found."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children.rehearsal import REQUEST, rehearsal_pod
from kanri.postgres.recovery.rehearsal import FIRST_BACKUP, SCHEDULE, TIMEOUT, due, next_scheduled, outcome

NOW = datetime(2026, 12, 6, 6, 0, tzinfo=UTC)  # a Sunday, after the default 05:00 rehearsal time


def spec(**backup: Any) -> PostgresClusterSpec:
    return PostgresClusterSpec.model_validate({"version": 16, "storage": {"size": "1Gi"}, "backup": backup})


def cluster(annotation: str | None = None, last: dict[str, Any] | None = None, backed_up: bool = True) -> Any:
    meta: dict[str, Any] = {"name": "orders", "namespace": "shop", "creationTimestamp": "2026-12-01T00:00:00Z"}
    if annotation is not None:
        meta["annotations"] = {"kanri.dev/restore-test": annotation}
    backup: dict[str, Any] = {"lastSuccessful": "2026-12-01T03:05:00Z"} if backed_up else {}
    if last is not None:
        backup["lastRestoreTest"] = last
    return {"metadata": meta, "status": {"backup": backup}}


def test_a_new_annotation_value_runs_once() -> None:
    assert due(spec(), cluster("first"), NOW) == "first"
    answered = {"time": NOW.isoformat(), "result": "Succeeded", "request": "first", "durationSeconds": 3}
    assert due(spec(), cluster("first", answered), NOW) is None
    assert due(spec(), cluster("second", answered), NOW) == "second"


def test_on_demand_works_before_the_first_backup_and_with_the_schedule_off() -> None:
    assert due(spec(restoreTest={"enabled": False}), cluster("now", backed_up=False), NOW) == "now"


def test_the_first_rehearsal_follows_the_first_backup_not_the_next_slot() -> None:
    # created Tuesday 00:00, backed up 03:05 the same day, it is Tuesday 04:00: the weekly slot is 5 days away
    tuesday = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)
    assert due(spec(), cluster(), tuesday) == FIRST_BACKUP
    assert due(spec(), cluster(backed_up=False), tuesday) is None  # nothing to restore yet
    assert due(spec(restoreTest={"enabled": False}), cluster(), tuesday) is None
    # answered (whatever the result): from then on the schedule counts from it
    for result in ("Succeeded", "Failed"):
        answered = {"time": "2026-12-01T03:09:00Z", "result": result, "request": FIRST_BACKUP, "durationSeconds": 40}
        assert due(spec(), cluster(last=answered), tuesday) is None
    # an annotation asked meanwhile goes first (its value is what the record answers)
    assert due(spec(), cluster("now"), tuesday) == "now"


def test_the_schedule_counts_from_the_last_rehearsal() -> None:
    last = {"time": "2026-12-06T05:10:00Z", "result": "Succeeded", "request": SCHEDULE, "durationSeconds": 3}
    assert due(spec(), cluster(last=last), NOW) is None  # next Sunday
    assert due(spec(), cluster(last=last), NOW + timedelta(days=7)) == SCHEDULE


def test_no_scheduled_rehearsal_without_a_backup_or_when_disabled_or_without_backups_at_all() -> None:
    assert due(spec(), cluster(backed_up=False), NOW) is None
    assert due(spec(restoreTest={"enabled": False}), cluster(), NOW) is None
    no_backup = PostgresClusterSpec.model_validate({"version": 16, "storage": {"size": "1Gi"}})
    assert due(no_backup, cluster("x"), NOW) is None


def test_next_scheduled_is_utc_cron() -> None:
    assert next_scheduled("0 5 * * 0", datetime(2026, 12, 2, tzinfo=UTC)) == datetime(2026, 12, 6, 5, tzinfo=UTC)
    assert next_scheduled("not a cron", NOW) is None


def finished_pod(phase: str, terminated: dict[str, Any] | None, request: str = "first") -> Any:
    status: dict[str, Any] = {"phase": phase}
    if terminated is not None:
        status["containerStatuses"] = [{"name": "restore-test", "state": {"terminated": terminated}}]
    meta = {"name": "orders-restore-test", "creationTimestamp": "2026-12-06T05:00:00Z",
            "annotations": {REQUEST: request}}  # fmt: skip
    return {"metadata": meta, "status": status}


def test_a_verdict_in_the_termination_message_becomes_the_record() -> None:
    verdict = {"result": "Succeeded", "durationSeconds": 12.6, "backup": "20261206T030000",
               "recoveredTo": "2026-12-06T04:59:00+00:00", "message": "recovery: fine; rows: 3 rows"}  # fmt: skip
    pod = finished_pod("Succeeded", {"exitCode": 0, "message": json.dumps(verdict), "startedAt": "2026-12-06T05:00:05Z",
                                     "finishedAt": "2026-12-06T05:00:20Z"})  # fmt: skip
    found = outcome(pod, NOW)
    assert found is not None
    assert found.succeeded
    assert found.record == {"time": "2026-12-06T05:00:20+00:00", "durationSeconds": 13, "result": "Succeeded",
                            "request": "first", "recoveredTo": "2026-12-06T04:59:00+00:00",
                            "message": "backup 20261206T030000: recovery: fine; rows: 3 rows"}  # fmt: skip


def test_a_failed_verdict_is_a_failed_record_with_its_message() -> None:
    verdict = {"result": "Failed", "durationSeconds": 4, "backup": None,
               "message": "recovery: PostgreSQL stopped before the end of recovery (exit code 1): ..."}  # fmt: skip
    found = outcome(finished_pod("Failed", {"exitCode": 1, "message": json.dumps(verdict)}), NOW)
    assert found is not None
    assert not found.succeeded
    assert found.record["message"].startswith("recovery: PostgreSQL stopped before the end of recovery")


def test_a_pod_that_ended_without_a_verdict_is_a_failure_that_says_how() -> None:
    oom = outcome(finished_pod("Failed", {"exitCode": 137, "reason": "OOMKilled", "message": ""}), NOW)
    assert oom is not None
    assert oom.record["result"] == "Failed"
    assert oom.record["message"] == "the rehearsal pod ended without a verdict (OOMKilled, exit code 137)"
    logs = outcome(finished_pod("Failed", {"exitCode": 1, "reason": "Error", "message": "Traceback\nboom"}), NOW)
    assert logs is not None
    assert logs.record["message"].endswith(": boom")
    evicted = {"metadata": finished_pod("Failed", None)["metadata"],
               "status": {"phase": "Failed", "reason": "Evicted", "message": "ephemeral storage exceeded"}}  # fmt: skip
    found = outcome(evicted, NOW)
    assert found is not None
    assert "Evicted" in found.record["message"]
    assert "ephemeral storage exceeded" in found.record["message"]


def test_a_running_pod_is_waited_for_until_the_timeout() -> None:
    running = finished_pod("Running", None)
    assert outcome(running, datetime(2026, 12, 6, 6, tzinfo=UTC)) is None
    late = outcome(running, datetime(2026, 12, 6, 5, tzinfo=UTC) + TIMEOUT + timedelta(seconds=1))
    assert late is not None
    assert late.record["result"] == "Failed"
    assert "did not finish within 6 h" in late.record["message"]


def test_the_pod_is_restricted_throwaway_and_reads_the_clusters_own_repository() -> None:
    owner = {"metadata": {"name": "orders", "namespace": "shop", "uid": "u-1"}, "apiVersion": "kanri.dev/v1alpha1",
             "kind": "PostgresCluster"}  # fmt: skip
    pod = rehearsal_pod(owner, 16, "first")
    assert pod["metadata"]["name"] == "orders-restore-test"
    assert pod["metadata"]["annotations"] == {REQUEST: "first"}
    assert "kanri.dev/role" not in pod["metadata"]["labels"]  # no Service selects it
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    body = pod["spec"]
    assert body["restartPolicy"] == "Never"
    assert body["automountServiceAccountToken"] is False
    assert body["securityContext"]["runAsNonRoot"] is True
    assert body["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = body["containers"]
    assert container["image"] == "kanri.dev/postgres:16"
    assert container["args"] == ["restore-test"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in body["volumes"]}
    assert "emptyDir" in volumes["data"]
    assert volumes["config"]["configMap"]["name"] == "orders-config"
    assert volumes["backup"]["secret"]["secretName"] == "orders-backup-credentials"
    assert not {"superuser", "app", "replication"} & set(volumes)  # it needs no credential of the database
