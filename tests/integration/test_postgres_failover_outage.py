"""A failover after an operator outage (issue 29 item 11): the primary is lost while no operator runs, and the
operator that starts afterwards has no memory of the primary's last WAL position.

The real API server and the operator's real reconciler and HTTP client, with instance-manager doubles
(tests/integration/test_postgres_failover.py's) whose replicas report ``upstream``: what their WAL receivers last
heard of the primary's WAL end, aged on their own clock as an instance manager does (kanri.instance.upstream; the
real evidence against real PostgreSQL is tests/integration/test_instance_upstream.py).
"""

from __future__ import annotations

import re
import secrets
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest_asyncio
from aiohttp import web

from kanri.local.controlplane import Endpoint
from kanri.postgres.ha.position import NODE_GRACE
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import EVENT, NODE, POD
from tests.integration.test_postgres_failover import HaFake, ha_fakes, pods_running, ready, status_of
from tests.integration.test_postgres_reconciler import pgc
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


def remember(fake: HaFake, position: str, *, stopped_ago: float, timeline: int = 1) -> None:
    """The replica's instance manager heard ``position`` last, ``stopped_ago`` seconds ago, when it last streamed."""
    stopped = time.monotonic() - stopped_ago

    async def status(_: web.Request) -> web.Response:
        report = dict(fake.report)
        age = round(time.monotonic() - stopped, 3)
        report["upstream"] = {"position": position, "timeline": timeline, "heardSeconds": age,
                              "streamingSeconds": age}  # fmt: skip
        return web.json_response(report)

    fake._status = status  # type: ignore[method-assign]


async def events(client: Client, namespace: str, name: str, reason: str) -> list[str]:
    items, _ = await client.list(EVENT, namespace)
    return [e["message"] for e in items if e["involvedObject"]["name"] == name and e["reason"] == reason]


async def test_a_primary_lost_while_the_operator_was_down_fails_over_bounded_by_the_replicas_evidence(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    async with ha_fakes("gone", {2: "0/3000000", 3: "0/3000040"}) as (fakes, instances):
        await client.create(POSTGRES_CLUSTER, pgc("gone", namespace, failover={"maxDataLossBytes": 1024}))
        async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):
            await pods_running(client, namespace, fakes)
            await eventually(lambda: ready(client, namespace, "gone"), timeout=30)
        # The operator is down; the primary's node stops. Its replicas' receivers last heard its WAL end at
        # 0/3000100 and 0/3000080, and lost it 2 s ago (a receiver notices within ~6 s).
        await fakes["gone-1"].stop()
        remember(fakes["gone-2"], "0/3000080", stopped_ago=2)
        remember(fakes["gone-3"], "0/3000100", stopped_ago=2)
        async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):

            async def failed_over() -> Obj | None:
                return (await status_of(client, namespace, "gone")).get("lastFailover")

            record = await eventually(failed_over, timeout=40)
        assert record["from"] == "gone-1"
        assert record["to"] == "gone-3"
        assert record["primaryLSNSource"] == "Replicas"
        assert record["lsnGapBytes"] == 0xC0  # 0/3000100 as the replicas last heard it, against 0/3000040
        assert record["dataLossPossible"] is True
        assert "approvedBy" not in record  # by itself, not by a human
        (message,) = await events(client, namespace, "gone", "FailedOver")
        assert "lacked 192 bytes of gone-1's WAL as last seen by the replicas" in message
        assert "gone-3 heard WAL end 0/3000100" in message
        assert await events(client, namespace, "gone", "FailoverBlocked") == []


async def test_evidence_older_than_the_detection_window_leaves_the_loss_unknown_and_says_how_old(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    async with ha_fakes("stale", {2: "0/3000000"}) as (fakes, instances):
        await client.create(POSTGRES_CLUSTER, pgc("stale", namespace, replicas=2))
        async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):
            await pods_running(client, namespace, fakes)
            await eventually(lambda: ready(client, namespace, "stale"), timeout=30)
        # The replica lost the primary two minutes before the primary itself went: it may have written meanwhile.
        await fakes["stale-1"].stop()
        remember(fakes["stale-2"], "0/3000080", stopped_ago=120)
        async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):

            async def blocked() -> Obj | None:
                status = await status_of(client, namespace, "stale")
                found = [c for c in status.get("conditions") or [] if c["type"] == "FailoverBlocked"]
                return status if found and found[0]["status"] == "True" else None

            status = await eventually(blocked, timeout=40)
        (cond,) = [c for c in status["conditions"] if c["type"] == "FailoverBlocked"]
        assert cond["reason"] == "DataLossUnknown"
        assert "stale-2 heard WAL end 0/3000080 (last streamed 12" in cond["message"]  # ~120 s + the window
        assert "older than 6 s before it was found failed" in cond["message"]
        assert "primaryLSN" not in status["failover"]
        assert "/promote" not in fakes["stale-2"].asked


