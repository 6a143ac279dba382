"""A rolling update by switchover under a write load, end to end (issue 12 item 6, issue 14 item 2).

Two instances on one local node, real PostgreSQL, a :class:`Ledger` writing through ``-rw``. A change of
``spec.resources`` (a pod-template change) rolls the replica, switches over to it, then rolls the old primary as a
replica. Asserted: that order, no acknowledged commit lost, the cluster Ready on the new primary behind ``-rw``. The
write outage (the longest gap between two acknowledged commits) is printed, not asserted.
"""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from kanri.local.node import LocalNode
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import STATEFUL_SET
from tests.e2e.ledger import Ledger, ids_on
from tests.e2e.postgres_helpers import cluster, cluster_ip, credentials, pod_ips, ready
from tests.postgres_support import Operator
from tests.support import eventually

NAME = "roll"
pytestmark = [pytest.mark.timeout(400), pytest.mark.faults]  # a switchover: SwitchoverStarted, no FailoverStarted


async def cpu_of(client: Client, namespace: str, instance: str) -> str | None:
    sts = await client.get(STATEFUL_SET, instance, namespace)
    container = sts["spec"]["template"]["spec"]["containers"][0]
    return ((container.get("resources") or {}).get("requests") or {}).get("cpu")


async def test_a_resources_change_rolls_the_replica_switches_over_and_rolls_the_old_primary_under_load(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 2))
    async with operator.running(refresh=10.0):
        await eventually(lambda: ready(client, namespace, NAME, 2), timeout=240, interval=1)
        user, password = await credentials(client, namespace, NAME)
        rw = await cluster_ip(client, namespace, f"{NAME}-rw")
        old = str((await client.get(POSTGRES_CLUSTER, NAME, namespace))["status"]["currentPrimary"])
        other = next(i for i in (f"{NAME}-1", f"{NAME}-2") if i != old)
        ledger = Ledger(rw, user, password)
        await ledger.prepare()
        writing = asyncio.create_task(ledger.run())
        try:
            await eventually(lambda: asyncio.sleep(0, len(ledger.acks) >= 20 or None), timeout=30)
            patch = {"spec": {"resources": {"requests": {"cpu": "120m"}}}}
            await client.patch(POSTGRES_CLUSTER, NAME, patch, namespace)

            async def switched() -> dict[str, object] | None:
                status = (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}
                record = status.get("lastFailover") or {}
                return dict(record) if record.get("reason") == "RollingUpdate" and not status.get("failover") else None

            record = await eventually(switched, timeout=180, interval=0.5)
            # The old primary is rolled only after it handed its role over.
            assert (record["from"], record["to"]) == (old, other)
            assert await cpu_of(client, namespace, other) == "120m"

            async def rolled() -> bool:
                return (
                    await cpu_of(client, namespace, old) == "120m"
                    and await ready(client, namespace, NAME, 2) is not None
                )

            await eventually(rolled, timeout=180, interval=1)
            await eventually(lambda: asyncio.sleep(0, len(ledger.acks) >= 20 or None), timeout=30)
            count = len(ledger.acks)
            await eventually(lambda: asyncio.sleep(0, len(ledger.acks) > count + 10 or None), timeout=30)
        finally:
            ledger.stop()
            with contextlib.suppress(Exception):
                await writing
        gaps = [b.at - a.at for a, b in zip(ledger.acks, ledger.acks[1:], strict=False)]
        print(f"\nrolling update by switchover: longest write gap {max(gaps):.2f} s over {len(ledger.acks)} commits; "
              f"lastFailover {record}")  # fmt: skip
        status = (await client.get(POSTGRES_CLUSTER, NAME, namespace))["status"]
        assert status["currentPrimary"] == other
        ips = await pod_ips(client, namespace, NAME)
        present = await ids_on(await cluster_ip(client, namespace, f"{NAME}-rw"), user, password)
        assert present is not None
        assert ledger.acked_ids() - present == set()  # no acknowledged commit lost
        assert ledger.acks[-1].server == ips[f"{other}-0"]  # -rw serves the new primary
        assert ledger.servers_overlap() == []
