"""The PostgreSQL operator end to end: real PostgreSQL 15 run by the instance manager in pods of the local node,
the operator's real Manager, real clients (psycopg) over the pod network and the Services' ClusterIPs."""

from __future__ import annotations

import asyncio
import base64
import secrets
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.imagemap import default_image_map
from kanri.local.node import LocalNode, NodeOptions
from kanri.postgres.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import CLUSTER
from kanri.runtime import ApiError, Client, get_condition
from kanri.runtime.kinds import POD, PVC, SECRET, SERVICE, STATEFUL_SET
from tests.local_node_support import running_node, with_test_network
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    """The conftest's client, with the PostgresCluster CRD installed and Established."""
    await install_postgres_crd(client)
    return client


@pytest_asyncio.fixture(loop_scope="session")
async def node(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[LocalNode]:
    options = with_test_network(
        NodeOptions(
            data_dir=tmp_path / "node",
            name=f"test-pg-{secrets.token_hex(3)}",
            images=default_image_map(),
            restart_backoff_base=0.5,
            restart_backoff_max=5.0,
        )
    )
    async with running_node(control_plane.kubeconfig, options) as local:
        yield local


@pytest_asyncio.fixture(loop_scope="session")
async def operator(control_plane: Endpoint, namespace: str) -> AsyncIterator[Operator]:
    instances = HttpInstanceClient()
    try:
        yield Operator(control_plane, namespace, instances=instances)
    finally:
        await instances.close()


def cluster(name: str, namespace: str, replicas: int, **spec: Any) -> Obj:
    return {
        "apiVersion": POSTGRES_CLUSTER.api_version,
        "kind": "PostgresCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"version": 15, "replicas": replicas, "storage": {"size": "1Gi"}, **spec},
    }


async def ready(client: Client, namespace: str, name: str, replicas: int) -> Obj | None:
    found = await client.get(POSTGRES_CLUSTER, name, namespace)
    status = found.get("status") or {}
    condition = get_condition(status.get("conditions"), "Ready")
    if condition is not None and condition["status"] == "True" and status.get("readyReplicas") == replicas:
        return found
    return None


async def credentials(client: Client, namespace: str, name: str) -> tuple[str, str]:
    secret = await client.get(SECRET, f"{name}-app", namespace)
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    return data["username"], data["password"]


async def connect(host: str, user: str, password: str, database: str = "app") -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(
        host=host, port=5432, user=user, password=password, dbname=database, connect_timeout=5, autocommit=True
    )


async def cluster_ip(client: Client, namespace: str, service: str) -> str:
    return str((await client.get(SERVICE, service, namespace))["spec"]["clusterIP"])


async def pods_of(client: Client, namespace: str, name: str) -> list[Obj]:
    pods = (await client.list(POD, namespace, label_selector=f"{CLUSTER}={name}"))[0]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


async def pod_ips(client: Client, namespace: str, name: str) -> dict[str, str]:
    pods = await pods_of(client, namespace, name)
    return {p["metadata"]["name"]: p["status"]["podIP"] for p in pods if (p.get("status") or {}).get("podIP")}


async def rows_on(host: str, user: str, password: str) -> list[int] | None:
    try:
        async with await connect(host, user, password) as conn:
            cursor = await conn.execute("SELECT x FROM t ORDER BY x")
            return [r[0] for r in await cursor.fetchall()]
    except psycopg.Error:
        return None


async def write_row(client: Client, namespace: str, name: str, value: int) -> None:
    user, password = await credentials(client, namespace, name)
    host = await cluster_ip(client, namespace, f"{name}-rw")

    async def insert() -> bool:
        try:
            async with await connect(host, user, password) as conn:
                await conn.execute("CREATE TABLE IF NOT EXISTS t (x int)")
                await conn.execute("INSERT INTO t VALUES (%s)", (value,))
                return True
        except psycopg.Error:
            return False

    await eventually(insert, timeout=30, interval=0.5)


async def every_instance_has(client: Client, namespace: str, name: str, expected: list[int]) -> bool:
    user, password = await credentials(client, namespace, name)
    ips = await pod_ips(client, namespace, name)
    results = await asyncio.gather(*(rows_on(ip, user, password) for ip in ips.values()))
    return bool(ips) and all(r == expected for r in results)


async def show_everywhere(client: Client, namespace: str, name: str, query: str) -> list[Any] | None:
    """``query``'s single value on every instance (None while one cannot answer)."""
    user, password = await credentials(client, namespace, name)
    values = []
    for ip in (await pod_ips(client, namespace, name)).values():
        try:
            async with await connect(ip, user, password) as conn:
                row = await (await conn.execute(query)).fetchone()
        except psycopg.Error:
            return None
        values.append(row[0] if row else None)
    return values


async def setting_everywhere(client: Client, namespace: str, name: str, setting: str, value: str) -> bool:
    values = await show_everywhere(client, namespace, name, f"SHOW {setting}")
    return values is not None and bool(values) and all(v == value for v in values)


async def postmaster_start_times(client: Client, namespace: str, name: str) -> list[Any] | None:
    return await show_everywhere(client, namespace, name, "SELECT pg_postmaster_start_time()")


async def names(client: Client, kind: Any, namespace: str, name: str) -> list[str]:
    items = (await client.list(kind, namespace, label_selector=f"{CLUSTER}={name}"))[0]
    return sorted(i["metadata"]["name"] for i in items if not i["metadata"].get("deletionTimestamp"))


async def test_three_instances_replicate_scale_grow_and_converge_with_zero_writes(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster("orders", namespace, 3))
    async with operator.running(refresh=2.0):
        await eventually(lambda: ready(client, namespace, "orders", 3), timeout=180, interval=1)
        # A row written through -rw is read on every instance.
        await write_row(client, namespace, "orders", 1)
        await eventually(lambda: every_instance_has(client, namespace, "orders", [1]), timeout=60, interval=1)

        # Converged: the refresh keeps reconciling, and writes nothing.
        await asyncio.sleep(3)
        writes, reconciles = operator.writes(), operator.reconciles()
        await asyncio.sleep(8)
        assert operator.reconciles() > reconciles
        assert operator.writes() == writes

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
        assert await every_instance_has(client, namespace, "orders", [1, 2])

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

        # A pod template change (resources) is rolled out one instance at a time, the replica before the primary.
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
        replica_pod = next(name for name in created if name != primary_pod)
        assert created[replica_pod] <= created[primary_pod]
        assert all(p["spec"]["containers"][0]["resources"]["requests"]["memory"] == "64Mi" for p in pods)
        await eventually(lambda: ready(client, namespace, "orders", 2), timeout=120, interval=1)
        assert await every_instance_has(client, namespace, "orders", [1, 2])


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
        await eventually(lambda: _gone(client, namespace, "books"), timeout=90, interval=1)
        await eventually(no_pods, timeout=90, interval=1)
        assert await names(client, PVC, namespace, "books") == claims
        await client.create(POSTGRES_CLUSTER, cluster("books", namespace, 2))
        await eventually(lambda: ready(client, namespace, "books", 2), timeout=180, interval=1)
        assert await credentials(client, namespace, "books") == secret_before
        await eventually(lambda: every_instance_has(client, namespace, "books", [7]), timeout=60, interval=1)

        # Delete with Delete: nothing of the cluster is left.
        await client.patch(POSTGRES_CLUSTER, "books", {"spec": {"deletionPolicy": "Delete"}}, namespace)
        await client.delete(POSTGRES_CLUSTER, "books", namespace)
        await eventually(lambda: _gone(client, namespace, "books"), timeout=90, interval=1)

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
    assert len(await names(client, SECRET, namespace, "shop")) == 4


async def _gone(client: Client, namespace: str, name: str) -> bool:
    try:
        await client.get(POSTGRES_CLUSTER, name, namespace)
    except ApiError as exc:
        return exc.not_found
    return False
