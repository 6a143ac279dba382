"""Lag-aware reads (issue 29 item 9), against the real API server and StatefulSet controller: a replica further
behind the primary than ``maxReadLagBytes`` is labelled out of ``-ro``/``-r`` until it caught up, and a replica the
primary no longer lists (a frozen WAL receiver) reports no lag rather than a stale 0.

The instance managers are doubles at the HTTP boundary (the primary-update tests' fakes); the primary's
``replicas[]`` (its ``pg_stat_replication``) is set by the test as PostgreSQL would show it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest_asyncio

from kanri.contract.status import Replica
from kanri.local.controlplane import Endpoint
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import READS, SERVES_READS, WITHHOLDS_READS
from kanri.runtime import ApiError, Client, get_condition
from kanri.runtime.kinds import POD, SERVICE
from tests.integration.test_postgres_failover import status_of
from tests.integration.test_postgres_primary_update import fakes_for, kubelet
from tests.integration.test_postgres_reconciler import pgc
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]
MIB = 1 << 20


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


def streaming(name: str, lag: int) -> Obj:
    return Replica(name=name, state="streaming", sent_lsn="0/3000060", flush_lsn="0/3000060",
                   replay_lsn="0/3000060", lag_bytes=lag, sync_state="async").as_json()  # fmt: skip


async def reads_label(client: Client, namespace: str, instance: str) -> str | None:
    try:
        pod = await client.get(POD, f"{instance}-0", namespace)
    except ApiError as exc:
        if exc.not_found:
            return None  # not created yet
        raise
    return (pod["metadata"].get("labels") or {}).get(READS)


async def test_a_lagging_replica_leaves_the_read_services_and_a_vanished_one_has_no_lag(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    name = "lag"
    async with fakes_for(name, 3) as (fakes, instances):
        primary = fakes[f"{name}-1"]
        primary.report["replicas"] = [streaming(f"{name}-2", 0), streaming(f"{name}-3", 0)]
        await client.create(POSTGRES_CLUSTER, pgc(name, namespace, replicas=3))
        pods = asyncio.create_task(kubelet(client, namespace, fakes))
        try:
            async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):

                async def labelled(instance: str, value: str) -> bool:
                    return await reads_label(client, namespace, instance) == value

                await eventually(lambda: labelled(f"{name}-2", SERVES_READS), timeout=60)
                ro = await client.get(SERVICE, f"{name}-ro", namespace)
                assert ro["spec"]["selector"][READS] == SERVES_READS
                # lag-2 replays 26 MiB behind the primary (its own report still says 0: it replayed what it received)
                primary.report["replicas"] = [streaming(f"{name}-2", 26 * MIB), streaming(f"{name}-3", 0)]
                await eventually(lambda: labelled(f"{name}-2", WITHHOLDS_READS), timeout=30)

                async def withheld() -> Obj | None:
                    status = await status_of(client, namespace, name)
                    degraded = get_condition(status.get("conditions") or [], "Degraded") or {}
                    return status if degraded.get("reason") == "ReadsWithheld" else None

                status = await eventually(withheld, timeout=30)
                by_name = {i["name"]: i for i in status["instances"]}
                assert by_name[f"{name}-2"]["lagBytes"] == 26 * MIB
                assert await reads_label(client, namespace, f"{name}-3") == SERVES_READS
                # caught up: serves again
                primary.report["replicas"] = [streaming(f"{name}-2", 0), streaming(f"{name}-3", 0)]
                await eventually(lambda: labelled(f"{name}-2", SERVES_READS), timeout=30)
                # lag-3's receiver froze: the primary no longer lists it, its own report still says 0 bytes behind
                primary.report["replicas"] = [streaming(f"{name}-2", 0)]

                async def unknown() -> Obj | None:
                    status = await status_of(client, namespace, name)
                    entry = next(i for i in status["instances"] if i["name"] == f"{name}-3")
                    return status if "lagBytes" not in entry else None

                await eventually(unknown, timeout=30)
                await eventually(lambda: labelled(f"{name}-3", WITHHOLDS_READS), timeout=30)
        finally:
            pods.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pods
