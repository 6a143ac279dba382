"""Lag-aware reads (kanri.postgres.ha.reads) and the grace of one missed /status answer (cluster/answers.py), as
the status reports them (issue 29 items 3 and 9)."""

from __future__ import annotations

from typing import Any

from kanri.contract.status import Replica
from kanri.postgres.cluster.answers import AnswerMemory, with_grace
from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.cluster.status import Observation, compute_status
from kanri.postgres.ha.reads import read_lag, withheld_problem
from kanri.postgres.topology.plan import plan_instances
from kanri.postgres.topology.storage import StoragePlan
from tests.unit.test_postgres_status import NOW, conditions

Obj = dict[str, Any]
MIB = 1 << 20
BOUND = 16 * MIB


def report(name: str, role: str = "replica", *, ready: bool = True, **extra: Any) -> InstanceReport:
    return InstanceReport(name=name, role=role, ready=ready, running=True, **extra)


def row(name: str, lag: int | None) -> Replica:
    return Replica(name=name, state="streaming", sent_lsn=None, flush_lsn=None, replay_lsn=None, lag_bytes=lag,
                   sync_state="async")  # fmt: skip


def primary(*rows: Replica) -> InstanceReport:
    return report("db-1", "primary", timeline=1, replicas=rows)


def test_a_replica_further_behind_than_the_bound_serves_no_reads_and_is_told_once_it_stays() -> None:
    # db-2 replayed 26 MiB behind the primary (its own receive-minus-replay says 0: it replayed what it received)
    reports = {"db-1": primary(row("db-2", 26 * MIB), row("db-3", 1024)), "db-2": report("db-2", lag_bytes=0),
               "db-3": report("db-3", lag_bytes=0)}  # fmt: skip
    lag = read_lag(reports, "db-1", BOUND)
    assert lag.lag == {"db-2": 26 * MIB, "db-3": 1024}
    assert set(lag.withheld) == {"db-2"}
    assert "maxReadLagBytes (16 MiB)" in lag.withheld["db-2"]
    # told only once it was withheld two passes in a row (a replica that just started streams within a second)
    assert withheld_problem(lag.withheld, reports, before=()) is None
    problem = withheld_problem(lag.withheld, reports, before={"db-2"})
    assert problem is not None
    assert problem.reason == "ReadsWithheld"
    assert "db-2" in problem.message
    # the message names no byte count: a replica catching up does not rewrite the Degraded condition every pass
    slower = read_lag({**reports, "db-1": primary(row("db-2", 30 * MIB), row("db-3", 0))}, "db-1", BOUND)
    again = withheld_problem(slower.withheld, reports, before={"db-2"})
    assert again == problem
    # caught up: serves again
    assert read_lag({**reports, "db-1": primary(row("db-2", BOUND), row("db-3", 0))}, "db-1", BOUND).withheld == {}


def test_a_replica_the_primary_no_longer_lists_has_an_unknown_lag_never_a_stale_zero() -> None:
    # the frozen WAL receiver: db-3 left pg_stat_replication, its own report still says 0 bytes behind
    reports = {"db-1": primary(row("db-2", 0)), "db-2": report("db-2", lag_bytes=0),
               "db-3": report("db-3", lag_bytes=0)}  # fmt: skip
    lag = read_lag(reports, "db-1", BOUND)
    assert lag.lag["db-3"] is None
    assert "not streaming" in lag.withheld["db-3"]
    plan = plan_instances("db", 3, ["db-1", "db-2", "db-3"], "db-1")
    obs = Observation(
        plan=plan,
        hibernated=False,
        generation=1,
        reports=reports,
        pods={},
        storage=StoragePlan(),
        lag=lag.lag,
        problems=(p,) if (p := withheld_problem(lag.withheld, reports, {"db-3"})) else (),
    )
    status = compute_status({}, obs, NOW)
    by_name = {i["name"]: i for i in status["instances"]}
    assert "lagBytes" not in by_name["db-3"]
    assert by_name["db-2"]["lagBytes"] == 0
    assert conditions(status)["Degraded"] == ("True", "ReadsWithheld")
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert "db-3 is not streaming from the primary" in degraded["message"]


def test_without_the_primarys_report_each_replica_keeps_its_own_figure_and_none_is_withheld() -> None:
    reports = {"db-2": report("db-2", lag_bytes=3 * MIB)}
    lag = read_lag(reports, "db-1", BOUND)
    assert lag.lag == {"db-2": 3 * MIB}
    assert lag.withheld == {}
    # a primary listing no standby at all is no evidence either (see ha/reads.py's weak spot)
    lag = read_lag({**reports, "db-1": primary()}, "db-1", BOUND)
    assert lag.lag == {"db-2": 3 * MIB}
    assert lag.withheld == {}


def pod(uid: str, *, deleting: bool = False) -> Obj:
    meta: Obj = {"name": "x", "uid": uid}
    if deleting:
        meta["deletionTimestamp"] = "2026-05-01T12:00:00Z"
    return {"metadata": meta}


def test_one_missed_status_answer_keeps_the_previous_one_two_do_not() -> None:
    memory = AnswerMemory()
    pods = {"db-1": pod("u1"), "db-2": pod("u2")}
    answered = {"db-1": report("db-1", "primary"), "db-2": report("db-2")}
    assert with_grace(memory, answered, pods) == answered
    # db-2's answer took longer than the client's 2 s once: the status still reads its previous answer
    once = with_grace(memory, {"db-1": answered["db-1"]}, pods)
    assert once["db-2"] == answered["db-2"]
    # twice in a row: not answering
    assert "db-2" not in with_grace(memory, {"db-1": answered["db-1"]}, pods)


def test_no_grace_for_another_pod_or_one_being_deleted() -> None:
    memory = AnswerMemory()
    answered = {"db-1": report("db-1", "primary"), "db-2": report("db-2")}
    with_grace(memory, answered, {"db-1": pod("u1"), "db-2": pod("u2")})
    assert "db-2" not in with_grace(memory, {"db-1": answered["db-1"]}, {"db-1": pod("u1"), "db-2": pod("new")})
    memory = AnswerMemory()
    with_grace(memory, answered, {"db-1": pod("u1"), "db-2": pod("u2")})
    deleting = {"db-1": pod("u1"), "db-2": pod("u2", deleting=True)}
    assert "db-2" not in with_grace(memory, {"db-1": answered["db-1"]}, deleting)


def test_ready_waits_until_the_read_write_service_routes_to_the_primary() -> None:
    # issue 29 item 3: a connection right after `kubectl wait --for=condition=Ready` was refused for about a second
    reports = {"db-1": report("db-1", "primary", timeline=1), "db-2": report("db-2", lag_bytes=0)}
    plan = plan_instances("db", 2, ["db-1", "db-2"], "db-1")

    def observe(unrouted: str | None) -> Observation:
        return Observation(plan=plan, hibernated=False, generation=1, reports=reports, pods={}, storage=StoragePlan(),
                           unrouted=unrouted)  # fmt: skip

    waiting = compute_status({}, observe("db-rw does not route to db-1 yet"), NOW)
    assert conditions(waiting)["Ready"] == ("False", "PrimaryNotRouted")
    assert waiting["phase"] == "Provisioning"  # a new cluster is still being created, not degraded
    ready = compute_status(waiting, observe(None), NOW)
    assert conditions(ready)["Ready"] == ("True", "InstancesReady")
    assert ready["phase"] == "Ready"
