"""The runtime end to end on the real API server, driving the Greeting example operator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from examples.greeting.operator import GREETING, Greeting, GreetingReconciler
from kanri.local import Endpoint
from kanri.runtime import (
    ApiError,
    Client,
    ClientMetrics,
    Controller,
    ControllerOptions,
    Manager,
    ManagerOptions,
    Request,
    crd_for,
    owner_reference,
)
from kanri.runtime.kinds import CONFIG_MAP, CRD
from tests.support import eventually

WRITES = ("POST", "PUT", "PATCH", "DELETE")
ROOT = Path(__file__).resolve().parents[2]


@pytest_asyncio.fixture(loop_scope="session")
async def client(control_plane: Endpoint) -> AsyncIterator[Client]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as c:
        await c.apply(CRD, crd_for(Greeting), field_manager="kanri-tests")

        async def established() -> bool:
            crd = await c.get(CRD, Greeting.resource.crd_name)
            conditions = (crd.get("status") or {}).get("conditions") or ()  # null until the server has looked at it
            return any(x["type"] == "Established" and x["status"] == "True" for x in conditions)

        await eventually(established, timeout=30)
        yield c


def greeting(name: str, namespace: str, message: str) -> dict[str, Any]:
    return {"apiVersion": GREETING.api_version, "kind": "Greeting",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"message": message}}  # fmt: skip


def new_manager(
    client: Client, namespace: str, *, leader_election: bool, name: str = "greetings", resync: float | None = None
) -> tuple[Manager, CollectorRegistry]:
    registry = CollectorRegistry()
    options = ManagerOptions(
        name=name,
        namespace=namespace,
        leader_election=leader_election,
        leader_election_namespace=namespace,
        lease_duration=4.0,
        renew_deadline=3.0,
        retry_period=0.5,
        health_port=0,
        graceful_shutdown_timeout=10,
    )
    manager = Manager(client, options, registry=registry)
    controller = Controller(
        "greeting", GreetingReconciler(manager), for_kind=GREETING, options=ControllerOptions(resync_period=resync)
    )
    manager.add(controller.owns(CONFIG_MAP))
    return manager, registry


@contextlib.asynccontextmanager
async def running(manager: Manager) -> AsyncIterator[asyncio.Task[None]]:
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        yield task
    finally:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


async def converged(client: Client, namespace: str, names: list[str]) -> bool:
    """Every greeting has its ConfigMap with its message and a Ready=True status for its current generation."""
    greetings, _ = await client.list(GREETING, namespace)
    maps = {m["metadata"]["name"]: m for m in (await client.list(CONFIG_MAP, namespace))[0]}
    by_name = {g["metadata"]["name"]: g for g in greetings}
    for name in names:
        g = by_name.get(name)
        cm = maps.get(f"{name}-greeting")
        if g is None or cm is None or cm.get("data") != {"message": g["spec"]["message"]}:
            return False
        status = g.get("status") or {}
        ready = [c for c in status.get("conditions", []) if c["type"] == "Ready" and c["status"] == "True"]
        if status.get("observedGeneration") != g["metadata"]["generation"] or not ready:
            return False
    return True


def sample(registry: CollectorRegistry, metric: str, **labels: str) -> float:
    return registry.get_sample_value(metric, labels) or 0.0


async def test_operator_converges_follows_changes_and_owns_its_children(client: Client, namespace: str) -> None:
    names = [f"hello-{i}" for i in range(5)]
    for name in names:
        await client.create(GREETING, greeting(name, namespace, f"hi from {name}"))
    manager, registry = new_manager(client, namespace, leader_election=False)
    async with running(manager):
        await eventually(lambda: converged(client, namespace, names), timeout=60)

        await client.patch(GREETING, "hello-0", {"spec": {"message": "changed"}}, namespace)
        await eventually(lambda: converged(client, namespace, names), timeout=30)
        assert (await client.get(CONFIG_MAP, "hello-0-greeting", namespace))["data"] == {"message": "changed"}

        # Someone edits the child: the owns() watch brings the primary back and the reconciler repairs it.
        await client.patch(CONFIG_MAP, "hello-1-greeting", {"data": {"message": "tampered"}}, namespace)
        await eventually(lambda: converged(client, namespace, names), timeout=30)

        cm = await client.get(CONFIG_MAP, "hello-2-greeting", namespace)
        (owner,) = cm["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["controller"]) == ("Greeting", "hello-2", True)
    assert sample(registry, "controller_runtime_reconcile_total", controller="greeting", result="success") >= 7
    assert sample(registry, "controller_runtime_reconcile_errors_total", controller="greeting") == 0


async def test_converged_objects_cost_zero_writes_on_resync(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    names = [f"quiet-{i}" for i in range(5)]
    for name in names:
        await client.create(GREETING, greeting(name, namespace, "steady"))
    registry = CollectorRegistry()
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig), metrics=ClientMetrics(registry)) as own:
        manager, controller_registry = new_manager(own, namespace, leader_election=False, resync=1.0)
        async with running(manager):
            await eventually(lambda: converged(client, namespace, names), timeout=60)
            await asyncio.sleep(1.5)  # let the reconciles that status writes triggered settle

            def writes() -> float:
                return sum(sample(registry, "rest_client_requests_total", code=c, method=m, host=host)
                           for m in WRITES for c in ("200", "201"))  # fmt: skip

            host = own.host.split("://", 1)[1]
            reconciles = sample(controller_registry, "controller_runtime_reconcile_total", controller="greeting",
                                result="success")  # fmt: skip
            before = writes()
            await asyncio.sleep(3.5)  # at least two resync periods (1 s +-10%)
            after_reconciles = sample(controller_registry, "controller_runtime_reconcile_total",
                                      controller="greeting", result="success")  # fmt: skip
    assert after_reconciles - reconciles >= 2 * len(names), "resyncs must have reconciled every object again"
    assert writes() == before, "a reconcile of a converged object must not write"


async def test_two_managers_exactly_one_reconciles_and_hands_over_on_stop(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    await client.create(GREETING, greeting("first", namespace, "one"))
    first, first_metrics = new_manager(client, namespace, leader_election=True, name="ha")
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as other_client:
        second, second_metrics = new_manager(other_client, namespace, leader_election=True, name="ha")
        async with running(first):
            await eventually(lambda: converged(client, namespace, ["first"]), timeout=30)
            async with running(second):
                await asyncio.sleep(2)
                await client.create(GREETING, greeting("second", namespace, "two"))
                await eventually(lambda: converged(client, namespace, ["first", "second"]), timeout=30)
                leaders = [
                    sample(r, "leader_election_master_status", name="ha") for r in (first_metrics, second_metrics)
                ]
                assert leaders == [1.0, 0.0]
                assert sample(second_metrics, "controller_runtime_reconcile_total", controller="greeting",
                              result="success") == 0, "the standby must not reconcile"  # fmt: skip

                first.stop()  # clean stop releases the lease: the standby takes over without waiting for expiry
                await eventually(lambda: asyncio.sleep(0, sample(second_metrics, "leader_election_master_status",
                                                                  name="ha") == 1.0), timeout=3)  # fmt: skip
                await client.create(GREETING, greeting("third", namespace, "three"))
                await eventually(lambda: converged(client, namespace, ["first", "second", "third"]), timeout=30)
    assert sample(second_metrics, "controller_runtime_reconcile_total", controller="greeting", result="success") > 0


async def test_operator_killed_mid_work_is_replaced_without_duplicate_children(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    names = [f"bulk-{i}" for i in range(40)]
    await asyncio.gather(*(client.create(GREETING, greeting(n, namespace, f"m-{n}")) for n in names))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "examples.greeting.operator", "--kubeconfig", str(control_plane.kubeconfig),
        "--health-port", "0", cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:

        async def some_progress() -> int | None:
            maps = [
                m for m in (await client.list(CONFIG_MAP, namespace))[0] if m["metadata"]["name"].startswith("bulk")
            ]
            return len(maps) if maps else None

        done_before_kill = await eventually(some_progress, timeout=60, interval=0.05)
        process.send_signal(signal.SIGKILL)  # no graceful stop, no lease release
        await asyncio.wait_for(process.wait(), 10)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert done_before_kill < len(names), "the kill must land mid-work for this test to mean anything"

    # The successor uses the same Lease (the example's defaults: namespace default, 15 s lease) and must wait for it.
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as successor_client:
        registry = CollectorRegistry()
        successor = Manager(
            successor_client, ManagerOptions(name="greeting-operator", health_port=0), registry=registry
        )
        successor.add(Controller("greeting", GreetingReconciler(successor), for_kind=GREETING).owns(CONFIG_MAP))
        async with running(successor):
            await eventually(lambda: converged(client, namespace, names), timeout=90)
    maps = [m for m in (await client.list(CONFIG_MAP, namespace))[0] if m["metadata"]["name"].startswith("bulk")]
    assert sorted(m["metadata"]["name"] for m in maps) == sorted(f"{n}-greeting" for n in names)
    for cm in maps:
        assert len(cm["metadata"]["ownerReferences"]) == 1


async def test_permanent_error_reaches_status_and_is_not_retried(client: Client, namespace: str) -> None:
    from kanri.runtime import PermanentError

    calls: list[Request] = []

    async def refuse(request: Request) -> None:
        calls.append(request)
        raise PermanentError("MessageTooRude", "the message may not say 'bad'")

    await client.create(GREETING, greeting("rude", namespace, "bad"))
    registry = CollectorRegistry()
    manager = Manager(client, ManagerOptions(name="rude", namespace=namespace, leader_election=False, health_port=0),
                      registry=registry)  # fmt: skip
    manager.add(Controller("refuser", refuse, for_kind=GREETING, options=ControllerOptions(resync_period=0.5)))
    async with running(manager):

        async def reported() -> dict[str, Any] | None:
            g = await client.get(GREETING, "rude", namespace)
            conditions = (g.get("status") or {}).get("conditions", [])
            return next((c for c in conditions if c["type"] == "Ready"), None)

        condition = await eventually(reported, timeout=30)
        assert (condition["status"], condition["reason"]) == ("False", "MessageTooRude")
        await asyncio.sleep(2)  # several resyncs: still no retry at this generation
        assert len(calls) == 1
        await client.patch(GREETING, "rude", {"spec": {"message": "nice"}}, namespace)
        await eventually(lambda: asyncio.sleep(0, len(calls) == 2), timeout=30)
    assert sample(registry, "controller_runtime_terminal_reconcile_errors_total", controller="refuser") == 2


async def test_client_surfaces_api_errors_with_the_servers_message(client: Client, namespace: str) -> None:
    with pytest.raises(ApiError) as missing:
        await client.get(GREETING, "nobody", namespace)
    assert missing.value.not_found
    with pytest.raises(ApiError) as invalid:
        await client.create(GREETING, {"metadata": {"name": "x", "namespace": namespace}, "spec": {}})
    assert invalid.value.status == 422
    assert "spec.message: Required value" in invalid.value.message


# --- the event-filtering rule (kanri.runtime._echo): our own writes' events queue nothing, anyone else's always do --


async def test_a_reconciles_own_writes_queue_no_further_reconcile(client: Client, namespace: str) -> None:
    names = [f"echo-{i}" for i in range(5)]
    for name in names:
        await client.create(GREETING, greeting(name, namespace, "once"))
    manager, registry = new_manager(client, namespace, leader_election=False)
    async with running(manager):
        await eventually(lambda: converged(client, namespace, names), timeout=60)
        await asyncio.sleep(1.5)  # the ConfigMap ADDED and status MODIFIED events of every write have arrived
        # One reconcile per Greeting, from the initial list: its child's creation and its own status write, each
        # reported by a watch event, queued nothing.
        assert sample(registry, "controller_runtime_reconcile_total", controller="greeting", result="success") == 5

        # Metadata only (no generation change) by someone else: still a change, so the key is queued.
        await client.patch(GREETING, "echo-0", {"metadata": {"labels": {"team": "blue"}}}, namespace)

        async def reconciled_again() -> bool:
            total = sample(registry, "controller_runtime_reconcile_total", controller="greeting", result="success")
            return total == 6

        await eventually(reconciled_again, timeout=30)
    assert manager.controllers[0]._echoes._running == {}


class Observer:
    """Records the child's ``touch`` label as the cache shows it, dawdles a little (other writers' changes land
    meanwhile), then applies the child whether or not it differs: a no-op write most of the time."""

    def __init__(self, manager: Manager) -> None:
        self.cache, self.client = manager.cache, manager.client
        self.seen: dict[str, str | None] = {}

    async def reconcile(self, request: Request) -> None:
        greeting = self.cache.get(GREETING, request.name, request.namespace)
        if greeting is None:
            return
        child = self.cache.get(CONFIG_MAP, f"{request.name}-greeting", request.namespace)
        self.seen[request.name] = ((child or {}).get("metadata", {}).get("labels") or {}).get("touch")
        desired = {"metadata": {"name": f"{request.name}-greeting", "namespace": request.namespace,
                                "ownerReferences": [owner_reference(greeting)]},
                   "data": {"message": greeting["spec"]["message"]}}  # fmt: skip
        await asyncio.sleep(0.02)  # another writer changes the child meanwhile; our apply then returns its version
        await self.client.apply(CONFIG_MAP, desired, field_manager="observer")


async def test_every_change_by_someone_else_is_seen_even_when_our_no_op_write_returned_it(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    # Our reconciler's apply changes nothing and so returns the child as another writer just left it: the same
    # resourceVersion as that writer's event. Taking the version alone for proof of our own write would swallow
    # the event and leave the reconciler with a stale view; the rule must see the other writer's field.
    await client.create(GREETING, greeting("watched", namespace, "steady"))
    manager = Manager(client, ManagerOptions(name="observer", namespace=namespace, leader_election=False,
                                             health_port=0))  # fmt: skip
    observer = Observer(manager)
    controller = Controller("observer", observer, for_kind=GREETING, options=ControllerOptions(resync_period=None))
    manager.add(controller.owns(CONFIG_MAP))
    async with running(manager):
        await eventually(lambda: asyncio.sleep(0, "watched" in observer.seen), timeout=30)
        async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as other:
            for touch in range(1, 31):
                # Each change lands while the reconcile its predecessor queued is dawdling (our no-op apply then
                # returns this change's version), or just before or after it.
                await asyncio.sleep(0.004 * (touch % 6))
                await other.patch(CONFIG_MAP, "watched-greeting", {"metadata": {"labels": {"touch": str(touch)}}},
                                  namespace)  # fmt: skip
        await eventually(lambda: asyncio.sleep(0, observer.seen.get("watched") == "30"), timeout=30)


async def test_runnables_run_only_while_leading_and_are_cancelled_once_the_controllers_stopped(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    events: list[str] = []

    def owner(name: str) -> Any:
        async def run() -> None:
            events.append(f"{name} started")
            try:
                await asyncio.Event().wait()
            finally:
                events.append(f"{name} cancelled")

        return run

    async def broken() -> None:
        raise RuntimeError("a runnable's own failure ends only itself")

    await client.create(GREETING, greeting("first", namespace, "one"))
    first, _ = new_manager(client, namespace, leader_election=True, name="jobs")
    first.add_runnable("jobs", owner("first"))
    first.add_runnable("broken", broken)
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as other_client:
        second, _ = new_manager(other_client, namespace, leader_election=True, name="jobs")
        second.add_runnable("jobs", owner("second"))
        async with running(first) as first_task:
            await eventually(lambda: converged(client, namespace, ["first"]), timeout=30)
            assert events == ["first started"]
            async with running(second):
                await eventually(lambda: asyncio.sleep(0, second.ready()), timeout=30)
                assert "second started" not in events, "a standby's runnable must not run"
                await client.create(GREETING, greeting("second", namespace, "two"))  # the broken one changed nothing
                await eventually(lambda: converged(client, namespace, ["first", "second"]), timeout=30)
                first.stop()
                await asyncio.wait_for(first_task, 20)
                assert "first cancelled" in events, events
                await eventually(lambda: asyncio.sleep(0, "second started" in events), timeout=30)
            assert events[-1] == "second cancelled", events
