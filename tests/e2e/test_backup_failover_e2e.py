"""WAL archiving across a real failover, end to end (issue 13 items 4 and 7, with issue 12's failover).

Two local nodes. The object store (SeaweedFS, the platform's default repository) is pinned to one of them; a
two-instance cluster runs one instance per node, its primary on the other node (after a switchover when the
scheduler put it next to the store). The primary's node is powered off (the ``stop`` chaos verb: every container
SIGKILLed, heartbeats gone). Asserted: the replica is promoted, archives onto the next timeline (its ``.history``
file and a segment of that timeline in the bucket, no gap on it, ``ContinuousArchiving=True``), and a new cluster
restored from the repository — the base backup taken before the failover, then the WAL of both timelines — holds the
rows written before and after the failover.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.imagemap import default_image_map
from kanri.local.node import NodeHost, NodeOptions
from kanri.local.seaweedfs import S3_SERVICE, backup_tools_bin
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.ha.failover import SWITCHOVER
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import POD, STATEFUL_SET
from tests.e2e.postgres_helpers import cluster, cluster_ip, credentials, ready, rows_through, write_row
from tests.e2e.test_backup_archiving_e2e import (
    HISTORY,
    _no_store_pods,
    _store_ready,
    archiving,
    number,
    segments,
    start_store,
    superuser_sql,
    switch_wal,
)
from tests.local_node_support import running_nodes, with_test_network
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
NAME = "arfo"
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.faults,
    pytest.mark.skipif(
        not (backup_tools_bin() / "barman-cloud-wal-archive").exists() or not (backup_tools_bin() / "weed").exists(),
        reason="no backup tools (make backup-tools)",
    ),
]
HOSTNAME = "kubernetes.io/hostname"


@pytest_asyncio.fixture(loop_scope="session")
async def host(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[NodeHost]:
    options = with_test_network(
        NodeOptions(data_dir=tmp_path / "nodes", name=f"test-arfo-{secrets.token_hex(3)}", images=default_image_map(),
                    restart_backoff_base=0.5, restart_backoff_max=5.0)
    )  # fmt: skip
    async with running_nodes(control_plane.kubeconfig, options, count=2) as nodes:
        yield nodes


def one_per_node() -> Obj:
    term = {"labelSelector": {"matchLabels": {"kanri.dev/cluster": NAME}}, "topologyKey": HOSTNAME}
    return {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}


async def primary_node(client: Client, namespace: str) -> tuple[str, str]:
    status = (await client.get(POSTGRES_CLUSTER, NAME, namespace))["status"]
    primary = str(status["currentPrimary"])
    pod = await client.get(POD, f"{primary}-0", namespace)
    return primary, str(pod["spec"]["nodeName"])


def across(found: list[str]) -> list[int]:
    """Segment numbers missing between the first and the last archived one, whatever their timeline: what a restore
    replays (up to a timeline's branch point on it, then on the next), so a hole at a failover shows here."""
    present = {number(s) for s in found}
    return [n for n in range(min(present), max(present)) if n not in present]


async def timeline(client: Client, namespace: str, name: str) -> int:
    rows = await eventually(lambda: superuser_sql(client, namespace, name,
                                                  "SELECT pg_walfile_name(pg_current_wal_lsn())"))  # fmt: skip
    return int(str(rows[0][0])[:8], 16)


async def test_archiving_goes_on_after_the_primarys_node_is_lost_and_a_restore_spans_both_timelines(
    client: Client, control_plane: Endpoint, host: NodeHost, namespace: str
) -> None:
    nodes = [node.name for node in host.nodes]
    store = await start_store(client, namespace, nodes[0])  # it must outlive the other node
    instances = HttpInstanceClient()
    operator = Operator(control_plane, namespace, instances=instances, default_backup_repository=store.repository())
    spec = {"backup": {"retentionDays": 14}, "podTemplate": one_per_node()}
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 2, **spec))
    prefix = f"e2e/{namespace}/{NAME}/"
    try:
        async with operator.running(refresh=2.0):
            await eventually(lambda: ready(client, namespace, NAME, 2), timeout=240, interval=1)

            async def first_backup() -> str | None:
                status = (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}
                return (status.get("backup") or {}).get("lastSuccessful")

            await eventually(first_backup, timeout=180, interval=1)
            old, node = await primary_node(client, namespace)
            if node == nodes[0]:  # the primary next to the store: hand its role to the other node first
                other = next(i for i in (f"{NAME}-1", f"{NAME}-2") if i != old)
                annotations = {"metadata": {"annotations": {SWITCHOVER: other}}}
                await client.patch(POSTGRES_CLUSTER, NAME, annotations, namespace)

                async def moved() -> tuple[str, str] | None:
                    now = await ready(client, namespace, NAME, 2)
                    return await primary_node(client, namespace) if now and now["status"]["currentPrimary"] == other \
                        else None  # fmt: skip

                old, node = await eventually(moved, timeout=120, interval=1)
            assert node == nodes[1]
            before = await timeline(client, namespace, NAME)
            # The hole a failover leaves: the store is stopped, row 1 is written and its segment closed; the replica
            # has it (streamed) but the old primary cannot archive it, and its node is powered off. Only the
            # promoted replica can still archive that segment, which a standby marked "done" long ago.
            await client.patch(STATEFUL_SET, S3_SERVICE, {"spec": {"replicas": 0}}, namespace)
            await eventually(lambda: _no_store_pods(client, namespace), timeout=60, interval=0.5)
            last_old = await switch_wal(client, namespace, NAME)
            await asyncio.sleep(2)  # streamed to the replica (sub-second), not archived (no store)
            assert await host.chaos("stop", node)

            async def failed_over() -> Obj | None:
                status = (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}
                record = status.get("lastFailover") or {}
                done = record.get("from") == old and not status.get("failover")
                return dict(record) if done else None

            record = await eventually(failed_over, timeout=120, interval=0.5)
            print(f"\nfailed over from {old}: {record}; the old timeline's last closed segment {last_old}")
            await client.patch(STATEFUL_SET, S3_SERVICE, {"spec": {"replicas": 1}}, namespace)
            await eventually(lambda: _store_ready(client, store), timeout=90, interval=0.5)
            await write_row(client, namespace, NAME, 2)
            segment = await switch_wal(client, namespace, NAME)  # writes row 1 again, then closes the segment
            after = int(segment[:8], 16)
            assert after == before + 1, (before, segment)

            async def on_the_new_timeline() -> bool:
                keys = await store.keys_under(prefix)
                histories = {m.group(1) for key in keys if (m := HISTORY.search(key))}
                found = segments(keys)
                # the old segment's number on either timeline (the new one begins inside it when the switch record
                # never reached the replica)
                covered = {number(s) for s in found}
                return f"{after:08X}" in histories and segment in found and number(last_old) in covered

            await eventually(on_the_new_timeline, timeout=120, interval=1)
            await eventually(lambda: archiving(client, namespace, NAME, "True", "Archiving"), timeout=60, interval=1)
            archived = segments(await store.keys_under(prefix))
            assert across(archived) == [], archived  # no hole, on a timeline or where one follows the other

            # the repository restores across the failover: the pre-failover base backup, then both timelines' WAL
            # (on the store's node: the stopped one may not be marked NotReady yet, and the scheduler would pick it)
            back = cluster("arfo-back", namespace, 1, bootstrap={"recovery": {"source": NAME}},
                           podTemplate={"nodeSelector": {HOSTNAME: nodes[0]}})  # fmt: skip
            await client.create(POSTGRES_CLUSTER, back)
            await eventually(lambda: ready(client, namespace, "arfo-back", 1), timeout=300, interval=2)
            # through its own Service, as its own app user (its Secrets are its own and work)
            user, password = await credentials(client, namespace, "arfo-back")
            rows = await rows_through(await cluster_ip(client, namespace, "arfo-back-rw"), user, password)
            assert sorted(set(rows)) == [1, 2], rows
            assert await timeline(client, namespace, "arfo-back") >= after  # recovery reached the new timeline
    finally:
        await instances.close()
        for name in nodes:
            await host.chaos("start", name)
