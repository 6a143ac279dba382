"""What the user must fix: Secrets checked against the contract, the instances' problems, the API's refusals —
each under its own reason in Degraded, never with a Secret's value."""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kanri.contract.problems import REASONS
from kanri.postgres.cluster.instances import InstanceProblem, InstanceReport, parse_report
from kanri.postgres.cluster.problems import (
    SEVERITY,
    Problem,
    child_rejected,
    ordered,
    report_problems,
    runbook,
    secret_problems,
    storage_class_missing,
    volume_lost,
)
from kanri.postgres.cluster.status import Observation, compute_status
from kanri.postgres.topology.plan import plan_instances
from kanri.postgres.topology.storage import StoragePlan
from kanri.postgres.upgrade.versions import upgrade_verdict
from kanri.runtime import ApiError

Obj = dict[str, Any]
NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
PASSWORD = "s3cret-value-never-shown"


def secret(**data: str) -> Obj:
    return {"data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def good() -> dict[str, Obj | None]:
    return {"db-superuser": secret(username="postgres", password=PASSWORD),
            "db-replication": secret(username="streaming_replica", password=PASSWORD),
            "db-app": secret(username="app", password=PASSWORD), "db-api": secret(token="t" * 32)}  # fmt: skip


def test_good_or_missing_secrets_are_no_problem() -> None:
    assert secret_problems("db", good(), "app") == []
    assert secret_problems("db", {**good(), "db-app": None}, "app") == []


def test_a_bad_secret_names_the_secret_and_key_never_the_value() -> None:
    bad = {**good(), "db-superuser": secret(username="admin", password=PASSWORD), "db-api": secret(token="short"),
           "db-replication": secret(username="streaming_replica", password="")}  # fmt: skip
    problems = secret_problems("db", bad, "app")
    assert {p.reason for p in problems} == {"InvalidSecret"}
    messages = [p.message for p in problems]
    assert any("Secret db-superuser key username" in m for m in messages)
    assert any("Secret db-replication key password" in m for m in messages)
    assert any("Secret db-api key token" in m for m in messages)
    assert not any(PASSWORD in m or "admin" in m or "short" in m for m in messages)


def test_an_adopted_app_secret_for_another_owner_is_reported() -> None:
    (problem,) = secret_problems("db", {**good(), "db-app": secret(username="shop", password=PASSWORD)}, "orders")
    assert problem.reason == "OwnerMismatch"
    assert "db-app" in problem.message
    assert "orders" in problem.message


def test_instance_problems_keep_their_reason_and_name_instance_and_parameter() -> None:
    reports = {
        "db-1": InstanceReport(name="db-1", role="primary", ready=True, running=True, problems=(
            InstanceProblem("InvalidParameter", 'invalid value for parameter "work_mem"', parameter="work_mem"),)),
        "db-2": InstanceReport(name="db-2", role="replica", ready=False, running=False, problems=(
            InstanceProblem("DataDirectoryLost", "the volume is empty"),
            InstanceProblem("InvalidSecret", "is empty", secret="replication", key="password"))),
    }  # fmt: skip
    problems = ordered(report_problems(reports))
    assert [p.reason for p in problems] == ["DataDirectoryLost", "InvalidSecret", "InvalidParameter"]
    assert "the data of instance db-2 is gone" in problems[0].message
    assert problems[0].event is not None
    assert "restore a backup into a new PostgresCluster" in problems[0].event
    assert problems[1].message == "instance db-2: replication Secret key password: is empty"
    assert problems[2].message == 'instance db-1: parameter work_mem: invalid value for parameter "work_mem"'


def test_reports_carry_identity_versions_and_problems_parsed_defensively() -> None:
    body = {"name": "db-1", "role": "replica", "systemIdentifier": "7329117425863524378", "dataVersion": 15,
            "binaryVersion": 16, "problems": [
                {"reason": "DataVersionMismatch", "message": "data is 15,\nbinaries are 16"},
                {"reason": "Whatever", "message": "x" * 1000}, {"reason": "InvalidSecret"}, "junk"]}  # fmt: skip
    parsed = parse_report(body)
    assert parsed is not None
    assert (parsed.system_identifier, parsed.data_version, parsed.binary_version) == ("7329117425863524378", 15, 16)
    assert [p.reason for p in parsed.problems] == ["DataVersionMismatch", "InstanceProblem"]
    assert parsed.problems[0].message == "data is 15, binaries are 16"
    assert len(parsed.problems[1].message) == 300
    bad = parse_report({"name": "db-1", "role": "primary", "systemIdentifier": 2**60, "dataVersion": "15"})
    assert bad is not None
    assert (bad.system_identifier, bad.data_version, bad.problems) == (None, None, ())


def test_a_refused_write_names_kind_name_and_the_servers_message() -> None:
    error = ApiError(422, {"reason": "Invalid", "message": 'StatefulSet.apps "db-1" is invalid: spec.template...'})
    problem = child_rejected("StatefulSet", "db-1", error)
    assert problem.reason == "ChildRejected"
    assert problem.message.startswith("the API server refused StatefulSet db-1 (422): StatefulSet.apps")


def observe(problems: tuple[Problem, ...] = (), **extra: Any) -> Observation:
    plan = plan_instances("db", 2, ["db-1", "db-2"], "db-1")
    reports = {"db-1": InstanceReport(name="db-1", role="primary", ready=True, running=True, timeline=1),
               "db-2": InstanceReport(name="db-2", role="replica", ready=True, running=True, timeline=1)}  # fmt: skip
    return Observation(plan=plan, hibernated=False, generation=1, reports=reports, pods={}, storage=StoragePlan(),
                       problems=problems, **extra)  # fmt: skip


def conditions(status: Obj) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}


