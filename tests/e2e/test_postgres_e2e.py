"""The PostgreSQL operator end to end: real PostgreSQL 15 run by the instance manager in pods of the local node,
the operator's real Manager, real clients (psycopg) over the pod network and the Services' ClusterIPs."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import POD, PVC, SECRET, SERVICE, STATEFUL_SET
from tests.e2e.postgres_helpers import (
    cluster,
    credentials,
    every_instance_has,
    gone,
    names,
    pods_of,
    postmaster_start_times,
    ready,
    setting_everywhere,
    write_row,
)
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]


async def test_three_instances_replicate_scale_grow_and_converge_with_zero_writes(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster("orders", namespace, 3))
    async with operator.running(refresh=2.0):
        await eventually(lambda: ready(client, namespace, "orders", 3), timeout=180, interval=1)
        # A row written through -rw is read on every instance.
        await write_row(client, namespace, "orders", 1)
        await eventually(lambda: every_instance_has(client, namespace, "orders", [1]), timeout=60, interval=1)

        # Converged: the refresh keeps reconciling, and writes nothing. An instance's /status answer slower than the
        # operator's 2 s timeout on a loaded machine is a real change (not ready) and a write: one 8 s window of the
        # first three must be quiet.
        await asyncio.sleep(3)
        windows: list[tuple[float, float]] = []

        async def quiet_window() -> bool:
            writes, reconciles = operator.writes(), operator.reconciles()
            await asyncio.sleep(8)
            windows.append((operator.reconciles() - reconciles, operator.writes() - writes))
            return windows[-1][0] > 0 and windows[-1][1] == 0

        for _ in range(3):
            if await quiet_window():
                break
        assert windows[-1][0] > 0, f"no reconcile in 8 s: (reconciles, writes) per window {windows}"
        assert windows[-1][1] == 0, f"writes on a converged cluster: (reconciles, writes) per window {windows}"

        # Scale 3 → 5: the new replicas clone from the primary and stream.
        primary = (await client.get(POSTGRES_CLUSTER, "orders", namespace))["status"]["currentPrimary"]
        await client.patch(POSTGRES_CLUSTER, "orders", {"spec": {"replicas": 5}}, namespace)
        await eventually(lambda: ready(client, namespace, "orders", 5), timeout=180, interval=1)
        await write_row(client, namespace, "orders", 2)
        await eventually(lambda: every_instance_has(client, namespace, "orders", [1, 2]), timeout=60, interval=1)

        # Scale 5 → 2: replicas go, the primary stays.
        await client.patch(POSTGRES_CLUSTER, "orders", {"spec": {"replicas": 2}}, namespace)
        await eventually(lambda: ready(client, namespace, "orders", 2), timeout=120, interval=1)
        sets = await names(client, STATEFUL_SET, namespace, "orders")
        assert len(sets) == 2
        assert primary in sets
        assert (await client.get(POSTGRES_CLUSTER, "orders", namespace))["status"]["currentPrimary"] == primary
        await eventually(lambda: every_instance_has(client, namespace, "orders", [1, 2]), timeout=60, interval=1)

        # Storage grows online: every claim asks for, and gets, 2Gi.
        await client.patch(POSTGRES_CLUSTER, "orders", {"spec": {"storage": {"size": "2Gi"}}}, namespace)

        async def grown() -> bool:
            claims = (await client.list(PVC, namespace, label_selector=f"{CLUSTER}=orders"))[0]
            return len(claims) == 2 and all(
                c["spec"]["resources"]["requests"]["storage"] == "2Gi" and c["status"]["capacity"]["storage"] == "2Gi"
                for c in claims
            )

        await eventually(grown, timeout=60, interval=1)
        await eventually(lambda: ready(client, namespace, "orders", 2), timeout=60, interval=1)

        # Parameters: a reloadable one applies in place; one that needs a restart is rolled out by the operator.
        started = await postmaster_start_times(client, namespace, "orders")
        parameters = {"work_mem": "8MB"}
        await client.patch(POSTGRES_CLUSTER, "orders", {"spec": {"postgresql": {"parameters": parameters}}}, namespace)
        await eventually(lambda: setting_everywhere(client, namespace, "orders", "work_mem", "8MB"), timeout=60)
        assert await postmaster_start_times(client, namespace, "orders") == started  # reloaded, not restarted
        parameters = {"work_mem": "8MB", "shared_buffers": "64MB"}
        await client.patch(POSTGRES_CLUSTER, "orders", {"spec": {"postgresql": {"parameters": parameters}}}, namespace)
        await eventually(
            lambda: setting_everywhere(client, namespace, "orders", "shared_buffers", "64MB"), timeout=180, interval=1
        )
        await eventually(lambda: ready(client, namespace, "orders", 2), timeout=60, interval=1)

        # A pod template change (resources) is rolled out one instance at a time, the replica before the primary
        # (the restart above may have switched the primary over: primaryUpdateStrategy Switchover).
        primary = (await client.get(POSTGRES_CLUSTER, "orders", namespace))["status"]["currentPrimary"]
        primary_pod = f"{primary}-0"
        before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in await pods_of(client, namespace, "orders")}
        resources = {"requests": {"cpu": "50m", "memory": "64Mi"}}
        await client.patch(POSTGRES_CLUSTER, "orders", {"spec": {"resources": resources}}, namespace)

        async def rolled() -> list[Obj] | None:
            pods = await pods_of(client, namespace, "orders")
            replaced = [p for p in pods if before.get(p["metadata"]["name"]) != p["metadata"]["uid"]]
            return pods if len(replaced) == 2 else None

        pods = await eventually(rolled, timeout=240, interval=1)
        created = {p["metadata"]["name"]: p["metadata"]["creationTimestamp"] for p in pods}
        # The primary goes last: with primaryUpdateStrategy Switchover the rollout hands the role to the rolled
        # replica first (lastFailover reason RollingUpdate) and then rolls the former primary.
        record = (await client.get(POSTGRES_CLUSTER, "orders", namespace))["status"].get("lastFailover") or {}
        if record.get("reason") == "RollingUpdate":
            primary_pod = f"{record['from']}-0"
        replica_pod = next(name for name in created if name != primary_pod)
        assert created[replica_pod] <= created[primary_pod]
        assert all(p["spec"]["containers"][0]["resources"]["requests"]["memory"] == "64Mi" for p in pods)
        await eventually(lambda: ready(client, namespace, "orders", 2), timeout=120, interval=1)
        await eventually(lambda: every_instance_has(client, namespace, "orders", [1, 2]), timeout=60, interval=1)


async def test_hibernate_wake_retain_recreate_and_delete(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster("books", namespace, 2))
    async with operator.running(refresh=2.0):
        await eventually(lambda: ready(client, namespace, "books", 2), timeout=180, interval=1)
        await write_row(client, namespace, "books", 7)
        await eventually(lambda: every_instance_has(client, namespace, "books", [7]), timeout=60, interval=1)
        claims = await names(client, PVC, namespace, "books")

        # Hibernate: every pod stops, the volumes stay.
        await client.patch(POSTGRES_CLUSTER, "books", {"spec": {"replicas": 0}}, namespace)

        async def no_pods() -> bool:
            return not (await client.list(POD, namespace, label_selector=f"{CLUSTER}=books"))[0]

        await eventually(no_pods, timeout=90, interval=1)
        assert await names(client, PVC, namespace, "books") == claims

        # Wake: the same data comes back.
        await client.patch(POSTGRES_CLUSTER, "books", {"spec": {"replicas": 2}}, namespace)
        await eventually(lambda: ready(client, namespace, "books", 2), timeout=180, interval=1)
        await eventually(lambda: every_instance_has(client, namespace, "books", [7]), timeout=60, interval=1)

        # Delete with Retain (the default): claims and Secrets stay; a cluster of the same name adopts them.
        secret_before = await credentials(client, namespace, "books")
        await client.delete(POSTGRES_CLUSTER, "books", namespace)
        await eventually(lambda: gone(client, namespace, "books"), timeout=90, interval=1)
        await eventually(no_pods, timeout=90, interval=1)
        assert await names(client, PVC, namespace, "books") == claims
        await client.create(POSTGRES_CLUSTER, cluster("books", namespace, 2))
        await eventually(lambda: ready(client, namespace, "books", 2), timeout=180, interval=1)
        assert await credentials(client, namespace, "books") == secret_before
        await eventually(lambda: every_instance_has(client, namespace, "books", [7]), timeout=60, interval=1)

        # Delete with Delete: nothing of the cluster is left.
        await client.patch(POSTGRES_CLUSTER, "books", {"spec": {"deletionPolicy": "Delete"}}, namespace)
        await client.delete(POSTGRES_CLUSTER, "books", namespace)
        await eventually(lambda: gone(client, namespace, "books"), timeout=90, interval=1)

        async def nothing_left() -> bool:
            for kind in (PVC, SECRET, STATEFUL_SET, SERVICE, POD):
                if await names(client, kind, namespace, "books"):
                    return False
            return True

        await eventually(nothing_left, timeout=90, interval=1)


async def test_an_operator_killed_while_provisioning_is_replaced_without_duplicates(
    control_plane: Endpoint, client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster("shop", namespace, 3))
    # The first operator is `kanri run` in a process of its own, SIGKILLed as soon as it has begun creating
    # children: no graceful stop, reconciles cut wherever they are.
    first = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kanri.cli.main", "run", f"--kubeconfig={control_plane.kubeconfig}",
        f"--namespace={namespace}", "--no-leader-election", "--health-port=0",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:

        async def provisioning() -> bool:
            return bool(await names(client, STATEFUL_SET, namespace, "shop"))

        await eventually(provisioning, timeout=60, interval=0.05)
    finally:
        first.kill()
        await first.wait()
    assert await ready(client, namespace, "shop", 3) is None  # it really was cut short
    async with operator.running(refresh=2.0):
        await eventually(lambda: ready(client, namespace, "shop", 3), timeout=180, interval=1)
    assert await names(client, STATEFUL_SET, namespace, "shop") == ["shop-1", "shop-2", "shop-3"]
    assert await names(client, PVC, namespace, "shop") == ["shop-1", "shop-2", "shop-3"]
    assert await names(client, SERVICE, namespace, "shop") == ["shop-r", "shop-ro", "shop-rw"]
    secrets = ["shop-api", "shop-app", "shop-ca", "shop-ca-key", "shop-replication", "shop-server", "shop-superuser"]
    assert await names(client, SECRET, namespace, "shop") == secrets  # 4 credentials and 3 TLS, none twice
