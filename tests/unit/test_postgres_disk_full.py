"""DiskFull on the operator side: an instance's report (the real shape the instance builds) becomes the Degraded
condition's reason naming the instance, its claim and the free bytes, Ready says why the instance is not ready, and
the condition goes once the instance no longer reports it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kanri.instance.disk_full import VolumeSpace, disk_full_problems
from kanri.postgres.cluster.instances import InstanceReport, parse_report
from kanri.postgres.cluster.problems import SEVERITY, disk_full, ordered, report_problems, runbook
from kanri.postgres.cluster.status import Observation, compute_status
from kanri.postgres.topology.plan import plan_instances
from kanri.postgres.topology.storage import StoragePlan

NOW = datetime(2026, 12, 6, 21, 30, tzinfo=UTC)
MIB = 1024 * 1024


def full_report(name: str, ready: bool = False) -> InstanceReport:
    """What an instance whose volume filled sends in GET /status, read back as the operator reads it."""
    (problem,) = disk_full_problems(
        VolumeSpace("/var/lib/postgresql/data/pgdata", 9 * MIB, 960 * MIB),
        'could not write to file "pg_wal/xlogtemp.812"',
    )
    body: dict[str, Any] = {
        "name": name, "role": "primary", "ready": ready, "running": False, "lastError": problem.message,
        "problems": [problem.as_json()],
    }  # fmt: skip
    report = parse_report(body)
    assert report is not None
    return report


def test_a_full_volume_is_its_own_reason_naming_the_instance_its_claim_and_the_free_bytes() -> None:
    reports = {"db-1": full_report("db-1"), "db-2": InstanceReport(name="db-2", role="replica", ready=True)}
    (problem,) = report_problems(reports)
    assert problem.reason == "DiskFull"
    assert problem.message.startswith(
        f"instance db-1: PersistentVolumeClaim db-1: data volume full: {9 * MIB} bytes free of {960 * MIB}"
    )
    assert 'could not write to file "pg_wal/xlogtemp.812": No space left on device' in problem.message
    assert problem.message.endswith(f"(runbook {runbook('DiskFull')})")
    assert (Path(__file__).resolve().parents[2] / runbook("DiskFull")).read_text().startswith("# DiskFull\n")


def test_every_full_instance_is_named_on_its_own() -> None:
    reports = {name: full_report(name) for name in ("db-1", "db-2")}
    assert [p.message.split(":")[0] for p in report_problems(reports)] == ["instance db-1", "instance db-2"]
    assert (
        disk_full("db-2", "x").message
        == f"instance db-2: PersistentVolumeClaim db-2: x (runbook {runbook('DiskFull')})"
    )


def test_it_outranks_a_crash_loop_and_the_api_servers_refusals() -> None:
    rank = SEVERITY.index
    assert rank("DiskFull") < rank("ChildRejected") < rank("CrashLoopBackOff")
    problems = ordered([*report_problems({"db-1": full_report("db-1")}),
                        *report_problems({"db-2": InstanceReport(name="db-2", role="replica")})])  # fmt: skip
    assert problems[0].reason == "DiskFull"


def observe(reports: dict[str, InstanceReport]) -> Observation:
    plan = plan_instances("db", 2, ["db-1", "db-2"], "db-1")
    return Observation(plan=plan, hibernated=False, generation=1, reports=reports, pods={}, storage=StoragePlan(),
                       problems=tuple(report_problems(reports)))  # fmt: skip


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["type"]: (c["status"], c["reason"], c["message"]) for c in status["conditions"]}


def test_describe_says_disk_full_and_it_goes_when_the_instance_recovers() -> None:
    replica = InstanceReport(name="db-2", role="replica", ready=True, running=True, timeline=1)
    status = compute_status({}, observe({"db-1": full_report("db-1"), "db-2": replica}), NOW)
    degraded = conditions(status)["Degraded"]
    assert degraded[:2] == ("True", "DiskFull")
    assert "PersistentVolumeClaim db-1" in degraded[2]
    assert f"{9 * MIB} bytes free" in degraded[2]
    assert "db-1: its data volume is full (see Degraded)" in conditions(status)["Ready"][2]
    assert "instance reports an error" not in conditions(status)["Ready"][2]
    primary = InstanceReport(name="db-1", role="primary", ready=True, running=True, timeline=1)
    after = compute_status(status, observe({"db-1": primary, "db-2": replica}), NOW)
    assert conditions(after)["Degraded"][:2] == ("False", "AsExpected")
