"""Node maintenance (issue 29 item 10), against the real API server and StatefulSet controller: a primary whose node
is cordoned is switched over to the replica on the other node by the operator itself, with an Event; a
single-instance cluster's pod is held by a PodDisruptionBudget unless its maintenance window allows the downtime.

The instance managers are the failover tests' fakes at the HTTP boundary (they demote and promote as the real one
does); a stand-in kubelet binds each pod to its Node object (nothing runs on them) and reports it Running and Ready
at its fake's address.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio

from kanri.local.controlplane import Endpoint
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import EVENT, NODE, POD, POD_DISRUPTION_BUDGET
from tests.integration.test_postgres_failover import status_of
from tests.integration.test_postgres_primary_update import UpdateFake, fakes_for, running
from tests.integration.test_postgres_primary_update import kubelet as stand_in_kubelet
from tests.integration.test_postgres_reconciler import pgc
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import NotYet, eventually

Obj = dict[str, Any]
TOLERATE_ALL = [{"operator": "Exists"}]  # the Nodes have no kubelet: their taints must never evict the test's pods


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


@pytest_asyncio.fixture(loop_scope="session")
async def nodes(client: Client) -> AsyncIterator[list[str]]:
    """Two Node objects, one per instance (tainted, so no other test's pod is scheduled onto them)."""
    names = [f"maint-{secrets.token_hex(3)}-{n}" for n in (1, 2)]
    taint = {"key": "kanri.dev/test-only", "effect": "NoSchedule"}
    for name in names:
        await client.create(NODE, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
                                   "spec": {"taints": [taint]}})  # fmt: skip
    try:
        yield names
    finally:
        for name in names:
            with contextlib.suppress(ApiError):
                await client.delete(NODE, name)


async def kubelet(client: Client, namespace: str, fakes: dict[str, UpdateFake], nodes: dict[str, str]) -> None:
    """Each instance's pod bound to its node and Running and Ready at its fake's address."""
    while True:
        with contextlib.suppress(Exception):  # a refused or failed write is tried again on the next round
            pods, _ = await client.list(POD, namespace)
            for pod in pods:
                name = pod["metadata"]["name"]
                instance = name.removesuffix("-0")
                if instance not in fakes or pod["metadata"].get("deletionTimestamp"):
                    continue
                if not pod["spec"].get("nodeName"):
                    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                               "target": {"apiVersion": "v1", "kind": "Node", "name": nodes[instance]}}  # fmt: skip
                    await client.create_subresource(POD, name, "binding", binding, namespace)
                if (pod.get("status") or {}).get("podIP") != fakes[instance].address:
                    await client.patch_status(POD, name, {"status": running(fakes[instance].address)}, namespace)
        await asyncio.sleep(0.2)


async def wait_phase(client: Client, namespace: str, name: str, phase: str, timeout: float = 60) -> None:
    """Until the cluster's phase is ``phase``; a timeout names the last status seen."""

    async def reached() -> bool:
        return (await status_of(client, namespace, name)).get("phase") == phase

    try:
        await eventually(reached, timeout=timeout)
    except NotYet as exc:
        raise AssertionError(f"{exc}; last status: {await status_of(client, namespace, name)}") from None


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _events(client: Client, namespace: str, name: str) -> list[Obj]:
    items, _ = await client.list(EVENT, namespace)
    return [e for e in items if e["involvedObject"]["name"] == name]


async def test_a_primary_on_a_cordoned_node_is_switched_over_first(
    control_plane: Endpoint, client: Client, namespace: str, nodes: list[str]
) -> None:
    name = "drain"
    async with fakes_for(name, 2) as (fakes, instances):
        placement = {f"{name}-1": nodes[0], f"{name}-2": nodes[1]}
        spec = {"podTemplate": {"tolerations": TOLERATE_ALL}}
        await client.create(POSTGRES_CLUSTER, pgc(name, namespace, replicas=2, **spec))
        pods = asyncio.create_task(kubelet(client, namespace, fakes, placement))
        try:
            async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):
                await wait_phase(client, namespace, name, "Ready")
                assert (await status_of(client, namespace, name))["currentPrimary"] == f"{name}-1"
                # kubectl drain begins with a cordon: the primary's node takes no new pods
                await client.patch(NODE, nodes[0], {"spec": {"unschedulable": True}})

                async def demoted() -> bool:
                    return "/demote" in fakes[f"{name}-1"].asked

                await eventually(demoted, timeout=60)
                progress = (await status_of(client, namespace, name))["failover"]
                assert (progress["reason"], progress["target"]) == ("NodeMaintenance", f"{name}-2")
                # the replica receives the old primary's shutdown checkpoint, as a streaming one would
                fakes[f"{name}-2"].report.update(receiveLsn="0/3000128", replayLsn="0/3000128")

                async def switched() -> Obj | None:
                    status = await status_of(client, namespace, name)
                    last = status.get("lastFailover") or {}
                    done = status.get("currentPrimary") == f"{name}-2" and last.get("reason") == "NodeMaintenance"
                    return status if done else None

                status = await eventually(switched, timeout=60)
                assert status["lastFailover"]["from"] == f"{name}-1"
                started = [e for e in await _events(client, namespace, name) if e["reason"] == "SwitchoverStarted"]
                assert any("node is cordoned" in e["message"] for e in started), started
                await wait_phase(client, namespace, name, "Ready")
                # the new primary's node is schedulable: it stays the primary (one maintenance switchover only)
                assert (await status_of(client, namespace, name))["currentPrimary"] == f"{name}-2"
                assert [e["reason"] for e in await _events(client, namespace, name)].count("SwitchoverStarted") == 1
        finally:
            pods.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pods


async def test_a_single_instance_is_held_from_a_drain_unless_its_maintenance_window_allows_it(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    async def budgets() -> list[str]:
        items, _ = await client.list(POD_DISRUPTION_BUDGET, namespace)
        return sorted(b["metadata"]["name"] for b in items)

    async def are(expected: list[str]) -> bool:
        return await budgets() == expected

    async with contextlib.AsyncExitStack() as stack:
        fakes, instances = await stack.enter_async_context(fakes_for("alone", 1))
        await client.create(POSTGRES_CLUSTER, pgc("alone", namespace, replicas=1))
        pods = asyncio.create_task(stand_in_kubelet(client, namespace, fakes))
        stack.push_async_callback(_stop, pods)
        await stack.enter_async_context(Operator(control_plane, namespace, instances=instances).running(refresh=0.5))
        # once its primary served (a pod that never did loses nothing to a drain)
        await eventually(lambda: are(["alone-primary"]), timeout=30)
        budget = await client.get(POD_DISRUPTION_BUDGET, "alone-primary", namespace)
        assert budget["spec"]["minAvailable"] == 1  # the only pod: no eviction at all
        await client.patch(POSTGRES_CLUSTER, "alone", {"spec": {"nodeMaintenanceWindow": {"inProgress": True}}},
                           namespace)  # fmt: skip
        await eventually(lambda: are([]), timeout=30)
        await client.patch(POSTGRES_CLUSTER, "alone", {"spec": {"nodeMaintenanceWindow": None}}, namespace)
        await eventually(lambda: are(["alone-primary"]), timeout=30)
