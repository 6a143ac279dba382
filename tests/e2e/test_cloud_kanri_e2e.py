"""The cloud operator's kanri provider end to end: a DatabaseInstance becomes a PostgresCluster of kanri's own
operator on the local node (real PostgreSQL, real Barman Cloud into the object store of the backup tests), whose
connection Secret connects (psycopg over the -rw Service's ClusterIP); Retain lets the cluster go and it keeps
serving; a second DatabaseInstance adopts it by ID and, deleted under Delete, takes the final backup first, then the
cluster and its data volumes go while the backup stays.

One test, one cluster (the Retain half and the Delete half share it through adoption), so the module stays lean.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from prometheus_client import CollectorRegistry

from kanri.cloud import naming
from kanri.cloud.api import CLASS, INSTANCE, DatabaseClass, DatabaseInstance
from kanri.cloud.budget.buckets import Budgets
from kanri.cloud.providers.kanri import FOR_INSTANCE, OWNER_LABEL, POSTGRES_BACKUP, POSTGRES_CLUSTER, RELEASED
from kanri.cloud.reconciler import controller
from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.local.seaweedfs import backup_tools_bin
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.runtime import ApiError, Client, Manager, ManagerOptions, get_condition, install_crd
from kanri.runtime.kinds import PVC, SECRET
from tests.e2e.postgres_helpers import cluster_ip
from tests.e2e.test_backup_archiving_e2e import Store, start_store
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
pytestmark = [
    pytest.mark.timeout(420),
    pytest.mark.skipif(
        not (backup_tools_bin() / "barman-cloud-backup").exists() or not (backup_tools_bin() / "weed").exists(),
        reason="no backup tools (make backup-tools)",
    ),
]


@pytest_asyncio.fixture(loop_scope="session")
async def cloud_client(client: Client) -> Client:
    """The e2e client (PostgresCluster CRDs installed) with the cloud operator's CRDs too."""
    for kind in (DatabaseInstance, DatabaseClass):
        await install_crd(client, kind, field_manager="kanri-tests")
    return client


@pytest_asyncio.fixture(loop_scope="session")
async def db_class(cloud_client: Client) -> AsyncIterator[str]:
    """A kanri DatabaseClass of the test's own (cluster-scoped): small requests that fit the node."""
    name = f"local-{secrets.token_hex(4)}"
    sizes = {"small": {"cpu": "100m", "memory": "256Mi"}}
    await cloud_client.create(CLASS, {"metadata": {"name": name},
                                      "spec": {"provider": "kanri", "kanri": {"sizes": sizes}}})  # fmt: skip
    yield name
    with contextlib.suppress(ApiError):
        await cloud_client.delete(CLASS, name)


@contextlib.asynccontextmanager
async def cloud_operator(client: Client, namespace: str) -> AsyncIterator[None]:
    """The cloud operator's Manager in the test's process (its reconcile is the one kanri run would serve)."""
    registry = CollectorRegistry()
    options = ManagerOptions(name="kanri-cloud-operator", namespace=namespace, leader_election=False,
                             health_port=0, graceful_shutdown_timeout=10)  # fmt: skip
    manager = Manager(client, options, registry=registry)
    manager.add(controller(manager, registry=registry, budgets=Budgets(), poll_scale=0.2))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        yield
    finally:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


def instance(name: str, namespace: str, db_class: str, **spec: Any) -> Obj:
    base = {"className": db_class, "version": 15, "storage": "1Gi", "backupRetentionDays": 1}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": {**base, **spec}}


async def instance_ready(client: Client, namespace: str, name: str) -> Obj | None:
    obj = await client.get(INSTANCE, name, namespace)
    status = obj.get("status") or {}
    ready = get_condition(status.get("conditions"), "Ready") or {}
    current = status.get("observedGeneration") == obj["metadata"]["generation"]
    return obj if current and ready.get("status") == "True" and status.get("connectionSecret") else None


async def query(client: Client, namespace: str, secret: str, sql: str) -> list[tuple[Any, ...]]:
    """``sql`` through the connection Secret: its host (the -rw Service, reached by its ClusterIP from the test's
    process, which has no cluster DNS), port, dbname, username and password."""
    found = await client.get(SECRET, secret, namespace)
    data = {key: base64.b64decode(value).decode() for key, value in found["data"].items()}
    service, _, service_namespace = data["host"].partition(".")
    assert service_namespace.startswith(namespace), data["host"]
    host = await cluster_ip(client, namespace, service)
    async with await psycopg.AsyncConnection.connect(host=host, port=int(data["port"]), dbname=data["dbname"],
                                                     user=data["username"], password=data["password"],
                                                     connect_timeout=5, autocommit=True) as conn:  # fmt: skip
        cursor = await conn.execute(sql)
        return await cursor.fetchall() if cursor.description else []