async def test_a_primary_whose_node_went_silent_long_before_the_operator_came_back_fails_over_by_itself(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    """Five minutes without an operator: the replicas' evidence is as old, too old against the operator's own
    detection, but the primary's node was marked Ready=Unknown (its Lease not renewed) and the replicas heard the
    primary after its last renewal: the node's silence anchors the evidence."""
    name = f"silent-{secrets.token_hex(3)}"
    await client.create(NODE, {"metadata": {"name": name}})
    marked = datetime.now(UTC) - timedelta(seconds=300 - NODE_GRACE)  # its last renewal: 300 s ago at the latest
    unknown = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
               "message": "Kubelet stopped posting node status.", "lastTransitionTime": iso(marked),
               "lastHeartbeatTime": iso(marked - timedelta(seconds=NODE_GRACE))}  # fmt: skip
    await client.patch_status(NODE, name, {"status": {"conditions": [unknown]}})
    try:
        async with ha_fakes("late", {2: "0/3000000"}) as (fakes, instances):
            await client.create(POSTGRES_CLUSTER, pgc("late", namespace, replicas=2))
            async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):

                async def pod_exists() -> bool:
                    pods, _ = await client.list(POD, namespace)
                    return any(p["metadata"]["name"] == "late-1-0" for p in pods)

                await eventually(pod_exists, timeout=30)
                binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "late-1-0"},
                           "target": {"apiVersion": "v1", "kind": "Node", "name": name}}  # fmt: skip
                await client.create_subresource(POD, "late-1-0", "binding", binding, namespace)
                await pods_running(client, namespace, fakes)
                await eventually(lambda: ready(client, namespace, "late"), timeout=30)
            await fakes["late-1"].stop()
            # the replica lost the primary 5 s after its node's last renewal, about five minutes ago
            renewed = marked - timedelta(seconds=NODE_GRACE)
            remember(fakes["late-2"], "0/3000080", stopped_ago=(datetime.now(UTC) - renewed).total_seconds() - 5)
            async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):

                async def failed_over() -> Obj | None:
                    return (await status_of(client, namespace, "late")).get("lastFailover")

                record = await eventually(failed_over, timeout=40)
            assert record["to"] == "late-2"
            assert record["primaryLSNSource"] == "Replicas"
            assert record["lsnGapBytes"] == 0x80
            (message,) = await events(client, namespace, "late", "FailedOver")
            # 5 s, plus the transition time's fraction of a second (metav1.Time keeps whole seconds)
            assert re.search(r"last streamed [56] s after its node last renewed its Lease", message), message
    finally:
        await client.delete(NODE, name)


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def test_a_failover_blocked_for_want_of_a_position_goes_on_once_the_primarys_node_is_marked_gone(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    """The operator came back 30 s after the replicas lost the primary, before Kubernetes marked its node: too old
    for its own detection, so it blocks (DataLossUnknown). Once the node is marked Ready=Unknown it decides again, the
    replicas' evidence counts against the node's last renewal, and the failover goes on with nobody's approval."""
    name = f"gone-{secrets.token_hex(3)}"
    await client.create(NODE, {"metadata": {"name": name}})
    try:
        async with ha_fakes("mark", {2: "0/3000000"}) as (fakes, instances):
            await client.create(POSTGRES_CLUSTER, pgc("mark", namespace, replicas=2))
            async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):
                await bind(client, namespace, "mark-1-0", name)
                await pods_running(client, namespace, fakes)
                await eventually(lambda: ready(client, namespace, "mark"), timeout=30)
            await fakes["mark-1"].stop()
            lost = datetime.now(UTC) - timedelta(seconds=30)
            remember(fakes["mark-2"], "0/3000080", stopped_ago=30)
            async with Operator(control_plane, namespace, instances=instances).running(refresh=0.5):

                async def blocked() -> Obj | None:
                    found = await events(client, namespace, "mark", "FailoverBlocked")
                    return {"message": found[0]} if found else None

                message = (await eventually(blocked, timeout=40))["message"]
                assert "mark-2 heard WAL end 0/3000080 (last streamed" in message
                assert "older than 6 s before it was found failed" in message
                # The node lifecycle controller marks it: its last renewal came 3 s after the replica last streamed.
                marked = lost + timedelta(seconds=3 + NODE_GRACE)
                unknown = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
                           "message": "Kubelet stopped posting node status.", "lastTransitionTime": iso(marked),
                           "lastHeartbeatTime": iso(lost)}  # fmt: skip
                await client.patch_status(NODE, name, {"status": {"conditions": [unknown]}})

                async def failed_over() -> Obj | None:
                    return (await status_of(client, namespace, "mark")).get("lastFailover")

                record = await eventually(failed_over, timeout=30)
            assert record["to"] == "mark-2"
            assert record["primaryLSNSource"] == "Replicas"
            assert "approvedBy" not in record
            (told,) = await events(client, namespace, "mark", "FailedOver")
            # 3 s, less the transition time's fraction of a second (metav1.Time keeps whole seconds)
            assert re.search(r"last streamed [23] s before its node last renewed its Lease", told), told
    finally:
        await client.delete(NODE, name)


async def bind(client: Client, namespace: str, pod: str, node: str) -> None:
    """What the scheduler does: the pod is bound to ``node``."""

    async def exists() -> bool:
        pods, _ = await client.list(POD, namespace)
        return any(p["metadata"]["name"] == pod for p in pods)

    await eventually(exists, timeout=30)
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
    await client.create_subresource(POD, pod, "binding", binding, namespace)
