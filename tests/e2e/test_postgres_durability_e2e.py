"""``replication.dataDurability`` end to end (issue 29 item 5): two nodes, one instance on each, mode Sync with
``syncStandbys: 1`` (every replica of the cluster). The replica's node is stopped (its processes killed, so the
primary's WAL sender for it ends at once):

- under ``required`` (the default) a commit through ``-rw`` waits for the standby that is gone;
- switched to ``preferred``, that same waiting commit returns, new commits return at once, and the cluster says its
  durability is reduced (``Degraded``, reason ``DurabilityReduced``, and a Warning Event);
- once the node is back and the replica streams, the number goes back up: the primary's
  ``synchronous_standby_names`` names it again and the reason is gone.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.imagemap import default_image_map
from kanri.local.node import NodeHost, NodeOptions
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import EVENT, POD
from tests.e2e.postgres_helpers import cluster, cluster_ip, connect, credentials, pod_ips, ready_with_row
from tests.local_node_support import running_nodes, with_test_network
from tests.postgres_support import Operator
from tests.support import NotYet, eventually

Obj = dict[str, Any]
NAME = "dura"
HELD = 8.0
"""How long a commit must stay unanswered under ``required`` to count as waiting for the standby."""

pytestmark = [pytest.mark.timeout(600), pytest.mark.faults]


@pytest_asyncio.fixture(loop_scope="session")
async def host(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[NodeHost]:
    options = with_test_network(
        NodeOptions(
            data_dir=tmp_path / "nodes",
            name=f"test-dd-{secrets.token_hex(3)}",
            images=default_image_map(),
            restart_backoff_base=0.5,
            restart_backoff_max=5.0,
        )
    )
    async with running_nodes(control_plane.kubeconfig, options, count=2) as nodes:
        yield nodes


@pytest_asyncio.fixture(loop_scope="session")
async def operator(control_plane: Endpoint, namespace: str) -> AsyncIterator[Operator]:
    instances = HttpInstanceClient()
    try:
        yield Operator(control_plane, namespace, instances=instances)
    finally:
        await instances.close()


def one_per_node() -> Obj:
    term = {"labelSelector": {"matchLabels": {"kanri.dev/cluster": NAME}}, "topologyKey": "kubernetes.io/hostname"}
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


async def status_of(client: Client, namespace: str) -> Obj:
    return dict((await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {})


async def degraded_reason(client: Client, namespace: str) -> tuple[str | None, str]:
    condition = get_condition((await status_of(client, namespace)).get("conditions"), "Degraded") or {}
    reasons = str(condition.get("reason")) if condition.get("status") == "True" else None
    return reasons, str(condition.get("message") or "")


async def warnings(client: Client, namespace: str, reason: str) -> list[str]:
    items, _ = await client.list(EVENT, namespace)
    return [str(e.get("message")) for e in items
            if (e.get("involvedObject") or {}).get("name") == NAME and e.get("reason") == reason
            and e.get("type") == "Warning"]  # fmt: skip


async def insert(host: str, user: str, password: str, value: int) -> float:
    """Insert ``value`` through ``host`` (autocommit: the statement's commit waits for the synchronous standbys);
    the seconds it took."""
    started = time.monotonic()
    async with await connect(host, user, password) as conn:
        await conn.execute("INSERT INTO t VALUES (%s)", (value,))
    return time.monotonic() - started


async def primary_setting(client: Client, namespace: str, primary: str, user: str, password: str) -> str | None:
    """``synchronous_standby_names`` as the primary runs it (None while it cannot be asked)."""
    address = (await pod_ips(client, namespace, NAME)).get(f"{primary}-0")
    if address is None:
        return None
    try:
        async with await connect(address, user, password) as conn:
            row = await (await conn.execute("SHOW synchronous_standby_names")).fetchone()
            return None if row is None else str(row[0])
    except psycopg.Error:
        return None


async def test_preferred_durability_lets_writes_go_on_while_the_only_standby_is_gone_and_says_so(
    client: Client, host: NodeHost, operator: Operator, namespace: str
) -> None:
    spec = {"replication": {"mode": "Sync", "syncStandbys": 1}, "podTemplate": one_per_node()}
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 2, **spec))
    async with operator.running(refresh=2.0):
        await ready_with_row(client, namespace, NAME, 2)  # the row's commit needed the standby
        status = await status_of(client, namespace)
        primary = str(status["currentPrimary"])
        replica_pod = next(p for p in await pod_ips(client, namespace, NAME) if not p.startswith(f"{primary}-"))
        replica = replica_pod.removesuffix("-0")
        node = str((await client.get(POD, replica_pod, namespace))["spec"]["nodeName"])
        user, password = await credentials(client, namespace, NAME)
        rw = await cluster_ip(client, namespace, f"{NAME}-rw")
        assert await primary_setting(client, namespace, primary, user, password) == f'ANY 1 ("{replica}")'

        assert await host.chaos("stop", node)
        try:
            # required (the default): the commit waits for the standby that is gone
            waiting = asyncio.create_task(insert(rw, user, password, 2))
            done, _ = await asyncio.wait({waiting}, timeout=HELD)
            assert not done, f"under dataDurability required a commit returned with the only standby gone: {waiting}"

            switched = time.monotonic()
            await client.patch(POSTGRES_CLUSTER, NAME, {"spec": {"replication": {"dataDurability": "preferred"}}},
                               namespace)  # fmt: skip
            try:
                await asyncio.wait_for(asyncio.shield(waiting), timeout=60)
            except TimeoutError:
                setting = await primary_setting(client, namespace, primary, user, password)
                raise AssertionError(f"the waiting commit did not return within 60 s of dataDurability preferred; "
                                     f"the primary's synchronous_standby_names: {setting!r}; "
                                     f"status: {await status_of(client, namespace)}") from None  # fmt: skip
            print(f"\nthe waiting commit returned {time.monotonic() - switched:.1f} s after dataDurability: preferred")
            took = await asyncio.wait_for(insert(rw, user, password, 3), timeout=10)
            print(f"a new commit with the standby gone took {took:.3f} s")
            assert await primary_setting(client, namespace, primary, user, password) == ""

            async def told() -> tuple[str, list[str]] | None:
                reason, message = await degraded_reason(client, namespace)
                events = await warnings(client, namespace, "DurabilityReduced")
                return (message, events) if reason == "DurabilityReduced" and events else None

            try:
                message, events = await eventually(told, timeout=30, interval=1)
            except NotYet as exc:
                found = await degraded_reason(client, namespace)
                raise AssertionError(f"no DurabilityReduced: {exc}; Degraded {found}") from None
            assert "wait for 0 synchronous standby(s), not the 1" in message
            assert any("replicas streaming: none" in m for m in events), events
        finally:
            assert await host.chaos("start", node)

        # the replica streams again: the number goes back up and the reason goes away
        async def restored() -> str | None:
            setting = await primary_setting(client, namespace, primary, user, password)
            reason, _ = await degraded_reason(client, namespace)
            return setting if setting == f'ANY 1 ("{replica}")' and reason != "DurabilityReduced" else None

        try:
            await eventually(restored, timeout=180, interval=1)
        except NotYet as exc:
            setting = await primary_setting(client, namespace, primary, user, password)
            raise AssertionError(f"not restored: {exc}; the primary's synchronous_standby_names {setting!r}; "
                                 f"{await degraded_reason(client, namespace)}") from None  # fmt: skip
