"""The primary comes from the instances' reports, and a replica is removed only when proven one this pass."""

from __future__ import annotations

from typing import Any

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.ha.primary import choose_primary, gate_removals, removal_blocker
from kanri.postgres.topology.plan import plan_instances

INSTANCES = ["db-1", "db-2", "db-3"]


def report(name: str, role: str = "replica", timeline: int | None = 1, **extra: Any) -> InstanceReport:
    return InstanceReport(name=name, role=role, ready=True, running=True, timeline=timeline, **extra)


def test_a_reported_primary_beats_the_claims_status_and_bootstrap_choice() -> None:
    assert choose_primary(INSTANCES, "db-1", recorded="db-3", status="db-2", bootstrapping="db-2") == "db-1"


def test_without_reports_the_claims_record_beats_status() -> None:
    # A lie in status (db-2) while the instances are stopped: the last primary seen in reports stands.
    assert choose_primary(INSTANCES, None, recorded="db-1", status="db-2", bootstrapping=None) == "db-1"
    assert choose_primary(INSTANCES, None, recorded=None, status="db-2", bootstrapping="db-3") == "db-2"
    assert choose_primary(INSTANCES, None, recorded=None, status="gone-9", bootstrapping="db-3") == "db-3"
    assert choose_primary(INSTANCES, None, recorded=None, status=None, bootstrapping=None) is None


def test_a_replica_is_removable_only_behind_exactly_one_reporting_primary() -> None:
    primary = report("db-1", "primary", 2)
    assert removal_blocker("db-2", {"db-1": primary, "db-2": report("db-2", timeline=2)}) is None
    assert removal_blocker("db-2", {"db-1": primary, "db-2": report("db-2", timeline=1)}) is None
    assert "has not reported" in str(removal_blocker("db-2", {"db-1": primary}))
    assert "reports itself primary" in str(removal_blocker("db-1", {"db-1": primary, "db-2": report("db-2")}))
    fenced = {"db-1": primary, "db-2": report("db-2", "fenced")}
    assert "reports itself fenced" in str(removal_blocker("db-2", fenced))  # a fenced instance holds divergent data
    assert "no instance reports" in str(removal_blocker("db-2", {"db-2": report("db-2")}))
    two = {"db-1": primary, "db-3": report("db-3", "primary", 2), "db-2": report("db-2")}
    assert "several" in str(removal_blocker("db-2", two))
    ahead = {"db-1": primary, "db-2": report("db-2", timeline=3)}
    assert "ahead of primary" in str(removal_blocker("db-2", ahead))
    unknown = {"db-1": report("db-1", "primary", None), "db-2": report("db-2")}
    assert "timeline" in str(removal_blocker("db-2", unknown))


def test_a_waiting_removal_keeps_the_instance_and_says_why() -> None:
    # Hibernated, status rewritten to db-2, replicas 1: without reports the plan may pick the real primary (db-1)
    # as the victim — the gate keeps it.
    plan = plan_instances("db", 1, ["db-1", "db-2"], "db-2")
    assert plan.removed == ["db-1"]
    gated, waiting = gate_removals(plan, {})
    assert gated.instances == ["db-1", "db-2"]
    assert gated.removed == []
    assert waiting == {"db-1": "db-1 has not reported its role"}
    # Awake, the instances report: the primary is db-1, db-2 is the proven replica and goes.
    reports = {"db-1": report("db-1", "primary"), "db-2": report("db-2")}
    plan = plan_instances("db", 1, ["db-1", "db-2"], choose_primary(["db-1", "db-2"], "db-1", recorded=None,
                                                                     status="db-2", bootstrapping=None))  # fmt: skip
    gated, waiting = gate_removals(plan, reports)
    assert (gated.instances, gated.removed, waiting) == (["db-1"], ["db-2"], {})


def test_waiting_instances_keep_their_number_order() -> None:
    plan = plan_instances("db", 1, ["db-1", "db-2", "db-10"], "db-1")
    gated, waiting = gate_removals(plan, {"db-1": report("db-1", "primary"), "db-2": report("db-2")})
    assert gated.instances == ["db-1", "db-10"]
    assert gated.removed == ["db-2"]
    assert set(waiting) == {"db-10"}
