"""Status, storage growth, restarts and instance reports: the decisions, without an API server."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kanri.postgres.cluster.instances import InstanceReport, parse_report
from kanri.postgres.cluster.problems import report_problems, runbook
from kanri.postgres.cluster.status import Observation, compute_status, condition_flipped, status_patch
from kanri.postgres.topology.plan import plan_instances
from kanri.postgres.topology.restarts import next_restart
from kanri.postgres.topology.storage import StoragePlan, plan_storage

Obj = dict[str, Any]
NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def report(name: str, role: str = "replica", *, ready: bool = True, **extra: Any) -> InstanceReport:
    return InstanceReport(name=name, role=role, ready=ready, running=True, **extra)


def observe(replicas: int = 3, reports: dict[str, InstanceReport] | None = None, **extra: Any) -> Observation:
    plan = plan_instances("db", replicas, ["db-1", "db-2", "db-3"], "db-1")
    return Observation(plan=plan, hibernated=replicas == 0, generation=2, reports=reports or {}, pods={},
                       storage=extra.pop("storage", StoragePlan()), **extra)  # fmt: skip


def conditions(status: Obj) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def all_ready() -> dict[str, InstanceReport]:
    return {"db-1": report("db-1", "primary", timeline=3), "db-2": report("db-2", lag_bytes=16),
            "db-3": report("db-3", lag_bytes=3 * 2**20 + 5)}  # fmt: skip


def test_a_new_cluster_is_provisioning_and_says_why_instances_are_not_ready() -> None:
    status = compute_status({}, observe(), NOW)
    assert conditions(status) == {
        "Ready": ("False", "PrimaryNotReady"),
        "Progressing": ("True", "Provisioning"),
        "Degraded": ("False", "AsExpected"),
        "StorageResizing": ("False", "Resized"),
    }
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["message"] == "0/3 instances ready: db-1: no pod yet; db-2: no pod yet; db-3: no pod yet"
    assert (status["phase"], status["currentPrimary"], status["readyReplicas"]) == ("Provisioning", "db-1", 0)
    assert [i["role"] for i in status["instances"]] == ["Primary", "Replica", "Replica"]


def test_every_instance_ready_makes_the_cluster_ready_with_lag_in_whole_mib() -> None:
    status = compute_status({}, observe(reports=all_ready()), NOW)
    assert conditions(status)["Ready"] == ("True", "InstancesReady")
    assert conditions(status)["Progressing"] == ("False", "Converged")
    assert (status["phase"], status["timeline"], status["readyReplicas"]) == ("Ready", 3, 3)
    # A few bytes behind is 0 (no status churn on a busy primary); 3 MiB and 5 bytes is 3 MiB.
    assert [i.get("lagBytes") for i in status["instances"]] == [None, 0, 3 * 2**20]
    assert "receivedLSN" not in status["instances"][0]


def test_a_converged_status_needs_no_patch() -> None:
    first = compute_status({}, observe(reports=all_ready()), NOW)
    again = compute_status(first, observe(reports=all_ready()), NOW)
    assert status_patch(first, again) is None
    assert status_patch({}, first) is not None


def test_a_replica_down_after_ready_is_degraded_not_provisioning() -> None:
    reports = all_ready()
    reports["db-3"] = report("db-3", ready=False)
    status = compute_status({"phase": "Ready"}, observe(reports=reports), NOW)
    assert conditions(status)["Ready"] == ("False", "ReplicasNotReady")
    assert conditions(status)["Degraded"] == ("True", "ReplicasNotReady")
    assert conditions(status)["Progressing"] == ("True", "WaitingForInstances")
    assert status["phase"] == "Degraded"


def test_scaling_is_reported_until_the_new_instances_are_ready() -> None:
    status = compute_status({"phase": "Ready"}, observe(reports=all_ready(), scaled=True), NOW)
    assert conditions(status)["Progressing"] == ("True", "Scaling")
    later = compute_status(status, observe(reports=all_ready()), NOW)
    assert later["phase"] == "Ready"


def test_hibernated_cluster_reports_it() -> None:
    status = compute_status({"phase": "Ready"}, observe(replicas=0), NOW)
    assert conditions(status)["Ready"] == ("False", "Hibernated")
    assert conditions(status)["Progressing"] == ("False", "Hibernated")
    assert status["phase"] == "Hibernated"
    assert status["readyReplicas"] == 0


def test_the_reported_primary_wins_over_the_planned_one() -> None:
    reports = all_ready()
    reports["db-1"] = report("db-1", "replica")
    reports["db-2"] = report("db-2", "primary", timeline=4)
    status = compute_status({}, observe(reports=reports), NOW)
    assert (status["currentPrimary"], status["timeline"]) == ("db-2", 4)


def test_instance_errors_and_malformed_lsns_stay_out_of_status() -> None:
    reports = all_ready()
    reports["db-2"] = report("db-2", last_error="password authentication failed for user x", receive_lsn="bogus")
    status = compute_status({}, observe(reports=reports), NOW)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["reason"], degraded["message"]) == ("InstanceErrors", "instances report errors: db-2")
    assert "receivedLSN" not in status["instances"][1]


def test_condition_flips_are_detected_for_events() -> None:
    before = compute_status({}, observe(), NOW)
    after = compute_status(before, observe(reports=all_ready()), NOW)
    flipped = condition_flipped(before, after, "Ready")
    assert flipped is not None
    assert flipped["status"] == "True"
    assert condition_flipped(after, after, "Ready") is None


def pvc(name: str, request: str, capacity: str | None, cls: str = "fast") -> Obj:
    status = {"phase": "Bound", "capacity": {"storage": capacity}} if capacity else {"phase": "Pending"}
    return {"metadata": {"name": name}, "spec": {"storageClassName": cls, "resources": {"requests":
            {"storage": request}}}, "status": status}  # fmt: skip


def test_storage_grows_claims_whose_class_allows_it() -> None:
    classes = {"fast": {"allowVolumeExpansion": True}}
    plan = plan_storage([pvc("db-1", "1Gi", "1Gi"), pvc("db-2", "2Gi", "1Gi")], "2Gi", classes)
    assert plan.grow == {"db-1": {"spec": {"resources": {"requests": {"storage": "2Gi"}}}}}
    assert plan.resizing == ["db-2"]
    assert plan.blocked == []


def test_storage_growth_is_blocked_when_the_class_cannot_expand() -> None:
    refusing: list[dict[str, Obj]] = [{"fast": {"allowVolumeExpansion": False}}, {"fast": {}}, {}]
    for classes in refusing:
        plan = plan_storage([pvc("db-1", "1Gi", "1Gi")], "2Gi", classes)
        assert plan.grow == {}
        assert plan.blocked == ["db-1"]
        assert plan.blocked_class == "fast"
    status = compute_status({}, observe(storage=plan), NOW)
    assert conditions(status)["StorageResizing"] == ("False", "ExpansionNotSupported")


def test_restarts_go_replicas_first_one_at_a_time_primary_last() -> None:
    instances = ["db-1", "db-2", "db-3"]
    reports = {name: report(name, "primary" if name == "db-1" else "replica", pending_restart=True)
               for name in instances}  # fmt: skip
    assert next_restart(instances, "db-1", reports) == "db-2"
    reports["db-2"] = report("db-2", ready=False)
    assert next_restart(instances, "db-1", reports) is None  # db-2 is restarting: wait
    reports["db-2"] = report("db-2")
    reports["db-3"] = report("db-3")
    assert next_restart(instances, "db-1", reports) == "db-1"
    assert next_restart(instances, "db-1", {n: report(n) for n in instances}) is None


def test_lowering_a_standby_limit_restarts_the_primary_first() -> None:
    # a replica restarted first with a lower max_connections than its primary's refuses to start
    instances = ["db-1", "db-2"]
    lowers = ("max_connections",)
    reports = {"db-1": report("db-1", "primary", pending_restart=True, pending_lowers=lowers),
               "db-2": report("db-2", pending_restart=True, pending_lowers=lowers)}  # fmt: skip
    assert next_restart(instances, "db-1", reports) == "db-1"
    reports["db-1"] = report("db-1", "primary")  # restarted: the replica follows
    assert next_restart(instances, "db-1", reports) == "db-2"
    assert parse_report({"name": "db-1", "role": "primary", "pendingRestartLowers": ["max_connections", 5]}) == (
        InstanceReport(name="db-1", role="primary", ready=False, running=False, pending_lowers=lowers)
    )


def test_reports_are_parsed_defensively() -> None:
    body = {"name": "db-1", "role": "primary", "ready": True, "running": True, "timeline": 2, "writeLsn": "0/16B3748",
            "pendingRestart": True, "lagBytes": -5}  # fmt: skip
    parsed = parse_report(body)
    assert parsed is not None
    assert (parsed.role, parsed.timeline, parsed.write_lsn, parsed.pending_restart, parsed.lag_bytes) == (
        "primary", 2, "0/16B3748", True, None)  # fmt: skip
    assert parse_report({"name": "db-1", "role": "leader"}) is None
    assert parse_report(["not", "an", "object"]) is None


def test_a_replica_still_cloning_while_the_cluster_is_created_is_progress_not_degradation() -> None:
    cloning = {
        "db-1": report("db-1", "primary", timeline=1),
        "db-2": report("db-2", ready=False, last_error="pg_basebackup: replication slot db_2 does not exist"),
        "db-3": report("db-3"),
    }
    creating = compute_status({}, observe(reports=cloning), NOW)  # never ready before: provisioning
    assert conditions(creating)["Degraded"] == ("False", "AsExpected")
    assert conditions(creating)["Progressing"] == ("True", "Provisioning")
    # Once the cluster has been Ready, the same report is a degradation.
    ready = compute_status({}, observe(reports=all_ready()), NOW)
    later = compute_status(ready, observe(reports=cloning), NOW)
    assert conditions(later)["Degraded"] == ("True", "InstanceErrors")


PEER_FAILED = ('connection to server on socket "/var/run/postgresql/.s.PGSQL.5432" failed: FATAL: Peer '
               'authentication failed for user "postgres"')  # fmt: skip


def unreachable(name: str, role: str) -> InstanceReport:
    """What ``GET /status`` of an instance whose manager cannot log in to its own PostgreSQL parses to."""
    body = {"name": name, "role": role, "ready": False, "running": True, "lastError": PEER_FAILED,
            "problems": [{"reason": "PostgresUnreachable", "message": PEER_FAILED}]}  # fmt: skip
    parsed = parse_report(body)
    assert parsed is not None
    return parsed


def test_an_instance_that_cannot_reach_its_postgres_makes_the_cluster_degraded_with_its_error() -> None:
    # Seen: peer authentication failing on every instance of a new cluster was only "PostgreSQL not ready".
    reports = {"db-1": unreachable("db-1", "primary"), "db-2": unreachable("db-2", "replica"),
               "db-3": unreachable("db-3", "replica")}  # fmt: skip
    problems = tuple(report_problems(reports))
    status = compute_status({}, observe(reports=reports, problems=problems), NOW)  # provisioning: never ready
    degraded = {c["type"]: c for c in status["conditions"]}["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "PostgresUnreachable")
    assert degraded["message"] == (f"instances db-1, db-2, db-3: {PEER_FAILED} "
                                   f"(runbook {runbook('PostgresUnreachable')})")  # fmt: skip
    ready = {c["type"]: c for c in status["conditions"]}["Ready"]
    assert "db-1: PostgreSQL running but its instance manager cannot connect" in ready["message"]


def test_the_creating_exclusion_never_hides_an_unreachable_postgres() -> None:
    # A lone primary of a new cluster, and a replica still being added by a scale-up: both are reported.
    for replicas, reports, extra in (
        (1, {"db-1": unreachable("db-1", "primary")}, {}),
        (3, {**all_ready(), "db-3": unreachable("db-3", "replica")}, {"scaled": True}),
    ):
        problems = tuple(report_problems(reports))
        status = compute_status({}, observe(replicas, reports=reports, problems=problems, **extra), NOW)
        assert conditions(status)["Degraded"] == ("True", "PostgresUnreachable"), reports
        assert PEER_FAILED in {c["type"]: c for c in status["conditions"]}["Degraded"]["message"]
