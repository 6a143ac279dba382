"""How reconcile failures end, on the real API server: the runtime's own Ready=False condition after a permanent
failure goes away once reconciles succeed again (a reconciler's own never does), an object the API server refuses
as invalid is a terminal error with the server's message in status, and a repeated error is logged quietly."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
import structlog
from prometheus_client import CollectorRegistry

from examples.greeting.operator import GREETING, Greeting
from kanri.local import Endpoint
from kanri.runtime import (
    Client,
    Controller,
    ControllerOptions,
    Manager,
    ManagerOptions,
    PermanentError,
    Request,
    get_condition,
    install_crd,
    set_condition,
)
from kanri.runtime.kinds import CONFIG_MAP
from tests.support import eventually

Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def client(control_plane: Endpoint) -> AsyncIterator[Client]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as c:
        await install_crd(c, Greeting, field_manager="kanri-tests")
        yield c


def greeting(name: str, namespace: str, message: str) -> Obj:
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {"message": message}}


@contextlib.asynccontextmanager
async def running(client: Client, namespace: str, reconcile: Any) -> AsyncIterator[CollectorRegistry]:
    registry = CollectorRegistry()
    options = ManagerOptions(name="errors", namespace=namespace, leader_election=False, health_port=None)
    manager = Manager(client, options, registry=registry)
    manager.add(Controller("errors", reconcile, for_kind=GREETING, options=ControllerOptions(resync_period=0.3)))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        yield registry
    finally:
        await manager.stop()
        await asyncio.wait_for(task, 20)


async def ready_of(client: Client, namespace: str, name: str) -> Obj | None:
    obj = await client.get(GREETING, name, namespace)
    return get_condition((obj.get("status") or {}).get("conditions"), "Ready")


async def test_the_runtimes_permanent_error_condition_is_removed_after_the_next_successful_reconcile(
    client: Client, namespace: str
) -> None:
    async def reconcile(request: Request) -> None:
        obj = await client.get(GREETING, request.name, request.namespace)
        if obj["spec"]["message"] == "bad":
            raise PermanentError("MessageTooRude", "the message may not say 'bad'")

    await client.create(GREETING, greeting("rude", namespace, "bad"))
    async with running(client, namespace, reconcile):
        condition = await eventually(lambda: ready_of(client, namespace, "rude"), timeout=30)
        assert (condition["status"], condition["reason"], condition["observedGeneration"]) == (
            "False",
            "MessageTooRude",
            1,
        )

        await client.patch(GREETING, "rude", {"spec": {"message": "nice"}}, namespace)

        async def cleared() -> bool:
            return await ready_of(client, namespace, "rude") is None

        await eventually(cleared, timeout=30)


async def test_a_ready_condition_the_reconciler_wrote_is_never_removed_by_the_runtime(
    client: Client, namespace: str
) -> None:
    async def reconcile(request: Request) -> None:
        obj = await client.get(GREETING, request.name, request.namespace)
        if obj["spec"]["message"] == "bad":
            raise PermanentError("MessageTooRude", "the message may not say 'bad'")
        conditions = [dict(c) for c in (obj.get("status") or {}).get("conditions") or ()]
        generation = obj["metadata"]["generation"]
        if set_condition(conditions, type="Ready", status=False, reason="Waiting", message="not yet",
                         observed_generation=generation):  # fmt: skip
            await client.patch_status(GREETING, request.name, {"status": {"conditions": conditions}}, request.namespace)

    await client.create(GREETING, greeting("mine", namespace, "bad"))
    async with running(client, namespace, reconcile):
        await eventually(lambda: ready_of(client, namespace, "mine"), timeout=30)
        await client.patch(GREETING, "mine", {"spec": {"message": "nice"}}, namespace)

        async def waiting() -> Obj | None:
            condition = await ready_of(client, namespace, "mine")
            return condition if condition is not None and condition["reason"] == "Waiting" else None

        await eventually(waiting, timeout=30)
        await asyncio.sleep(1.5)  # several successful resyncs
        condition = await ready_of(client, namespace, "mine")
        assert condition is not None
        assert (condition["status"], condition["reason"]) == ("False", "Waiting")


async def test_a_child_the_api_server_refuses_as_invalid_is_terminal_with_the_servers_message_in_status(
    client: Client, namespace: str
) -> None:
    calls: list[str] = []

    async def reconcile(request: Request) -> None:
        obj = await client.get(GREETING, request.name, request.namespace)
        calls.append(obj["spec"]["message"])
        child = {"metadata": {"name": request.name, "namespace": request.namespace},
                 "data": {obj["spec"]["message"]: "x"}}  # fmt: skip
        await client.apply(CONFIG_MAP, child, field_manager="kanri-tests")

    await client.create(GREETING, greeting("invalid", namespace, "not a key!"))
    async with running(client, namespace, reconcile) as registry:
        condition = await eventually(lambda: ready_of(client, namespace, "invalid"), timeout=30)
        assert (condition["status"], condition["reason"]) == ("False", "Invalid")
        assert "not a key!" in condition["message"]
        assert "a valid config key" in condition["message"]
        await asyncio.sleep(1.5)  # several resyncs: no retry at this generation
        assert calls == ["not a key!"]
        terminal = registry.get_sample_value(
            "controller_runtime_terminal_reconcile_errors_total", {"controller": "errors"}
        )
        assert terminal == 1

        await client.patch(GREETING, "invalid", {"spec": {"message": "key"}}, namespace)

        async def cleared() -> bool:
            return await ready_of(client, namespace, "invalid") is None

        await eventually(cleared, timeout=30)
        assert (await client.get(CONFIG_MAP, "invalid", namespace))["data"] == {"key": "x"}


async def test_a_repeated_error_logs_its_traceback_once_then_a_count(client: Client, namespace: str) -> None:
    failures = 9

    async def reconcile(request: Request) -> None:
        nonlocal failures
        if failures:
            failures -= 1
            raise RuntimeError("the backend is down")

    await client.create(GREETING, greeting("flaky", namespace, "hi"))
    with structlog.testing.capture_logs() as logs:
        async with running(client, namespace, reconcile):
            await eventually(lambda: asyncio.sleep(0, failures == 0), timeout=30)
            await eventually(lambda: asyncio.sleep(0, any(e["event"].startswith("reconcile succeeded") for e in logs)))
    first = [e for e in logs if e["event"] == "reconcile failed; retrying"]
    repeats = [e for e in logs if e["event"] == "reconcile failed again with the same error; retrying"]
    assert len(first) == 1
    assert first[0].get("exc_info")
    assert [e["repeats"] for e in repeats] == [2, 4, 8]
    assert all("exc_info" not in e for e in repeats)
    (recovered,) = [e for e in logs if e["event"] == "reconcile succeeded after failing"]
    assert recovered["failures"] == 9
