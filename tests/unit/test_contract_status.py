"""kanri.contract.status: the ``GET /status`` body both sides share stays what the wire has always carried (an old
operator reads a new instance and the other way round), the instance sends exactly what it built, and the operator
reads a body from the network defensively."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from kanri.contract.status import MAX_LISTED, UNKNOWN_REASON, InstanceStatus, Problem

FENCE = "fenced since 2026-12-06T00:00:00+00:00: isolated: x; PostgreSQL is kept stopped until POST /unfence"

# Bodies as the instance manager sent them before the wire types moved to kanri.contract: the first two captured from
# InstanceManager.status() at 0ec1969 (PostgreSQL down), the running ones written from its status queries then.
BOOTSTRAPPING: dict[str, Any] = {
    "name": "db-1", "role": "primary", "inRecovery": None, "timeline": None, "systemIdentifier": None,
    "postgresVersion": None, "connections": None, "pendingRestart": None, "configErrors": None, "archiver": None,
    "running": False, "ready": False, "restartCount": 0, "lastError": None, "dataVersion": None,
    "binaryVersion": None, "problems": [], "fenced": False, "replicationPaused": False, "rejoin": None,
    "isolation": None, "restore": None,
}  # fmt: skip
FENCED: dict[str, Any] = {
    **BOOTSTRAPPING, "lastError": FENCE, "problems": [{"reason": "Fenced", "message": FENCE}], "fenced": True,
    "rejoin": {"state": "failed", "method": "clone", "message": "m"},
    "fencedSince": "2026-12-06T00:00:00+00:00", "fenceReason": "isolated: x",
}  # fmt: skip
ARCHIVER = {"mode": "on", "archivedCount": 12, "lastArchivedWal": "000000020000000000000007",
            "lastArchivedTime": "2026-12-06T06:00:00.123456+00:00", "failedCount": 1,
            "lastFailedWal": "000000010000000000000005", "lastFailedTime": "2026-12-06T05:00:00+00:00"}  # fmt: skip
RUNNING_BASE: dict[str, Any] = {
    "name": "db-2", "role": "replica", "inRecovery": True, "timeline": 2, "systemIdentifier": "7329117425863524378",
    "postgresVersion": "16.15", "connections": 3, "pendingRestart": True,
    "configErrors": ["work_mem: invalid value"], "archiver": ARCHIVER, "running": True, "ready": True,
    "restartCount": 1, "lastError": "postgres exited unexpectedly with code 1", "dataVersion": 16,
    "binaryVersion": 16,
    "problems": [{"reason": "InvalidParameter", "message": "work_mem: invalid value; not written",
                  "parameter": "work_mem"},
                 {"reason": "InvalidSecret", "message": "app Secret: password is empty", "secret": "app",
                  "key": "password"}],
    "fenced": False, "replicationPaused": True,
    "rejoin": {"state": "done", "method": "rewind", "message": "rewound",
               "divergence": {"timeline": 1, "switchpoint": "0/5000A0", "end": "0/50010F0", "bytes": 4176}},
    "isolation": {"lastContact": "2026-12-06T06:00:00.120+00:00", "via": "apiserver"},
    "restore": {"state": "done", "plan": "backup latest, target end of WAL", "message": "promoted"},
    "pendingRestartLowers": ["max_connections"],
}  # fmt: skip
REPLICA: dict[str, Any] = {**RUNNING_BASE, "receiveLsn": "0/7001F28", "replayLsn": "0/7001F28", "lagBytes": 0,
                           "streaming": True}  # fmt: skip
PRIMARY: dict[str, Any] = {
    **RUNNING_BASE, "name": "db-1", "role": "primary", "inRecovery": False, "replicationPaused": False,
    "rejoin": None, "writeLsn": "0/7001F28", "flushLsn": "0/7001F28",
    "replicas": [{"name": "db-2", "state": "streaming", "sentLsn": "0/7001F28", "flushLsn": "0/7001F28",
                  "replayLsn": "0/7001F00", "lagBytes": 40, "syncState": "async"}],
}  # fmt: skip
TODAY = {"bootstrapping": BOOTSTRAPPING, "fenced": FENCED, "replica": REPLICA, "primary": PRIMARY}


@pytest.mark.parametrize("body", TODAY.values(), ids=TODAY.keys())
def test_a_body_sent_before_the_contract_round_trips_to_the_same_bytes(body: dict[str, Any]) -> None:
    built = InstanceStatus.model_validate(body)  # as the instance builds it: types checked, nothing changed
    assert json.dumps(built.as_json()) == json.dumps(body)  # same keys, same order, same values


@pytest.mark.parametrize("body", TODAY.values(), ids=TODAY.keys())
def test_the_operator_reads_every_body_an_instance_sent_before_the_contract(body: dict[str, Any]) -> None:
    report = InstanceStatus.read(body)
    assert report is not None
    assert (report.name, report.role, report.ready, report.running) == (
        body["name"], body["role"], body["ready"], body["running"])  # fmt: skip
    assert [p.as_json() for p in report.problems] == body["problems"]
    assert report.fenced is body["fenced"]


def test_what_the_operator_reads_from_a_running_replica_and_primary() -> None:
    replica = InstanceStatus.read(REPLICA)
    assert replica is not None
    assert (replica.timeline, replica.receive_lsn, replica.replay_lsn, replica.lag_bytes) == (2, "0/7001F28",
                                                                                            "0/7001F28", 0)  # fmt: skip
    assert (replica.pending_restart, replica.replication_paused) == (True, True)
    assert replica.pending_lowers == ("max_connections",)
    assert (replica.system_identifier, replica.data_version, replica.binary_version) == ("7329117425863524378", 16, 16)
    assert replica.rejoin is not None
    assert replica.rejoin.divergence is not None
    assert (replica.rejoin.state, replica.rejoin.method, replica.rejoin.divergence.bytes) == ("done", "rewind", 4176)
    assert replica.rejoin.divergence.switchpoint == "0/5000A0"
    assert replica.problems[1] == Problem("InvalidSecret", "app Secret: password is empty", secret="app",
                                          key="password")  # fmt: skip
    primary = InstanceStatus.read(PRIMARY)
    assert primary is not None
    assert (primary.write_lsn, primary.receive_lsn) == ("0/7001F28", None)
    assert primary.archiver is not None
    assert (primary.archiver.last_archived_wal, primary.archiver.failed_count) == ("000000020000000000000007", 1)
    assert primary.replicas is not None
    assert primary.replicas[0].lag_bytes == 40


def test_keys_only_some_states_have_are_sent_only_when_the_instance_set_them() -> None:
    sent = InstanceStatus(name="db-1", role="primary", running=False, fenced=False).as_json()
    assert set(sent) == {"name", "role", "running", "fenced"}
    fenced = InstanceStatus(name="db-1", role="primary", fenced=True, fenced_since=None, fence_reason="r").as_json()
    assert fenced == {"name": "db-1", "role": "primary", "fenced": True, "fencedSince": None, "fenceReason": "r"}
    lowers = InstanceStatus(name="db-1", role="primary", pending_lowers=("max_connections",)).as_json()
    assert lowers["pendingRestartLowers"] == ["max_connections"]


def test_a_problems_optional_fields_are_sent_only_when_set_and_its_message_is_one_line() -> None:
    assert Problem("DataDirectoryLost", "the volume\n  is empty").as_json() == {
        "reason": "DataDirectoryLost", "message": "the volume is empty"}  # fmt: skip
    assert Problem("InvalidParameter", "x" * 1000, parameter="work_mem").as_json()["message"].endswith("…")
    assert len(Problem("InvalidParameter", "x" * 1000).message) == 300


def test_the_instance_cannot_send_a_problem_reason_the_operator_does_not_know() -> None:
    with pytest.raises(ValidationError, match="unknown problem reason"):
        Problem("SomethingNew", "m")


def test_a_body_that_is_no_report_is_no_answer() -> None:
    assert InstanceStatus.read({"name": "db-1", "role": "leader"}) is None
    assert InstanceStatus.read({"role": "primary"}) is None
    assert InstanceStatus.read({"name": "", "role": "primary"}) is None
    assert InstanceStatus.read(["not", "an", "object"]) is None
    assert InstanceStatus.read(BOOTSTRAPPING | {"role": "replica"}) is not None
    assert InstanceStatus.read(BOOTSTRAPPING | {"role": "primary"}) is not None


def test_wrong_values_from_the_network_read_as_absent() -> None:
    body = {"name": "db-1", "role": "primary", "systemIdentifier": 2**60, "dataVersion": "15", "timeline": True,
            "lagBytes": -1, "writeLsn": "", "ready": "yes", "fenced": "yes", "pendingRestart": 1,
            "fenceReason": "  a\n reason ", "archiver": "on", "rejoin": {"state": "paused"},
            "connections": "many", "replicas": "none", "restartCount": None,
            "newKey": {"from": "a newer instance"}}  # fmt: skip
    report = InstanceStatus.read(body)
    assert report is not None
    assert (report.system_identifier, report.data_version, report.timeline, report.lag_bytes) == (None,) * 4
    assert (report.write_lsn, report.ready, report.fenced, report.pending_restart) == (None, False, False, False)
    assert (report.fence_reason, report.archiver, report.rejoin) == ("a reason", None, None)
    assert (report.connections, report.replicas, report.restart_count) == (None, None, 0)


def test_problems_from_the_network_are_cut_kept_short_and_unknown_reasons_named_as_such() -> None:
    problems = [{"reason": "DataVersionMismatch", "message": "data is 15,\nbinaries are 16"},
                {"reason": "Whatever", "message": "x" * 1000}, {"reason": "InvalidSecret"}, "junk",
                {"reason": "InvalidSecret", "message": "m", "secret": 5, "key": " "}]  # fmt: skip
    report = InstanceStatus.read({"name": "db-1", "role": "replica", "problems": problems})
    assert report is not None
    assert [p.reason for p in report.problems] == ["DataVersionMismatch", UNKNOWN_REASON, "InvalidSecret"]
    assert report.problems[0].message == "data is 15, binaries are 16"
    assert len(report.problems[1].message) == 300
    assert (report.problems[2].secret, report.problems[2].key) == (None, None)
    many = InstanceStatus.read({"name": "db-1", "role": "replica", "problems": [{"reason": "Fenced", "message": "m"}]
                                * 40, "pendingRestartLowers": ["max_connections", 5, "x" * 64] * 20})  # fmt: skip
    assert many is not None
    assert len(many.problems) == MAX_LISTED
    assert set(many.pending_lowers) == {"max_connections"}


def test_a_rejoin_from_the_network_keeps_only_what_it_can_name() -> None:
    rejoin = {"state": "running", "method": "teleport", "message": "  go ",
              "divergence": {"bytes": "10", "switchpoint": "0/5000A0; DROP", "timeline": 1}}  # fmt: skip
    report = InstanceStatus.read({"name": "db-1", "role": "replica", "rejoin": rejoin})
    assert report is not None
    assert report.rejoin is not None
    assert report.rejoin.divergence is not None
    assert (report.rejoin.state, report.rejoin.method, report.rejoin.message) == ("running", None, "go")
    assert (report.rejoin.divergence.bytes, report.rejoin.divergence.switchpoint) == (None, None)
    broken = InstanceStatus.read({"name": "db-1", "role": "replica", "rejoin": {"state": "done", "divergence": 3}})
    assert broken is not None
    assert broken.rejoin is not None
    assert broken.rejoin.divergence is None