def test_problems_make_the_cluster_degraded_with_the_most_serious_reason() -> None:
    problems = (storage_class_missing("fast", ["db-2"]), volume_lost("db-2"))
    status = compute_status({}, observe(problems), NOW)
    degraded = conditions(status)["Degraded"]
    assert degraded[:2] == ("True", "VolumeLost")
    assert "PersistentVolumeClaim db-2" in degraded[2]
    assert "StorageClass fast" in degraded[2]
    assert status["phase"] == "Degraded"
    assert conditions(status)["Ready"][:2] == ("True", "InstancesReady")  # it still serves
    assert conditions(compute_status(status, observe(), NOW))["Degraded"][:2] == ("False", "AsExpected")


def test_a_waiting_removal_is_progress_that_says_why() -> None:
    status = compute_status({}, observe(removal_waiting={"db-2": "db-2 has not reported its role"}), NOW)
    progressing = conditions(status)["Progressing"]
    assert progressing[:2] == ("True", "ScaleDownWaiting")
    assert "db-2: db-2 has not reported its role" in progressing[2]
    assert status["phase"] == "Scaling"


def test_the_data_major_system_identifier_and_upgrade_verdict_are_in_status() -> None:
    obs = observe(major=15, system_identifier="7329117425863524378", upgrade=upgrade_verdict(15, 16, None))
    status = compute_status({}, obs, NOW)
    assert (status["postgresMajor"], status["systemIdentifier"]) == (15, "7329117425863524378")
    assert conditions(status)["MajorUpgrade"][:2] == ("False", "UpgradeNotApproved")
    # Once recorded, an identifier is not forgotten by a pass that did not learn it again.
    assert compute_status(status, observe(), NOW)["systemIdentifier"] == "7329117425863524378"


def test_the_same_fault_on_every_instance_is_one_line_and_a_secret_fault_the_operator_found_is_not_repeated() -> None:
    fault = InstanceProblem("InvalidSecret", "app Secret: username is reserved", secret="app", key="username")
    bad = InstanceProblem("InvalidParameter", "invalid value", parameter="work_mem")
    reports = {name: InstanceReport(name=name, role="replica", ready=True, running=True, problems=(fault, bad))
               for name in ("db-1", "db-2")}  # fmt: skip
    assert [p.message for p in report_problems(reports)] == [
        "instances db-1, db-2: app Secret: username is reserved",
        "instances db-1, db-2: parameter work_mem: invalid value",
    ]
    assert [p.reason for p in report_problems(reports, known={("app", "username")})] == ["InvalidParameter"]
    operator_found = secret_problems(
        "db", {"db-app": {"data": {"username": "cG9zdGdyZXM=", "password": "eA=="}}}, "app"
    )
    assert {p.subject for p in operator_found} == {("app", "username")}


def test_an_unreachable_postgres_has_a_severity_a_runbook_and_passes_through_the_contract() -> None:
    assert "PostgresUnreachable" in REASONS
    assert "PostgresUnreachable" in SEVERITY
    root = Path(__file__).resolve().parents[2]
    assert (root / runbook("PostgresUnreachable")).read_text().startswith("# PostgresUnreachable\n")
    body = {"name": "db-1", "role": "primary", "problems": [{"reason": "PostgresUnreachable", "message": "m"}]}
    parsed = parse_report(body)
    assert parsed is not None
    (problem,) = report_problems({"db-1": parsed})
    assert problem.reason == "PostgresUnreachable"
    assert problem.message == "instance db-1: m (runbook docs/runbooks/PostgresUnreachable.md)"
    # the instance cannot be managed at all: above what the API server or a Secret says
    assert [p.reason for p in ordered([Problem("InvalidSecret", "a"), problem])] == ["PostgresUnreachable",
                                                                                      "InvalidSecret"]  # fmt: skip
