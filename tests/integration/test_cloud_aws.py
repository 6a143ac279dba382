"""The cloud operator's aws provider on the real API server against the RDS emulator (tests/rds_emulator: moto
behind a proxy with RDS's state transitions, throttling, storage and final-snapshot rules, and a call log)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, ClassVar

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from kanri.cloud import naming
from kanri.cloud.api import CLASS, INSTANCE, DatabaseClass, DatabaseInstance
from kanri.cloud.budget.buckets import Budgets, TokenBucket
from kanri.cloud.names import APPROVE_DOWNTIME
from kanri.cloud.reconciler import controller
from kanri.local import Endpoint
from kanri.runtime import ApiError, Client, Manager, ManagerOptions, get_condition, install_crd
from kanri.runtime.kinds import SECRET
from tests.rds_emulator import Delays, RdsEmulator
from tests.support import NotYet, eventually

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
REGION = "us-east-1"


@pytest.fixture(scope="module")
def rds() -> Iterator[RdsEmulator]:
    with RdsEmulator(Delays(creating=1.0, backing_up=0.5, modifying=1.0, deleting=1.0)) as emulator:
        yield emulator


@pytest_asyncio.fixture(loop_scope="session")
async def client(control_plane: Endpoint) -> AsyncIterator[Client]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as c:
        for kind in (DatabaseInstance, DatabaseClass):
            await install_crd(c, kind, field_manager="cloud-tests")
        yield c


@pytest_asyncio.fixture(loop_scope="session")
async def db_class(client: Client, rds: RdsEmulator, namespace: str) -> AsyncIterator[str]:
    """A DatabaseClass of its own for the test (cluster-scoped), pointing at the emulator with credentials."""
    name = f"aws-{secrets.token_hex(4)}"
    await client.create(SECRET, {"metadata": {"name": "rds-credentials", "namespace": namespace},
                                 "stringData": {"accessKeyId": "testing", "secretAccessKey": "testing"}})  # fmt: skip
    await client.create(CLASS, {"metadata": {"name": name}, "spec": {
        "provider": "aws",
        "aws": {"endpointUrl": rds.endpoint, "region": REGION, "account": name,
                "credentialsSecret": {"name": "rds-credentials", "namespace": namespace}},
        "guardrails": {"minBackupRetentionDays": 1, "allowedSizes": ["small", "medium"]},
        "requestBudget": {"requestsPerSecond": 20, "burst": 20}}})  # fmt: skip
    yield name
    with contextlib.suppress(ApiError):
        await client.delete(CLASS, name)


@contextlib.asynccontextmanager
async def operator(client: Client, namespace: str, budgets: Budgets | None = None) -> AsyncIterator[CollectorRegistry]:
    registry = CollectorRegistry()
    options = ManagerOptions(name="kanri-cloud-operator", namespace=namespace, leader_election=False,
                             health_port=0, graceful_shutdown_timeout=10)  # fmt: skip
    manager = Manager(client, options, registry=registry)
    manager.add(controller(manager, registry=registry, budgets=budgets or Budgets(), poll_scale=0.1))  # 8 workers
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        yield registry
    finally:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


def instance(name: str, namespace: str, db_class: str, **spec: Any) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace},
            "spec": {"className": db_class, "version": 16, "storage": "20Gi", **spec}}  # fmt: skip


def condition(obj: Obj, kind: str) -> Obj:
    return get_condition((obj.get("status") or {}).get("conditions"), kind) or {}


async def reason_is(client: Client, namespace: str, name: str, kind: str, reason: str) -> Obj | None:
    obj = await client.get(INSTANCE, name, namespace)
    return obj if condition(obj, kind).get("reason") == reason else None


async def until(client: Client, namespace: str, name: str, done: Callable[[Obj], bool], timeout: float = 60) -> Obj:
    """The object once ``done(obj)``; the failure names its last status."""
    last: list[Obj] = [{}]

    async def check() -> Obj | None:
        obj = last[0] = await client.get(INSTANCE, name, namespace)
        return obj if done(obj) else None

    try:
        return await eventually(check, timeout=timeout)
    except NotYet:
        raise NotYet(f"{name}: not yet; status: {last[0].get('status')}") from None


async def ready(client: Client, namespace: str, name: str, timeout: float = 60) -> Obj:
    last: list[Obj] = [{}]

    async def check() -> Obj | None:
        obj = last[0] = await client.get(INSTANCE, name, namespace)
        current = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and condition(obj, "Ready").get("status") == "True" else None

    try:
        return await eventually(check, timeout=timeout)
    except NotYet:
        raise NotYet(f"{name} not Ready; status: {last[0].get('status')}") from None


async def test_an_instance_is_created_once_connects_and_costs_no_update_once_converged(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    await client.create(INSTANCE, instance("orders", namespace, db_class))
    identifier = naming.identifier(namespace, "orders")
    async with operator(client, namespace):
        obj = await ready(client, namespace, "orders")
        status = obj["status"]
        assert status["externalId"] == identifier
        assert status["state"] == "available"
        assert (status["lastOperation"]["kind"], status["lastOperation"]["outcome"]) == ("Create", "Succeeded")
        assert "operation" not in status
        secret = await client.get(SECRET, status["connectionSecret"], namespace)
        data = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
        assert data["host"].startswith(identifier)
        assert (data["port"], data["dbname"], data["username"]) == ("5432", "app", "kanri")
        assert len(data["password"]) >= 24
        # the endless-diff bug: look again several times; nothing is sent to RDS but describes
        for value in range(3):
            before = rds.log.count(instance=identifier)
            await client.patch(INSTANCE, "orders", {"metadata": {"annotations": {"look": str(value)}}}, namespace)

            async def looked(before: int = before) -> bool:
                return rds.log.count(instance=identifier) > before

            await eventually(looked, timeout=30)
    assert rds.log.count("CreateDBInstance", instance=identifier) == 1
    assert rds.log.count("ModifyDBInstance", instance=identifier) == 0
    after = {call.action for call in rds.log.calls(instance=identifier)[-3:]}
    assert after == {"DescribeDBInstances"}, after


async def test_an_operator_stopped_mid_create_resumes_without_a_second_instance(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    # a real stop: the operator goes away once the create is on record, a new one finishes it
    await client.create(INSTANCE, instance("first", namespace, db_class))
    async with operator(client, namespace):

        async def on_record() -> Obj | None:
            obj = await client.get(INSTANCE, "first", namespace)
            return obj if (obj.get("status") or {}).get("operation") else None

        await eventually(on_record, timeout=30)
    # the moment a crash loses most: RDS accepted the create, the operator died before recording it accepted
    created = await client.create(INSTANCE, instance("second", namespace, db_class))
    second = naming.identifier(namespace, "second")
    body = {"metadata": {"resourceVersion": created["metadata"]["resourceVersion"]}, "status": {"operation": {
        "kind": "Create", "id": f"create-{created['metadata']['uid']}", "targetState": "available",
        "started": "2026-01-01T00:00:00Z", "outcome": "Pending"}}}  # fmt: skip
    await client.patch_status(INSTANCE, "second", body, namespace)
    await asyncio.to_thread(rds.client(REGION).create_db_instance, DBInstanceIdentifier=second,
                            DBInstanceClass="db.t3.micro", Engine="postgres", EngineVersion="16", AllocatedStorage=20,
                            MasterUsername="kanri", MasterUserPassword="set-before-the-crash", DBName="app",
                            Tags=[{"Key": "kanri.dev/owner-uid", "Value": created["metadata"]["uid"]}])  # fmt: skip
    async with operator(client, namespace):
        for name in ("first", "second"):
            obj = await ready(client, namespace, name)
            assert obj["status"]["lastOperation"]["outcome"] == "Succeeded"
    for name in ("first", "second"):
        identifier = naming.identifier(namespace, name)
        assert rds.log.count("CreateDBInstance", instance=identifier, outcome="ok") == 1, rds.log.calls(
            instance=identifier
        )
    listed = await asyncio.to_thread(rds.client(REGION).describe_db_instances)
    ours = [db["DBInstanceIdentifier"] for db in listed["DBInstances"] if namespace in db["DBInstanceIdentifier"]]
    assert sorted(ours) == sorted(naming.identifier(namespace, n) for n in ("first", "second"))


def peak(calls: list[float], window: float = 1.0) -> int:
    """The most calls in any ``window`` seconds."""
    times = sorted(calls)
    return max((sum(1 for t in times[i:] if t - start < window) for i, start in enumerate(times)), default=0)


class RecordingBucket(TokenBucket):
    """A bucket that remembers when it granted a call (the operator's clock: the emulator logs answer times, which
    bunch up when moto answers a backlog)."""

    grants: ClassVar[list[float]] = []

    def take(self, now: float, *, credit: bool = False) -> float:
        wait = super().take(now, credit=credit)
        if wait == 0.0:
            self.grants.append(now)
        return wait


class RecordingBudgets(Budgets):
    bucket_type = RecordingBucket


async def test_five_instances_at_once_stay_within_the_request_budget(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    await client.patch(CLASS, db_class, {"spec": {"requestBudget": {"requestsPerSecond": 2, "burst": 2}}})
    names = [f"db{i}" for i in range(5)]
    for name in names:
        await client.create(INSTANCE, instance(name, namespace, db_class))
    RecordingBucket.grants.clear()
    async with operator(client, namespace, budgets=RecordingBudgets()) as registry:
        for name in names:
            await ready(client, namespace, name)
        budget = {"provider": "aws", "budget": f"aws:{db_class}@{rds.endpoint}/{REGION}"}
        waits = registry.get_sample_value("kanri_cloud_budget_waits_total", budget)
    grants = sorted(RecordingBucket.grants)
    # a bucket of 2/s with a burst of 2 grants at most 4 calls in any one second, plus one follow-up on credit
    assert peak(grants) <= 5, [round(t - grants[0], 3) for t in grants]
    calls = [c for n in names for c in rds.log.calls(instance=naming.identifier(namespace, n))]
    assert len(calls) == len(grants)  # every call RDS saw went through the budget
    assert (waits or 0) > 0
    assert all(rds.log.count("CreateDBInstance", instance=naming.identifier(namespace, n)) == 1 for n in names)


async def test_a_throttled_provider_shows_the_budget_condition_and_converges(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    await client.create(INSTANCE, instance("slow", namespace, db_class))
    rds.faults.throttle(3)
    async with operator(client, namespace):
        seen = await eventually(lambda: reason_is(client, namespace, "slow", "Synced", "WaitingForAPIBudget"),
                                timeout=30)  # fmt: skip
        assert "throttled" in condition(seen, "Synced")["message"]
        await ready(client, namespace, "slow")
    assert rds.log.count(outcome="ThrottlingException") >= 3


async def deleted(client: Client, namespace: str, name: str, timeout: float = 60) -> None:
    """Wait until the object is gone; the failure names its last status."""
    last: list[Obj] = [{}]

    async def gone() -> bool:
        try:
            last[0] = await client.get(INSTANCE, name, namespace)
        except ApiError as error:
            return error.not_found
        return False

    try:
        await eventually(gone, timeout=timeout)
    except NotYet:
        raise NotYet(f"{name} not deleted; status: {last[0].get('status')}") from None


async def test_retain_keeps_the_database_and_its_secret_after_the_object_is_deleted(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    await client.create(INSTANCE, instance("kept", namespace, db_class))
    identifier = naming.identifier(namespace, "kept")
    async with operator(client, namespace):
        await ready(client, namespace, "kept")
        await client.delete(INSTANCE, "kept", namespace)
        await deleted(client, namespace, "kept")
    found = await asyncio.to_thread(rds.client(REGION).describe_db_instances, DBInstanceIdentifier=identifier)
    assert found["DBInstances"][0]["DBInstanceStatus"] == "available"
    assert rds.log.count("DeleteDBInstance", instance=identifier) == 0
    secret = await client.get(SECRET, naming.connection_secret("kept"), namespace)
    assert "password" in secret["data"]


async def test_delete_takes_the_final_snapshot_first(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    created = await client.create(INSTANCE, instance("doomed", namespace, db_class, deletionPolicy="Delete"))
    identifier = naming.identifier(namespace, "doomed")
    async with operator(client, namespace):
        await ready(client, namespace, "doomed")
        await client.delete(INSTANCE, "doomed", namespace)
        await deleted(client, namespace, "doomed")
    rds_client = rds.client(REGION)
    with pytest.raises(Exception, match="DBInstanceNotFound"):
        await asyncio.to_thread(rds_client.describe_db_instances, DBInstanceIdentifier=identifier)
    snapshot = naming.final_snapshot_id(identifier, created["metadata"]["uid"])
    found = await asyncio.to_thread(rds_client.describe_db_snapshots, DBSnapshotIdentifier=snapshot)
    assert found["DBSnapshots"][0]["DBInstanceIdentifier"] == identifier
    assert rds.log.count("DeleteDBInstance", instance=identifier, outcome="ok") == 1
    with pytest.raises(ApiError):
        await client.get(SECRET, naming.connection_secret("doomed"), namespace)


async def test_an_unsupported_field_is_named_and_nothing_is_created(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    spec = {"network": {"allowedCidrs": ["10.1.0.0/16"]}, "providers": {"kanri": {"instances": 2}}}
    await client.create(INSTANCE, instance("picky", namespace, db_class, **spec))
    async with operator(client, namespace):
        obj = await eventually(lambda: reason_is(client, namespace, "picky", "Unsupported", "UnsupportedField"),
                               timeout=30)  # fmt: skip
    assert condition(obj, "Unsupported")["status"] == "True"
    assert obj["status"]["unsupported"] == ["network.allowedCidrs", "providers.kanri"]
    assert condition(obj, "Synced")["reason"] == "UnsupportedField"
    assert rds.log.count(instance=naming.identifier(namespace, "picky")) == 0


async def test_hostile_specs_are_refused_by_the_api_or_named_in_status(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    created = await client.create(INSTANCE, instance("hostile", namespace, db_class))
    for patch, words in (({"storage": "10Gi"}, "cannot shrink"), ({"className": "other"}, "immutable"),
                         ({"version": 15}, "cannot go down"), ({"engine": "mysql"}, "Unsupported value")):  # fmt: skip
        with pytest.raises(ApiError, match=words):
            await client.patch(INSTANCE, "hostile", {"spec": patch}, namespace)
    with pytest.raises(ApiError, match="at least 1Gi"):
        await client.create(INSTANCE, instance("tiny", namespace, db_class, storage="100Mi"))
    await client.delete(INSTANCE, created["metadata"]["name"], namespace)
    # inside the schema but outside the class's guardrails: named, and nothing is sent to RDS
    rails = {"size": "large", "backupRetentionDays": 0, "network": {"access": "Public"}}
    await client.create(INSTANCE, instance("outside", namespace, db_class, **rails))
    async with operator(client, namespace):
        obj = await eventually(lambda: reason_is(client, namespace, "outside", "Ready", "GuardrailViolated"),
                               timeout=30)  # fmt: skip
    message = condition(obj, "Synced")["message"]
    for rule in ("allowedSizes", "minBackupRetentionDays", "allowPublicAccess"):
        assert rule in message
    assert rds.log.count(instance=naming.identifier(namespace, "outside")) == 0


async def test_a_change_needing_downtime_waits_for_its_approval_and_others_apply_at_once(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    await client.create(INSTANCE, instance("grow", namespace, db_class))
    identifier = naming.identifier(namespace, "grow")
    async with operator(client, namespace):
        await ready(client, namespace, "grow")
        await client.patch(INSTANCE, "grow", {"spec": {"storage": "30Gi", "size": "medium"}}, namespace)
        obj = await eventually(lambda: reason_is(client, namespace, "grow", "Planned", "ApprovalRequired"),
                               timeout=30)  # fmt: skip
        subject = "size at generation 2"
        assert subject in condition(obj, "Planned")["message"]

        async def storage_grown() -> Obj | None:
            found = await asyncio.to_thread(rds.client(REGION).describe_db_instances, DBInstanceIdentifier=identifier)
            db = found["DBInstances"][0]
            return db if db["AllocatedStorage"] == 30 and db["DBInstanceStatus"] == "available" else None

        db = await eventually(storage_grown, timeout=30)
        assert db["DBInstanceClass"] == "db.t3.micro"  # the size waits for its approval
        await client.patch(INSTANCE, "grow", {"metadata": {"annotations": {APPROVE_DOWNTIME: subject}}}, namespace)

        def resized(obj: Obj) -> bool:
            last = (obj.get("status") or {}).get("lastOperation") or {}
            done = last.get("fields") == ["size"] and last.get("outcome") == "Succeeded"
            return done and condition(obj, "Planned").get("reason") == "NothingPlanned"

        await until(client, namespace, "grow", resized)
        await ready(client, namespace, "grow")
    modifies = rds.log.calls("ModifyDBInstance", instance=identifier)
    assert [call.outcome for call in modifies] == ["ok", "ok"], modifies


async def test_an_adopted_database_is_only_observed_and_never_deleted_in_observe_only(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    existing = f"legacy-{namespace}"[:63].rstrip("-")
    await asyncio.to_thread(rds.client(REGION).create_db_instance, DBInstanceIdentifier=existing,
                            DBInstanceClass="db.t3.micro", Engine="postgres", EngineVersion="15", AllocatedStorage=50,
                            MasterUsername="owner", MasterUserPassword="not-ours-to-know")  # fmt: skip
    spec = {"adoptExternalId": existing, "managementPolicy": "ObserveOnly", "deletionPolicy": "Delete",
            "backupRetentionDays": 3}  # fmt: skip
    await client.create(INSTANCE, instance("legacy", namespace, db_class, **spec))
    async with operator(client, namespace):
        obj = await ready(client, namespace, "legacy")
        assert obj["status"]["externalId"] == existing
        assert condition(obj, "Synced")["reason"] == "ObserveOnly"
        await client.delete(INSTANCE, "legacy", namespace)
        await deleted(client, namespace, "legacy")
    writes = [call for call in rds.log.calls(instance=existing) if call.action != "DescribeDBInstances"]
    assert [call.action for call in writes] == ["CreateDBInstance"]  # the test's own create, nothing of the operator


async def test_an_adopted_database_under_manage_gets_the_spec_applied(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    existing = f"taken-{namespace}"[:63].rstrip("-")
    await asyncio.to_thread(rds.client(REGION).create_db_instance, DBInstanceIdentifier=existing,
                            DBInstanceClass="db.t3.micro", Engine="postgres", EngineVersion="16", AllocatedStorage=20,
                            MasterUsername="owner", MasterUserPassword="not-ours-to-know",
                            BackupRetentionPeriod=1)  # fmt: skip
    await client.create(INSTANCE, instance("taken", namespace, db_class, adoptExternalId=existing,
                                           backupRetentionDays=5))  # fmt: skip

    def adopted(obj: Obj) -> bool:
        last = (obj.get("status") or {}).get("lastOperation") or {}
        return last.get("fields") == ["backupRetentionDays"] and condition(obj, "Ready").get("status") == "True"

    async with operator(client, namespace):
        obj = await until(client, namespace, "taken", adopted)
    assert condition(obj, "Ready")["reason"] == "AvailableWithoutSecret"
    found = await asyncio.to_thread(rds.client(REGION).describe_db_instances, DBInstanceIdentifier=existing)
    assert found["DBInstances"][0]["BackupRetentionPeriod"] == 5
    assert rds.log.count("CreateDBInstance", instance=existing) == 1  # the test's own


async def test_a_hanging_provider_does_not_hold_up_another(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str
) -> None:
    held: list[asyncio.StreamWriter] = []

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # read the request, answer nothing: the SDK waits for its read timeout

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    dead = f"dead-{secrets.token_hex(4)}"
    await client.create(CLASS, {"metadata": {"name": dead}, "spec": {"provider": "aws", "aws": {
        "endpointUrl": f"http://127.0.0.1:{port}", "region": REGION, "account": dead,
        "credentialsSecret": {"name": "rds-credentials", "namespace": namespace}}}})  # fmt: skip
    try:
        for name in ("stuck0", "stuck1", "stuck2"):
            await client.create(INSTANCE, instance(name, namespace, dead))
        async with operator(client, namespace):

            async def hanging() -> bool:
                return len(held) >= 2

            await eventually(hanging, timeout=30)  # two calls hang now; the third instance is put off

            async def put_off() -> list[Obj]:  # whichever of the three came third
                found = [
                    await reason_is(client, namespace, f"stuck{i}", "Synced", "WaitingForAPIBudget") for i in range(3)
                ]
                return [obj for obj in found if obj is not None]

            waiting = await eventually(put_off, timeout=30)
            assert "under way" in condition(waiting[0], "Synced")["message"]
            assert len(held) == 2  # a provider that hangs holds two workers at most (the SDK's read timeout is 20 s)
            await client.create(INSTANCE, instance("fine", namespace, db_class))
            await ready(client, namespace, "fine", timeout=30)
            stuck = await client.get(INSTANCE, "stuck0", namespace)
            assert condition(stuck, "Ready").get("status") != "True"
            server.close()
            for writer in held:
                writer.close()
    finally:
        server.close()
        with contextlib.suppress(ApiError):
            await client.delete(CLASS, dead)


async def test_kanri_cloud_run_killed_mid_create_resumes_without_a_second_instance(
    client: Client, rds: RdsEmulator, namespace: str, db_class: str, control_plane: Endpoint
) -> None:
    """The real process (kanri cloud run), SIGKILLed as soon as the create is on record, then started again."""
    command = [sys.executable, "-m", "kanri.cli.main", "cloud", "run", "--kubeconfig", str(control_plane.kubeconfig),
               "--namespace", namespace, "--health-port", "0"]  # fmt: skip

    async def start() -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(*command, stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.DEVNULL)  # fmt: skip

    await client.create(INSTANCE, instance("killed", namespace, db_class))
    first = await start()
    try:

        def on_record(obj: Obj) -> bool:
            return bool((obj.get("status") or {}).get("operation"))

        await until(client, namespace, "killed", on_record, timeout=60)
    finally:
        first.kill()
        await first.wait()
    second = await start()
    try:
        obj = await ready(client, namespace, "killed", timeout=90)
    finally:
        second.terminate()
        await second.wait()
    identifier = naming.identifier(namespace, "killed")
    assert obj["status"]["lastOperation"]["outcome"] == "Succeeded"
    assert rds.log.count("CreateDBInstance", instance=identifier, outcome="ok") == 1, rds.log.calls(instance=identifier)
