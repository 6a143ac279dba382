"""The cloud operator's aws provider on the real API server against the RDS emulator (tests/rds_emulator: moto
behind a proxy with RDS's state transitions, throttling, storage and final-snapshot rules, and a call log)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from kanri.cloud import naming
from kanri.cloud.api import CLASS, INSTANCE, DatabaseClass, DatabaseInstance
from kanri.cloud.budget import Budgets
from kanri.cloud.reconciler import controller
from kanri.local import Endpoint
from kanri.runtime import ApiError, Client, Manager, ManagerOptions, get_condition, install_crd
from kanri.runtime.kinds import SECRET
from tests.rds_emulator import Delays, RdsEmulator
from tests.support import eventually

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
async def operator(client: Client, namespace: str) -> AsyncIterator[CollectorRegistry]:
    registry = CollectorRegistry()
    options = ManagerOptions(name="kanri-cloud-operator", namespace=namespace, leader_election=False,
                             health_port=0, graceful_shutdown_timeout=10)  # fmt: skip
    manager = Manager(client, options, registry=registry)
    manager.add(controller(manager, registry=registry, budgets=Budgets(), poll_scale=0.1))
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


async def ready(client: Client, namespace: str, name: str) -> Obj:
    async def check() -> Obj | None:
        obj = await client.get(INSTANCE, name, namespace)
        current = (obj.get("status") or {}).get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and condition(obj, "Ready").get("status") == "True" else None

    return await eventually(check, timeout=60)


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
        before = rds.log.count(instance=identifier)
        for value in range(3):
            await client.patch(INSTANCE, "orders", {"metadata": {"annotations": {"look": str(value)}}}, namespace)
            await asyncio.sleep(0.5)

        async def looked() -> bool:
            return rds.log.count(instance=identifier) >= before + 3

        await eventually(looked, timeout=30)
    assert rds.log.count("CreateDBInstance", instance=identifier) == 1
    assert rds.log.count("ModifyDBInstance", instance=identifier) == 0
    after = {call.action for call in rds.log.calls(instance=identifier)[-3:]}
    assert after == {"DescribeDBInstances"}, after
