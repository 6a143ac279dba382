"""Split brain: which primary stays, which are fenced, how the reports are read afterwards, and the status record."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from kanri.postgres.api.v1alpha1 import PostgresClusterStatus
from kanri.postgres.cluster.instances import InstanceReport, parse_report
from kanri.postgres.cluster.problems import ordered
from kanri.postgres.cluster.recorded import annotation_patches
from kanri.postgres.cluster.status import Observation, compute_status
from kanri.postgres.ha.splitbrain import (
    Position,
    Verdict,
    decide,
    fenced_names,
    next_record,
    routed,
    split_brain_problem,
)
from kanri.postgres.topology.plan import plan_instances
from kanri.postgres.topology.storage import StoragePlan

Obj = dict[str, Any]
INSTANCES = ["db-1", "db-2", "db-3"]
NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
LATER = datetime(2026, 5, 1, 12, 5, tzinfo=UTC)


def primary(name: str, timeline: int = 1, lsn: str = "0/3000000", **extra: Any) -> InstanceReport:
    return InstanceReport(name=name, role="primary", ready=True, running=True, timeline=timeline, write_lsn=lsn,
                          **extra)  # fmt: skip


def replica(name: str, **extra: Any) -> InstanceReport:
    return InstanceReport(name=name, role="replica", ready=True, running=True, timeline=1, **extra)


def fenced(name: str) -> InstanceReport:
    # what a fenced instance reports: PostgreSQL stopped, its data still out of recovery
    return InstanceReport(name=name, role="primary", ready=False, running=False, fenced=True)


def verdict_for(
    reports: dict[str, InstanceReport], recorded: str | None = "db-1", status: str | None = None
) -> Verdict:
    return decide(reports, recorded=recorded, status=status, instances=INSTANCES)


# --- which primary stays ---------------------------------------------------------------------------------------------


def test_the_recorded_primary_is_kept_even_on_a_lower_timeline() -> None:
    # the hostile round: pg_promote() on db-2 put it on timeline 2 — it must not win
    reports = {
        "db-1": primary("db-1", 1, "0/5000000"),
        "db-2": primary("db-2", 2, "0/5000100"),
        "db-3": replica("db-3"),
    }
    verdict = verdict_for(reports)
    assert verdict.primary == "db-1"
    assert verdict.kept == Position("db-1", 1, "0/5000000")
    assert verdict.kept_by == "LastPrimary"
    assert verdict.fence == (Position("db-2", 2, "0/5000100"),)
    assert verdict.split


def test_without_a_claim_record_status_current_primary_is_kept() -> None:
    reports = {"db-1": primary("db-1", 3), "db-2": primary("db-2", 2)}
    verdict = verdict_for(reports, recorded=None, status="db-2")
    assert (verdict.primary, verdict.kept_by, [p.name for p in verdict.fence]) == ("db-2", "CurrentPrimary", ["db-1"])


def test_a_record_naming_neither_primary_falls_back_to_status_then_the_highest_position() -> None:
    reports = {"db-1": primary("db-1", 2), "db-2": primary("db-2", 3)}
    assert verdict_for(reports, recorded="db-3", status="db-1").kept_by == "CurrentPrimary"
    highest = verdict_for(reports, recorded="db-3", status="db-3")
    assert (highest.primary, highest.kept_by) == ("db-2", "HighestPosition")


def test_with_no_record_the_highest_timeline_then_lsn_then_the_lowest_name_is_kept() -> None:
    by_timeline = {"db-1": primary("db-1", 2, "0/9000000"), "db-2": primary("db-2", 3, "0/1000000")}
    assert verdict_for(by_timeline, recorded=None).primary == "db-2"
    by_lsn = {"db-1": primary("db-1", 2, "0/9000000"), "db-2": primary("db-2", 2, "1/0")}
    assert verdict_for(by_lsn, recorded=None).primary == "db-2"  # 1/0 is past 0/9000000
    tie = {"db-2": primary("db-2", 2, "0/5"), "db-1": primary("db-1", 2, "0/5")}
    assert verdict_for(tie, recorded=None).primary == "db-1"
    unknown = {
        "db-1": primary("db-1", 2, lsn=""),
        "db-2": InstanceReport(name="db-2", role="primary", ready=True, running=True),
    }
    assert verdict_for(unknown, recorded=None).primary == "db-1"  # a report without timeline ranks lowest


def test_three_primaries_keep_one_and_fence_the_other_two() -> None:
    reports = {"db-1": primary("db-1", 2), "db-2": primary("db-2", 3), "db-3": primary("db-3", 4)}
    verdict = verdict_for(reports, recorded="db-2")
    assert verdict.primary == "db-2"
    assert [p.name for p in verdict.fence] == ["db-1", "db-3"]


def test_a_fenced_instance_is_not_counted_as_a_primary() -> None:
    reports = {"db-1": primary("db-1"), "db-2": fenced("db-2"), "db-3": replica("db-3")}
    verdict = verdict_for(reports)
    assert (verdict.primary, verdict.split, verdict.fence) == ("db-1", False, ())
    assert verdict_for({"db-2": fenced("db-2")}, recorded=None).primary is None


def test_one_primary_is_the_primary_unless_the_record_names_another_that_did_not_answer() -> None:
    assert verdict_for({"db-1": primary("db-1"), "db-2": replica("db-2")}) == Verdict(primary="db-1")
    assert verdict_for({"db-2": primary("db-2")}, recorded=None) == Verdict(primary="db-2")
    # db-1 (recorded) silent this pass: db-2's claim to be primary is held, not believed
    assert verdict_for({"db-2": primary("db-2", 2), "db-3": replica("db-3")}) == Verdict(primary=None, held=("db-2",))
    # the recorded primary answered and is no primary, or it no longer exists: the reporting one is the primary
    assert verdict_for({"db-1": replica("db-1"), "db-2": primary("db-2", 2)}).primary == "db-2"
    assert verdict_for({"db-1": fenced("db-1"), "db-2": primary("db-2", 2)}).primary == "db-2"
    gone = decide({"db-2": primary("db-2", 2)}, recorded="db-1", status=None, instances=["db-2", "db-3"])
    assert gone.primary == "db-2"
    assert verdict_for({"db-2": replica("db-2")}) == Verdict(primary=None)


def test_the_reports_are_read_with_fenced_instances_as_fenced_and_held_primaries_left_out() -> None:
    reports = {"db-1": primary("db-1"), "db-2": primary("db-2", 2), "db-3": fenced("db-3")}
    view = routed(reports, verdict_for(reports))
    assert {name: r.role for name, r in view.items()} == {"db-1": "primary", "db-2": "fenced", "db-3": "fenced"}
    assert view["db-2"].timeline == 2  # the rest of the report is kept
    held = {"db-2": primary("db-2", 2), "db-3": replica("db-3")}
    assert set(routed(held, verdict_for(held))) == {"db-3"}
    # so the last-primary mark never moves to a second primary
    marked = {"kanri.dev/last-primary": "true", "kanri.dev/timeline": "1"}
    claims: dict[str, Obj] = {"db-1": {"metadata": {"name": "db-1", "annotations": marked}},
                              "db-2": {"metadata": {"name": "db-2"}}}  # fmt: skip
    assert annotation_patches(claims, view, verdict_for(reports).primary) == {}
    assert annotation_patches(claims, routed(held, verdict_for(held)), None) == {}


def test_a_fenced_report_is_parsed() -> None:
    body = {"name": "db-2", "role": "primary", "ready": False, "running": False, "fenced": True}
    parsed = parse_report(body)
    assert parsed is not None
    assert parsed.fenced is True
    parsed = parse_report({**body, "fenced": "yes"})
    assert parsed is not None
    assert parsed.fenced is False


# --- the status record -----------------------------------------------------------------------------------------------


def split_record() -> Obj:
    reports = {
        "db-1": primary("db-1", 1, "0/5000000"),
        "db-2": primary("db-2", 2, "0/5000100"),
        "db-3": replica("db-3"),
    }
    verdict = verdict_for(reports)
    record = next_record(None, verdict, routed(reports, verdict), INSTANCES, NOW)
    assert record is not None
    return record


def test_a_new_split_is_recorded_with_both_sides_and_validates_against_the_api() -> None:
    record = split_record()
    assert record == {
        "detectedAt": "2026-05-01T12:00:00Z",
        "kept": {"name": "db-1", "timeline": 1, "lsn": "0/5000000"},
        "keptBy": "LastPrimary",
        "fenced": [{"name": "db-2", "timeline": 2, "lsn": "0/5000100"}],
    }
    PostgresClusterStatus.model_validate({"splitBrain": record})
    assert fenced_names(record) == {"db-2"}
    assert fenced_names(None) == set()


def test_a_split_seen_again_keeps_its_record_and_adds_a_newly_fenced_instance() -> None:
    record = split_record()
    again = {"db-1": primary("db-1", 1, "0/6000000"), "db-2": primary("db-2", 2, "0/7000000")}
    verdict = verdict_for(again)
    assert next_record(record, verdict, routed(again, verdict), INSTANCES, LATER) is record  # detectedAt, LSNs kept
    third = {**again, "db-3": primary("db-3", 2, "0/8000000")}
    verdict = verdict_for(third)
    grown = next_record(record, verdict, routed(third, verdict), INSTANCES, LATER)
    assert grown is not None
    assert grown["detectedAt"] == record["detectedAt"]
    assert [e["name"] for e in grown["fenced"]] == ["db-2", "db-3"]


def test_a_split_keeping_another_primary_is_a_new_occurrence() -> None:
    record = split_record()
    reports = {"db-2": primary("db-2", 2), "db-3": primary("db-3", 2)}
    verdict = decide(reports, recorded="db-3", status=None, instances=INSTANCES)
    new = next_record(record, verdict, routed(reports, verdict), INSTANCES, LATER)
    assert new is not None
    assert (new["kept"]["name"], new["detectedAt"]) == ("db-3", "2026-05-01T12:05:00Z")


def test_the_record_stays_until_the_fenced_instance_is_a_replica_again_or_gone() -> None:
    record = split_record()
    quiet = Verdict(primary="db-1")
    # fenced and reporting it, or not answering at all: unresolved
    assert next_record(record, quiet, routed({"db-2": fenced("db-2")}, quiet), INSTANCES, LATER) is record
    assert next_record(record, quiet, {}, INSTANCES, LATER) is record
    # unfenced by hand and a primary again: that is the next pass's split, not a resolution
    assert next_record(record, quiet, {"db-2": primary("db-2", 2)}, INSTANCES, LATER) is record
    # re-cloned onto a new volume: an unfenced replica
    assert next_record(record, quiet, {"db-2": replica("db-2")}, INSTANCES, LATER) is None
    # removed
    assert next_record(record, quiet, {}, ["db-1", "db-3"], LATER) is None
    assert next_record(None, quiet, {}, INSTANCES, LATER) is None


def test_of_several_fenced_instances_only_the_resolved_ones_leave_the_record() -> None:
    record = {**split_record(), "fenced": [{"name": "db-2"}, {"name": "db-3"}]}
    quiet = Verdict(primary="db-1")
    left = next_record(record, quiet, {"db-2": replica("db-2"), "db-3": fenced("db-3")}, INSTANCES, LATER)
    assert left is not None
    assert left["fenced"] == [{"name": "db-3"}]


def test_the_problem_names_both_sides_their_timelines_lsns_why_and_what_to_do() -> None:
    problem = split_brain_problem(split_record())
    assert problem is not None
    assert problem.reason == "SplitBrain"
    for text in ("db-1 (timeline 1, LSN 0/5000000)", "db-2 (timeline 2, LSN 0/5000100)",
                 "the primary the operator recorded", "docs/postgres-operator.md"):  # fmt: skip
        assert text in problem.message
    assert split_brain_problem(None) is None
    highest = split_brain_problem({**split_record(), "keptBy": "HighestPosition"})
    assert highest is not None
    assert "no record names either of them" in highest.message
    # the most serious problem: it is the Degraded reason whatever else is wrong
    from kanri.postgres.cluster.problems import Problem

    assert ordered([Problem("DataDirectoryLost", "x"), problem])[0] is problem


def test_status_says_degraded_split_brain_with_the_fenced_instance_and_the_record() -> None:
    record = split_record()
    reports = {"db-1": primary("db-1", 1, "0/5000000"), "db-2": primary("db-2", 2), "db-3": replica("db-3")}
    view = routed(reports, verdict_for(reports))
    problem = split_brain_problem(record)
    assert problem is not None
    plan = plan_instances("db", 3, INSTANCES, "db-1")
    obs = Observation(plan=plan, hibernated=False, generation=2, reports=view, pods={}, storage=StoragePlan(),
                      problems=(problem,), split_brain=record)  # fmt: skip
    status = compute_status({"phase": "Ready"}, obs, NOW)
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "SplitBrain")
    assert "db-2 (timeline 2" in degraded["message"]
    assert status["phase"] == "Degraded"
    assert status["currentPrimary"] == "db-1"
    assert [(i["name"], i["role"]) for i in status["instances"]] == [
        ("db-1", "Primary"), ("db-2", "Fenced"), ("db-3", "Replica")]  # fmt: skip
    assert status["splitBrain"] == record
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert "db-2: fenced" in ready["message"]
    PostgresClusterStatus.model_validate(status)
    # a fenced instance that does not report stays Fenced in status
    quiet = Observation(plan=plan, hibernated=False, generation=2, reports={"db-1": view["db-1"]}, pods={},
                        storage=StoragePlan(), split_brain=record)  # fmt: skip
    assert compute_status({}, quiet, NOW)["instances"][1]["role"] == "Fenced"
    # resolved: the field goes
    resolved = Observation(plan=plan, hibernated=False, generation=2, reports=view, pods={}, storage=StoragePlan())
    assert compute_status(status, resolved, LATER)["splitBrain"] is None
