"""Rolling updates by switchover under a write load, end to end (issue 12 item 6, issue 14 item 2).

Two instances on one local node, real PostgreSQL, a :class:`Ledger` writing through ``-rw``. A pod-template change
(``spec.resources``; ``spec.imageName`` to another minor release, a minor update) rolls the replica, switches over to
it, then rolls the old primary as a replica. Asserted: that order, no acknowledged commit lost, the cluster Ready on
the new primary behind ``-rw``, and for the minor update every instance's server on the new release. The write
outage (the longest gap between two acknowledged commits) is printed, not asserted (``bench/minor_update.py``
measures it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from kanri.local.node import LocalNode
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import STATEFUL_SET
from tests.e2e.ledger import Ledger, ids_on
from tests.e2e.postgres_helpers import cluster, cluster_ip, connect, credentials, pod_ips, ready
from tests.postgres_support import Operator
from tests.support import eventually

pytestmark = [pytest.mark.timeout(400), pytest.mark.faults]  # a switchover: SwitchoverStarted, no FailoverStarted

Updated = Callable[[str], Awaitable[bool]]
"""Whether an instance (by name) has the change."""


async def cpu_of(client: Client, namespace: str, instance: str) -> str | None:
    sts = await client.get(STATEFUL_SET, instance, namespace)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    return ((container.get("resources") or {}).get("requests") or {}).get("cpu")


async def server_version(host: str, user: str, password: str) -> str | None:
    """The release the server at ``host`` runs (``SHOW server_version``: 17.11), None while it does not answer."""
    try:
        async with await connect(host, user, password) as conn:
            row = await (await conn.execute("SHOW server_version")).fetchone()
            return str(row[0]) if row else None
    except (psycopg.Error, OSError):  # a restarting server is not an answer yet
        return None


@dataclass
class Rollout:
    old: str
    """The primary before the change."""
    other: str
    """The replica, which is updated first and becomes the primary."""
    record: dict[str, Any]
    """status.lastFailover of the switchover."""
    ledger: Ledger
    user: str
    password: str


async def roll_under_load(
    client: Client, namespace: str, name: str, change: dict[str, Any], updated: Updated
) -> Rollout:
    """Patch ``change`` into the spec of the Ready two-instance cluster ``name`` while a ledger writes, and wait until
    the replica was updated, the role handed to it, and the old primary updated and Ready again."""
    user, password = await credentials(client, namespace, name)
    rw = await cluster_ip(client, namespace, f"{name}-rw")
    old = str((await client.get(POSTGRES_CLUSTER, name, namespace))["status"]["currentPrimary"])
    other = next(i for i in (f"{name}-1", f"{name}-2") if i != old)
    ledger = Ledger(rw, user, password)
    await ledger.prepare()
    writing = asyncio.create_task(ledger.run())
    try:
        await eventually(lambda: asyncio.sleep(0, len(ledger.acks) >= 20 or None), timeout=30)
        await client.patch(POSTGRES_CLUSTER, name, {"spec": change}, namespace)

        async def switched() -> dict[str, Any] | None:
            status = (await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {}
            record = status.get("lastFailover") or {}
            return dict(record) if record.get("reason") == "RollingUpdate" and not status.get("failover") else None

        record = await eventually(switched, timeout=180, interval=0.5)
        # The old primary is rolled only after it handed its role over, to a replica that already has the change.
        assert (record["from"], record["to"]) == (old, other)
        assert await updated(other)

        async def rolled() -> bool:
            return await updated(old) and await ready(client, namespace, name, 2) is not None

        await eventually(rolled, timeout=180, interval=1)
        count = len(ledger.acks)
        await eventually(lambda: asyncio.sleep(0, len(ledger.acks) > count + 10 or None), timeout=30)
    finally:
        ledger.stop()
        with contextlib.suppress(Exception):
            await writing
    return Rollout(old, other, record, ledger, user, password)


async def nothing_lost_and_rw_on_the_new_primary(client: Client, namespace: str, name: str, rollout: Rollout) -> None:
    ledger = rollout.ledger
    status = (await client.get(POSTGRES_CLUSTER, name, namespace))["status"]
    assert status["currentPrimary"] == rollout.other
    ips = await pod_ips(client, namespace, name)
    present = await ids_on(await cluster_ip(client, namespace, f"{name}-rw"), rollout.user, rollout.password)
    assert present is not None
    assert ledger.acked_ids() - present == set()  # no acknowledged commit lost
    assert ledger.acks[-1].server == ips[f"{rollout.other}-0"]  # -rw serves the new primary
    assert ledger.servers_overlap() == []


def longest_gap(ledger: Ledger) -> float:
    return max(b.at - a.at for a, b in zip(ledger.acks, ledger.acks[1:], strict=False))


async def test_a_resources_change_rolls_the_replica_switches_over_and_rolls_the_old_primary_under_load(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    name = "roll"
    await client.create(POSTGRES_CLUSTER, cluster(name, namespace, 2))
    async with operator.running(refresh=10.0):
        await eventually(lambda: ready(client, namespace, name, 2), timeout=240, interval=1)

        async def has_the_cpu(instance: str) -> bool:
            return await cpu_of(client, namespace, instance) == "120m"

        rollout = await roll_under_load(
            client, namespace, name, {"resources": {"requests": {"cpu": "120m"}}}, has_the_cpu
        )
        print(f"\nrolling update by switchover: longest write gap {longest_gap(rollout.ledger):.2f} s over "
              f"{len(rollout.ledger.acks)} commits; lastFailover {rollout.record}")  # fmt: skip
        await nothing_lost_and_rw_on_the_new_primary(client, namespace, name, rollout)


async def test_a_minor_update_from_17_10_to_17_11_rolls_by_switchover_without_losing_a_commit(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    name = "minor"
    await client.create(POSTGRES_CLUSTER, cluster(name, namespace, 2, version=17, imageName="kanri.dev/postgres:17.10"))
    async with operator.running(refresh=10.0):
        await eventually(lambda: ready(client, namespace, name, 2), timeout=240, interval=1)
        user, password = await credentials(client, namespace, name)

        async def release(instance: str) -> str | None:
            return await server_version(
                (await pod_ips(client, namespace, name)).get(f"{instance}-0", ""), user, password
            )

        assert [await release(f"{name}-{n}") for n in (1, 2)] == ["17.10", "17.10"]
        primary = str((await client.get(POSTGRES_CLUSTER, name, namespace))["status"]["currentPrimary"])
        replica = next(i for i in (f"{name}-1", f"{name}-2") if i != primary)

        # A release the node does not have stops the rollout at the replica, and the cluster says why.
        await client.patch(POSTGRES_CLUSTER, name, {"spec": {"imageName": "kanri.dev/postgres:17.99"}}, namespace)

        async def pull_failed() -> str | None:
            status = (await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {}
            found = get_condition(status.get("conditions"), "Degraded")
            ok = found is not None and found["status"] == "True" and found["reason"] == "ImagePullFailed"
            return str(found["message"]) if ok and found is not None else None

        message = await eventually(pull_failed, timeout=120, interval=1)
        assert f"instance {replica}: image kanri.dev/postgres:17.99 of container postgres cannot be pulled" in message
        sts = await client.get(STATEFUL_SET, primary, namespace)
        assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "kanri.dev/postgres:17.10"
        assert await release(primary) == "17.10"  # the primary still serves on the old release

        async def on_17_11(instance: str) -> bool:
            return await release(instance) == "17.11"

        rollout = await roll_under_load(client, namespace, name, {"imageName": "kanri.dev/postgres:17.11"}, on_17_11)
        print(f"\nminor update 17.10 -> 17.11 by switchover: longest write gap {longest_gap(rollout.ledger):.2f} s "
              f"over {len(rollout.ledger.acks)} commits; lastFailover {rollout.record}")  # fmt: skip
        await nothing_lost_and_rw_on_the_new_primary(client, namespace, name, rollout)
        for instance in (rollout.old, rollout.other):
            sts = await client.get(STATEFUL_SET, instance, namespace)
            assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "kanri.dev/postgres:17.11"