async def gone(read: Any) -> bool:
    """True once ``read()`` answers 404 (kanri's Client raises ApiError, not kubernetes_asyncio's)."""
    try:
        await read()
    except ApiError as error:
        if error.not_found:
            return True
        raise
    return False


async def answers(client: Client, namespace: str, secret: str, sql: str) -> list[tuple[Any, ...]] | None:
    try:
        return await query(client, namespace, secret, sql)
    except psycopg.Error:
        return None


async def test_an_instance_becomes_a_ready_cluster_retain_lets_it_go_delete_backs_it_up_then_removes_it(
    cloud_client: Client, node: LocalNode, namespace: str, db_class: str, control_plane: Endpoint
) -> None:
    client = cloud_client
    store: Store = await start_store(client, namespace)
    instances = HttpInstanceClient()
    postgres = Operator(control_plane, namespace, instances=instances, default_backup_repository=store.repository())
    try:
        async with postgres.running(refresh=2.0), cloud_operator(client, namespace):
            await _retain_half(client, namespace, db_class)
            await _delete_half(client, namespace, db_class, store)
    finally:
        await instances.close()


async def _retain_half(client: Client, namespace: str, db_class: str) -> None:
    await client.create(INSTANCE, instance("orders", namespace, db_class))
    obj = await eventually(lambda: instance_ready(client, namespace, "orders"), timeout=240, interval=1)
    status = obj["status"]
    assert (status["provider"], status["externalId"], status["state"]) == ("kanri", f"{namespace}/orders", "available")
    assert status["unsupported"] == []
    cluster = await client.get(POSTGRES_CLUSTER, "orders", namespace)
    assert cluster["metadata"]["labels"][OWNER_LABEL] == obj["metadata"]["uid"]
    assert (cluster["spec"]["version"], cluster["spec"]["storage"]["size"]) == (15, "1Gi")
    secret = status["connectionSecret"]
    await query(client, namespace, secret, "CREATE TABLE t (x int); INSERT INTO t VALUES (1)")
    assert await query(client, namespace, secret, "SELECT x FROM t") == [(1,)]

    # Retain (the default): the DatabaseInstance goes, the cluster keeps running, let go of.
    await client.delete(INSTANCE, "orders", namespace)
    await eventually(lambda: gone(lambda: client.get(INSTANCE, "orders", namespace)), timeout=60)
    kept = await client.get(POSTGRES_CLUSTER, "orders", namespace)
    assert not kept["metadata"].get("deletionTimestamp")
    # No spec write since the create through every poll of a Ready cluster (the anchors' endless-update bug).
    assert kept["metadata"]["generation"] == 1
    assert OWNER_LABEL not in (kept["metadata"].get("labels") or {})
    assert kept["metadata"]["annotations"][RELEASED] == f"{namespace}/orders"
    assert kept["metadata"]["annotations"][FOR_INSTANCE] == f"{namespace}/orders"
    # The connection Secret stays for whoever takes the database over, and still connects.
    assert await eventually(lambda: answers(client, namespace, secret, "SELECT x FROM t"), timeout=30) == [(1,)]


async def _delete_half(client: Client, namespace: str, db_class: str, store: Store) -> None:
    # Adopted by ID, then deleted under Delete: the final backup first, then the cluster and its data.
    again = instance("again", namespace, db_class, adoptExternalId=f"{namespace}/orders", deletionPolicy="Delete")
    await client.create(INSTANCE, again)
    obj = await eventually(lambda: instance_ready(client, namespace, "again"), timeout=120, interval=1)
    assert obj["status"]["externalId"] == f"{namespace}/orders"
    assert "lastOperation" not in obj["status"]  # adopted as it is: nothing created, nothing modified
    claims = (await client.list(PVC, namespace, label_selector="kanri.dev/cluster=orders,kanri.dev/instance"))[0]
    assert claims, "the cluster's data claims before the delete"

    await client.delete(INSTANCE, "again", namespace)
    final = naming.final_snapshot_id(f"{namespace}/orders", obj["metadata"]["uid"])
    await eventually(lambda: gone(lambda: client.get(INSTANCE, "again", namespace)), timeout=240, interval=1)
    backup = await client.get(POSTGRES_BACKUP, final, namespace)
    assert backup["status"]["phase"] == "Completed", backup.get("status")
    await eventually(lambda: gone(lambda: client.get(POSTGRES_CLUSTER, "orders", namespace)), timeout=120)

    async def claims_gone() -> bool:
        found, _ = await client.list(PVC, namespace, label_selector="kanri.dev/cluster=orders,kanri.dev/instance")
        return not found

    await eventually(claims_gone, timeout=120, interval=1)
    # The final backup outlives the cluster, as an RDS final snapshot outlives its instance.
    base = await store.keys_under(f"e2e/{namespace}/orders/base/{backup['status']['backupId']}/")
    assert base, "the final backup's objects in the repository"
