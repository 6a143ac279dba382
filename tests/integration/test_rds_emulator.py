"""The RDS emulator (tests/rds_emulator) against the real AWS SDK: every rule it adds to moto, each asserted.

A manual clock drives the statuses, so a test moves time exactly as far as a transition needs; one test runs on the
real clock to show the statuses move by themselves.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from itertools import count
from typing import Any

import pytest
from botocore.exceptions import ClientError  # type: ignore[import-untyped]

from kanri.local.ports import free_port
from tests.rds_emulator import Delays, ManualClock, RdsEmulator
from tests.support import eventually

DELAYS = Delays(
    creating=60, backing_up=30, modifying=20, storage_optimization=40, storage_cooldown=6 * 3600, deleting=15
)
_names = count()


@pytest.fixture(scope="module")
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(scope="module")
def rds(clock: ManualClock) -> Iterator[RdsEmulator]:
    with RdsEmulator(DELAYS, clock=clock) as emulator:
        yield emulator


@pytest.fixture
def client(rds: RdsEmulator) -> Any:
    rds.faults.clear()
    return rds.client()


def _create(client: Any, **extra: Any) -> str:
    name = f"db{next(_names)}"
    args: dict[str, Any] = {
        "DBInstanceIdentifier": name,
        "DBInstanceClass": "db.t3.micro",
        "Engine": "postgres",
        "EngineVersion": "16.3",
        "MasterUsername": "app",
        "MasterUserPassword": "not-a-real-secret",
        "AllocatedStorage": 100,
    }
    client.create_db_instance(**{**args, **extra})
    return name


def _available(client: Any, clock: ManualClock, **extra: Any) -> str:
    name = _create(client, **extra)
    clock.advance(DELAYS.creating + DELAYS.backing_up)
    assert _describe(client, name)["DBInstanceStatus"] == "available"
    return name


def _describe(client: Any, name: str) -> dict[str, Any]:
    found: dict[str, Any] = client.describe_db_instances(DBInstanceIdentifier=name)["DBInstances"][0]
    return found


def _error(exc: pytest.ExceptionInfo[ClientError]) -> tuple[str, str]:
    error = exc.value.response["Error"]
    return error["Code"], error["Message"]


def test_create_answers_creating_then_backing_up_then_available(client: Any, clock: ManualClock) -> None:
    name = f"db{next(_names)}"
    created = client.create_db_instance(
        DBInstanceIdentifier=name,
        DBInstanceClass="db.t3.micro",
        Engine="postgres",
        MasterUsername="app",
        MasterUserPassword="not-a-real-secret",
        AllocatedStorage=20,
    )
    assert created["DBInstance"]["DBInstanceStatus"] == "creating"
    clock.advance(DELAYS.creating - 1)
    assert _describe(client, name)["DBInstanceStatus"] == "creating"
    clock.advance(1)
    assert _describe(client, name)["DBInstanceStatus"] == "backing-up"
    clock.advance(DELAYS.backing_up)
    listed = {i["DBInstanceIdentifier"]: i["DBInstanceStatus"] for i in client.describe_db_instances()["DBInstances"]}
    assert listed[name] == "available"


async def test_statuses_move_on_the_real_clock() -> None:
    # creating lasts long enough that the first look (right after the create returned) sees it on a loaded machine
    delays = Delays(creating=5.0, backing_up=0.3, modifying=0.3, storage_optimization=0.3, deleting=0.3)
    with RdsEmulator(delays) as emulator:
        client = emulator.client()
        name = await asyncio.to_thread(_create, client)
        seen: list[str] = []

        async def available() -> bool:
            seen.append((await asyncio.to_thread(_describe, client, name))["DBInstanceStatus"])
            return seen[-1] == "available"

        await eventually(available, timeout=30, interval=0.05)
        assert seen[0] == "creating"
        assert seen[-1] == "available"
        await asyncio.to_thread(client.delete_db_instance, DBInstanceIdentifier=name, SkipFinalSnapshot=True)

        async def gone() -> str | None:
            try:
                await asyncio.to_thread(_describe, client, name)
            except ClientError as exc:
                return str(exc.response["Error"]["Code"])
            return None

        assert await eventually(gone, timeout=30, interval=0.05) == "DBInstanceNotFound"


def test_a_storage_decrease_is_refused_with_rds_message(client: Any, clock: ManualClock) -> None:
    name = _available(client, clock)
    with pytest.raises(ClientError) as exc:
        client.modify_db_instance(DBInstanceIdentifier=name, AllocatedStorage=50, ApplyImmediately=True)
    assert _error(exc) == (
        "InvalidParameterCombination",
        "Invalid storage size for engine name postgres and storage type gp2: 50",
    )
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert _describe(client, name)["AllocatedStorage"] == 100


def test_storage_grows_by_at_least_ten_percent_then_optimizes_and_cools_down(client: Any, clock: ManualClock) -> None:
    name = _available(client, clock)
    answer = client.modify_db_instance(DBInstanceIdentifier=name, AllocatedStorage=105, ApplyImmediately=True)
    assert answer["DBInstance"]["DBInstanceStatus"] == "modifying"
    assert _describe(client, name)["AllocatedStorage"] == 110  # rounded up to +10 %, as the API reference says
    clock.advance(DELAYS.modifying)
    assert _describe(client, name)["DBInstanceStatus"] == "storage-optimization"
    clock.advance(DELAYS.storage_optimization)
    assert _describe(client, name)["DBInstanceStatus"] == "available"
    with pytest.raises(ClientError) as exc:
        client.modify_db_instance(DBInstanceIdentifier=name, AllocatedStorage=200, ApplyImmediately=True)
    assert _error(exc)[0] == "InvalidParameterCombination"
    assert "previous storage change is being optimized" in _error(exc)[1]
    clock.advance(DELAYS.storage_cooldown)
    client.modify_db_instance(DBInstanceIdentifier=name, AllocatedStorage=200, ApplyImmediately=True)
    assert _describe(client, name)["AllocatedStorage"] == 200


def test_an_instance_that_is_not_available_cannot_be_modified(client: Any, clock: ManualClock) -> None:
    name = _create(client)
    with pytest.raises(ClientError) as exc:
        client.modify_db_instance(DBInstanceIdentifier=name, DBInstanceClass="db.t3.small", ApplyImmediately=True)
    assert _error(exc) == ("InvalidDBInstanceState", "Database instance is not in available state.")


def test_engine_version_rules(client: Any, clock: ManualClock) -> None:
    name = _available(client, clock)
    with pytest.raises(ClientError) as exc:
        client.modify_db_instance(DBInstanceIdentifier=name, EngineVersion="17.2", ApplyImmediately=True)
    assert _error(exc) == (
        "InvalidParameterCombination",
        "The AllowMajorVersionUpgrade flag must be present when upgrading to a new major version.",
    )
    with pytest.raises(ClientError) as exc:
        client.modify_db_instance(DBInstanceIdentifier=name, EngineVersion="15.7", ApplyImmediately=True)
    assert _error(exc) == ("InvalidParameterCombination", "Cannot upgrade postgres from 16.3 to 15.7")
    client.modify_db_instance(
        DBInstanceIdentifier=name, EngineVersion="17.2", AllowMajorVersionUpgrade=True, ApplyImmediately=True
    )
    assert _describe(client, name)["EngineVersion"] == "17.2"


def test_a_modify_without_changes_is_refused(client: Any, clock: ManualClock) -> None:
    name = _available(client, clock)
    with pytest.raises(ClientError) as exc:
        client.modify_db_instance(DBInstanceIdentifier=name, ApplyImmediately=True)
    assert _error(exc) == ("InvalidParameterCombination", "No modifications were requested")


def test_without_apply_immediately_changes_wait_for_the_maintenance_window(
    client: Any, clock: ManualClock, rds: RdsEmulator
) -> None:
    name = _available(client, clock)
    answer = client.modify_db_instance(DBInstanceIdentifier=name, DBInstanceClass="db.m5.large", AllocatedStorage=150)
    assert answer["DBInstance"]["PendingModifiedValues"] == {"DBInstanceClass": "db.m5.large", "AllocatedStorage": 150}
    now = _describe(client, name)
    assert (now["DBInstanceStatus"], now["DBInstanceClass"]) == ("available", "db.t3.micro")
    assert now["AllocatedStorage"] == 100
    # A change RDS does not hold for the window (backup retention) applies at once, the deferred ones still wait.
    client.modify_db_instance(DBInstanceIdentifier=name, BackupRetentionPeriod=7)
    now = _describe(client, name)
    assert (now["DBInstanceStatus"], now["BackupRetentionPeriod"]) == ("modifying", 7)
    assert now["PendingModifiedValues"] == {"DBInstanceClass": "db.m5.large", "AllocatedStorage": 150}
    clock.advance(DELAYS.modifying)
    assert rds.maintenance(name) is True
    after = _describe(client, name)
    assert (after["DBInstanceStatus"], after["DBInstanceClass"], after["AllocatedStorage"]) == (
        "modifying",
        "db.m5.large",
        150,
    )
    assert "PendingModifiedValues" not in after or not after["PendingModifiedValues"]
    assert rds.maintenance(name) is False


def test_delete_needs_a_final_snapshot_unless_skipped(client: Any, clock: ManualClock) -> None:
    name = _available(client, clock)
    with pytest.raises(ClientError) as exc:
        client.delete_db_instance(DBInstanceIdentifier=name)
    assert _error(exc) == (
        "InvalidParameterCombination",
        "FinalDBSnapshotIdentifier is required unless SkipFinalSnapshot is specified.",
    )
    with pytest.raises(ClientError) as exc:
        client.delete_db_instance(DBInstanceIdentifier=name, SkipFinalSnapshot=True, FinalDBSnapshotIdentifier="x")
    assert _error(exc)[0] == "InvalidParameterCombination"
    assert _describe(client, name)["DBInstanceStatus"] == "available"


def test_delete_takes_the_final_snapshot_as_it_starts_then_the_instance_is_gone(
    client: Any, clock: ManualClock
) -> None:
    name = _available(client, clock)
    answer = client.delete_db_instance(DBInstanceIdentifier=name, FinalDBSnapshotIdentifier=f"{name}-final")
    assert answer["DBInstance"]["DBInstanceStatus"] == "deleting"
    snapshots = client.describe_db_snapshots(DBSnapshotIdentifier=f"{name}-final")["DBSnapshots"]
    assert [(s["DBSnapshotIdentifier"], s["DBInstanceIdentifier"]) for s in snapshots] == [(f"{name}-final", name)]
    assert snapshots[0]["Status"] == "creating"  # being taken while the instance is deleting
    assert _describe(client, name)["DBInstanceStatus"] == "deleting"
    with pytest.raises(ClientError) as exc:
        client.delete_db_instance(DBInstanceIdentifier=name, SkipFinalSnapshot=True)
    assert _error(exc)[0] == "InvalidDBInstanceState"
    clock.advance(DELAYS.deleting)
    with pytest.raises(ClientError) as exc:
        _describe(client, name)
    assert _error(exc)[0] == "DBInstanceNotFound"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    after = client.describe_db_snapshots(DBSnapshotIdentifier=f"{name}-final")["DBSnapshots"]
    assert [s["Status"] for s in after] == ["available"]


def test_a_skipped_final_snapshot_leaves_no_snapshot(client: Any, clock: ManualClock) -> None:
    name = _available(client, clock)
    client.delete_db_instance(DBInstanceIdentifier=name, SkipFinalSnapshot=True)
    clock.advance(DELAYS.deleting)
    manual = client.describe_db_snapshots(DBInstanceIdentifier=name, SnapshotType="manual")["DBSnapshots"]
    assert manual == []


def test_no_final_snapshot_of_an_instance_being_created(client: Any) -> None:
    name = _create(client)
    with pytest.raises(ClientError) as exc:
        client.delete_db_instance(DBInstanceIdentifier=name, FinalDBSnapshotIdentifier=f"{name}-final")
    assert _error(exc) == (
        "InvalidDBInstanceState",
        f"Instance {name} is currently creating - a final snapshot cannot be taken.",
    )


def test_throttling_answers_the_next_calls_without_acting(client: Any, rds: RdsEmulator) -> None:
    rds.faults.throttle(2, action="CreateDBInstance")
    client.describe_db_instances()  # another action passes
    name = f"db{next(_names)}"
    for _ in range(2):
        with pytest.raises(ClientError) as exc:
            _create_named(client, name)
        assert _error(exc) == ("ThrottlingException", "Rate exceeded")
        assert exc.value.response["Error"]["Type"] == "Sender"
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    assert name not in {i["DBInstanceIdentifier"] for i in client.describe_db_instances()["DBInstances"]}
    _create_named(client, name)
    outcomes = [c.outcome for c in rds.log.calls("CreateDBInstance", name)]
    assert outcomes == ["ThrottlingException", "ThrottlingException", "ok"]


def _create_named(client: Any, name: str) -> None:
    client.create_db_instance(
        DBInstanceIdentifier=name,
        DBInstanceClass="db.t3.micro",
        Engine="postgres",
        MasterUsername="app",
        MasterUserPassword="not-a-real-secret",
        AllocatedStorage=20,
    )


def test_the_sdk_sees_throttling_as_throttling_and_retries_past_it(rds: RdsEmulator) -> None:
    rds.faults.clear()
    rds.faults.throttle(2)
    before = rds.log.count("DescribeDBInstances")
    answer = rds.client(attempts=3).describe_db_instances()
    assert answer["ResponseMetadata"]["RetryAttempts"] == 2
    assert rds.log.count("DescribeDBInstances") - before == 3


def test_calls_above_a_rate_are_throttled(client: Any, rds: RdsEmulator, clock: ManualClock) -> None:
    rds.faults.throttle_above(rate=2, burst=3)
    outcomes = []
    for _ in range(5):
        try:
            client.describe_db_instances()
            outcomes.append("ok")
        except ClientError as exc:
            outcomes.append(exc.response["Error"]["Code"])
    assert outcomes == ["ok", "ok", "ok", "ThrottlingException", "ThrottlingException"]
    clock.advance(1.0)  # two tokens back
    client.describe_db_instances()
    client.describe_db_instances()
    with pytest.raises(ClientError):
        client.describe_db_instances()


@pytest.mark.parametrize(("status", "code"), [(500, "InternalFailure"), (503, "ServiceUnavailable")])
def test_transient_server_errors_for_the_next_calls(client: Any, rds: RdsEmulator, status: int, code: str) -> None:
    rds.faults.fail(1, status)
    with pytest.raises(ClientError) as exc:
        client.describe_db_instances()
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == status
    assert exc.value.response["Error"]["Code"] == code
    client.describe_db_instances()


def test_the_call_log_counts_each_action_and_meters_the_rate(client: Any, rds: RdsEmulator, clock: ManualClock) -> None:
    rds.log.clear()
    name = _available(client, clock)
    for _ in range(3):
        _describe(client, name)
    assert rds.log.count("CreateDBInstance") == 1
    assert rds.log.count("CreateDBInstance", name) == 1
    assert rds.log.count("DescribeDBInstances", name) == 4
    assert rds.log.count("ModifyDBInstance") == 0
    # The manual clock stood still through the four describes: they all fall into one second; the create came
    # 90 s (creating + backing-up) before them.
    assert rds.log.peak_rate(window=1.0) == 4.0
    assert rds.log.rate(window=1.0) == 4.0


def test_the_standalone_emulator_takes_faults_and_reports_calls() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.rds_emulator", "--port", str(port), "--creating", "0"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        banner = process.stdout.readline()
        assert re.search(rf"http://127.0.0.1:{port}\b", banner), banner
        base = f"http://127.0.0.1:{port}"
        client = _client_for(base)
        _post(f"{base}/_emulator/faults", {"throttle": 1})
        with pytest.raises(ClientError) as exc:
            client.describe_db_instances()
        assert _error(exc)[0] == "ThrottlingException"
        client.describe_db_instances()
        with urllib.request.urlopen(f"{base}/_emulator/calls") as answer:
            calls = json.load(answer)
        assert [c["outcome"] for c in calls] == ["ThrottlingException", "ok"]
    finally:
        process.terminate()
        process.wait(10)


def _client_for(endpoint: str) -> Any:
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    return boto3.client(
        "rds",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}),
    )


def _post(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request) as answer:
        assert answer.status == 200
