"""Helpers for the PostgreSQL end-to-end tests: cluster manifests, readiness, credentials, and psycopg clients
over pod IPs and ClusterIPs."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import psycopg

from kanri.postgres.children.rehearsal import REHEARSAL
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import CLUSTER
from kanri.runtime import ApiError, Client, get_condition
from kanri.runtime.kinds import POD, SECRET, SERVICE
from tests.support import NotYet, eventually

Obj = dict[str, Any]


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
    """The cluster's instance pods. Not its restore rehearsal's (it carries the cluster label too, runs for minutes on
    a loaded machine after a first backup and serves no TCP: a CI run's upgrade e2e once waited on it as if it were an
    instance)."""
    selector = f"{CLUSTER}={name},!{REHEARSAL}"
    pods = (await client.list(POD, namespace, label_selector=selector))[0]
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


async def pod_ips(client: Client, namespace: str, name: str) -> dict[str, str]:
    pods = await pods_of(client, namespace, name)
    return {p["metadata"]["name"]: p["status"]["podIP"] for p in pods if (p.get("status") or {}).get("podIP")}


async def rows_or_error(host: str, user: str, password: str) -> list[int] | str:
    """Table ``t``'s rows through ``host``, or the error that stopped the query (its class and message)."""
    try:
        async with await connect(host, user, password) as conn:
            cursor = await conn.execute("SELECT x FROM t ORDER BY x")
            return [r[0] for r in await cursor.fetchall()]
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {exc}"


async def rows_on(host: str, user: str, password: str) -> list[int] | None:
    rows = await rows_or_error(host, user, password)
    return None if isinstance(rows, str) else rows


async def rows_through(host: str, user: str, password: str, timeout: float = 30) -> list[int]:
    """Table ``t``'s rows through ``host``, retried while it cannot answer (a Service's route can lag the Ready
    condition by a moment); after ``timeout`` an AssertionError naming the last error, so a missing table (a restore
    that stopped short) and a refused connection tell themselves apart."""
    last: list[int] | str = "not tried"
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        last = await rows_or_error(host, user, password)
        if not isinstance(last, str):
            return last
        await asyncio.sleep(1)
    raise AssertionError(f"no rows through {host} after {timeout} s: {last}")


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


async def gone(client: Client, namespace: str, name: str, kind: Any = POSTGRES_CLUSTER) -> bool:
    """The object (by default the PostgresCluster ``name``) no longer exists."""
    try:
        await client.get(kind, name, namespace)
    except ApiError as exc:
        return exc.not_found
    return False


async def deleted(client: Client, namespace: str, name: str, timeout: float) -> None:
    """Wait until the PostgresCluster ``name`` is gone; if it is not by ``timeout``, fail with what it still waits
    for (its phase, finalizers and conditions) — "still there" alone does not say which step of the deletion hangs."""
    last: Obj = {}

    async def gone_now() -> bool:
        nonlocal last
        try:
            found = await client.get(POSTGRES_CLUSTER, name, namespace)
        except ApiError as exc:
            if exc.not_found:
                return True
            raise
        status = found.get("status") or {}
        last = {"phase": status.get("phase"), "finalizers": found["metadata"].get("finalizers"),
                "conditions": [(c.get("type"), c.get("status"), c.get("reason"), c.get("message"))
                               for c in status.get("conditions") or []]}  # fmt: skip
        return False

    try:
        await eventually(gone_now, timeout=timeout, interval=1)
    except NotYet:
        raise AssertionError(f"{namespace}/{name} still exists {timeout:g} s after its deletion: {last}") from None


async def ready_with_row(client: Client, namespace: str, name: str, replicas: int, value: int = 1) -> None:
    """Wait until the cluster is Ready with ``replicas`` instances, write row ``value`` through ``-rw`` and see it on
    every instance."""
    await eventually(lambda: ready(client, namespace, name, replicas), timeout=180, interval=1)
    await write_row(client, namespace, name, value)
    await eventually(lambda: every_instance_has(client, namespace, name, [value]), timeout=60, interval=1)
