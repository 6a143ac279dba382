"""The platform's priority-class list through the real API server (kanri run --allowed-priority-class): a cluster
naming a class outside it gets pods without it and Degraded=True PriorityClassNotAllowed; one naming an allowed class
gets it. No pods run: the StatefulSets are what is checked."""

from __future__ import annotations

from typing import Any

import pytest_asyncio

from kanri.local.controlplane import Endpoint
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import STATEFUL_SET
from tests.integration.test_postgres_reconciler import condition, pgc
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


async def pod_priority(client: Client, namespace: str, name: str) -> tuple[str | None] | None:
    """The priority class of the instance's pod template, once its StatefulSet exists (a tuple: None is an answer)."""
    items, _ = await client.list(STATEFUL_SET, namespace)
    found = [s for s in items if s["metadata"]["name"] == f"{name}-1"]
    return (found[0]["spec"]["template"]["spec"].get("priorityClassName"),) if found else None


async def test_a_priority_class_outside_the_platforms_list_is_left_out_and_said(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, pgc("greedy", namespace, replicas=1,
                                              podTemplate={"priorityClassName": "preempt-everyone"}))  # fmt: skip
    await client.create(POSTGRES_CLUSTER, pgc("modest", namespace, replicas=1,
                                              podTemplate={"priorityClassName": "database-high"}))  # fmt: skip
    operator = Operator(control_plane, namespace, allowed_priority_classes=("database-high", "database-normal"))
    async with operator.running(refresh=0.5):
        assert await eventually(lambda: pod_priority(client, namespace, "greedy"), timeout=30) == (None,)
        assert await eventually(lambda: pod_priority(client, namespace, "modest"), timeout=30) == ("database-high",)

        async def degraded() -> Obj | None:
            found = await condition(client, namespace, "greedy", "Degraded")
            return found if found is not None and found["reason"] == "PriorityClassNotAllowed" else None

        found = await eventually(degraded, timeout=30)
        assert found["status"] == "True"
        assert "'preempt-everyone'" in found["message"]
        assert "database-high, database-normal" in found["message"]
        modest = await condition(client, namespace, "modest", "Degraded")
        assert modest is None or modest["reason"] != "PriorityClassNotAllowed", modest
