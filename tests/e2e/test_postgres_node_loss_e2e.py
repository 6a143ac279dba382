"""A node that never comes back, end to end (issue 12): the documented removal of its instance, as a user does it.

Three local nodes, a two-instance cluster. The primary's node is powered off for good (the ``stop`` chaos verb): the
cluster fails over to the replica and runs on one instance. Once Kubernetes marks the node NotReady, the user does
what docs/postgres-operator.md ("Node loss") says: force-delete the pod that can never terminate and delete its
claim. Asserted: the operator makes a new empty claim, the instance clones from the new primary on the third node,
and the cluster is Ready with two instances again, every row written before and after the loss on both.
"""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.imagemap import default_image_map
from kanri.local.node import NodeHost, NodeOptions
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client, get_condition
from kanri.runtime.kinds import NODE, POD, PVC
from tests.e2e.postgres_helpers import cluster, every_instance_has, ready, write_row
from tests.local_node_support import running_nodes, with_test_network
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
NAME = "lost"
pytestmark = [pytest.mark.timeout(600), pytest.mark.faults]


@pytest_asyncio.fixture(loop_scope="session")
async def host(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[NodeHost]:
    options = with_test_network(
        NodeOptions(data_dir=tmp_path / "nodes", name=f"test-nl-{secrets.token_hex(3)}", images=default_image_map(),
                    restart_backoff_base=0.5, restart_backoff_max=5.0)
    )  # fmt: skip
    async with running_nodes(control_plane.kubeconfig, options, count=3) as nodes:
        yield nodes


async def node_of(client: Client, namespace: str, instance: str) -> str | None:
    try:
        pod = await client.get(POD, f"{instance}-0", namespace)
    except ApiError as exc:
        if exc.not_found:
            return None
        raise
    return (pod.get("spec") or {}).get("nodeName")


async def not_ready(client: Client, node: str) -> bool:
    found = get_condition(((await client.get(NODE, node)).get("status") or {}).get("conditions"), "Ready")
    return found is not None and found["status"] != "True"


async def test_an_instance_on_a_node_that_never_returns_is_removed_by_hand_and_replaced_on_another_node(
    client: Client, control_plane: Endpoint, host: NodeHost, namespace: str
) -> None:
    instances = HttpInstanceClient()
    operator = Operator(control_plane, namespace, instances=instances)
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 2))
    try:
        async with operator.running(refresh=2.0):
            found = await eventually(lambda: ready(client, namespace, NAME, 2), timeout=240, interval=1)
            await write_row(client, namespace, NAME, 1)
            await eventually(lambda: every_instance_has(client, namespace, NAME, [1]), timeout=60, interval=1)
            old = str(found["status"]["currentPrimary"])
            survivor = next(i for i in (f"{NAME}-1", f"{NAME}-2") if i != old)
            lost_node = await node_of(client, namespace, old)
            assert lost_node is not None
            used = {lost_node, await node_of(client, namespace, survivor)}

            assert await host.chaos("stop", lost_node)

            async def failed_over() -> Obj | None:
                status = (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}
                record = status.get("lastFailover") or {}
                return dict(record) if record.get("from") == old and not status.get("failover") else None

            await eventually(failed_over, timeout=120, interval=0.5)
            await write_row(client, namespace, NAME, 2)
            # the user notices the node is gone (Kubernetes says so), and removes the instance as documented
            await eventually(lambda: not_ready(client, lost_node), timeout=120, interval=1)
            old_claim = (await client.get(PVC, old, namespace))["metadata"]["uid"]
            await client.delete(POD, f"{old}-0", namespace, grace_period_seconds=0)
            await client.delete(PVC, old, namespace)

            async def replaced() -> str | None:
                where = await node_of(client, namespace, old)
                return where if where is not None and where != lost_node else None

            new_node = await eventually(replaced, timeout=120, interval=1)
            assert new_node not in used, (new_node, used)  # the third node: the survivor's is spread away from
            await eventually(lambda: ready(client, namespace, NAME, 2), timeout=240, interval=1)
            await eventually(lambda: every_instance_has(client, namespace, NAME, [1, 2]), timeout=60, interval=1)
            status = (await client.get(POSTGRES_CLUSTER, NAME, namespace))["status"]
            assert status["currentPrimary"] == survivor
            claim = await client.get(PVC, old, namespace)
            assert claim["metadata"]["uid"] != old_claim  # a new, empty claim, made by the operator
    finally:
        await instances.close()
        for node in host.nodes:
            await host.chaos("start", node.name)
