"""Continuous WAL archiving end to end: the object store a workload of the local cluster (SeaweedFS in a StatefulSet,
kanri.local.seaweedfs), the platform's default repository pointing at its Service, real PostgreSQL 15 and real
Barman Cloud in the instances' pods, the operator's real Manager.

- archiving works, the store stopped (its StatefulSet scaled to 0) shows as ContinuousArchiving=False/ArchiveFailing
  with an Event and the metric while pg_wal keeps the segment; started again, archiving catches up with no gap;
  deletionPolicy Delete removes the cluster's objects, and only those;
- (faults) a switchover: archiving goes on on the new timeline (its .history file and a 00000002 segment in the
  bucket); deletionPolicy Retain keeps the objects.
"""

from __future__ import annotations

import asyncio
import base64
import re
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.imagemap import POSTGRES_IMAGE, default_image_map
from kanri.local.node import LocalNode, NodeOptions
from kanri.local.seaweedfs import S3_BUCKET, S3_PORT, S3_SERVICE, backup_tools_bin, keys_secret, new_keys, object_store
from kanri.postgres import names
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.backup.s3 import S3Client, S3Keys
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.ha.failover import SWITCHOVER
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import EVENT, POD, SECRET, SERVICE, STATEFUL_SET
from tests.e2e.postgres_helpers import cluster, cluster_ip, gone, ready, write_row
from tests.local_node_support import running_node, with_test_network
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
pytestmark = [
    pytest.mark.timeout(420),
    pytest.mark.skipif(
        not (backup_tools_bin() / "barman-cloud-wal-archive").exists() or not (backup_tools_bin() / "weed").exists(),
        reason="no backup tools (make backup-tools)",
    ),
]
SEGMENT = re.compile(r"/wals/[0-9A-F]{16}/([0-9A-F]{24})(\.[a-z0-9]+)?$")
NEIGHBOUR = "archive/wals/0000000100000000/000000010000000000000001.gz"
"""Under the namespace's folder of the default repository (``e2e/<namespace>/``)."""
HISTORY = re.compile(r"/wals/([0-9A-F]{8})\.history(\.[a-z0-9]+)?$")


@dataclass
class Store:
    """The object store deployed in the test's namespace, and how the test reaches it (the Service's ClusterIP)."""

    namespace: str
    endpoint: str
    keys: S3Keys

    async def keys_under(self, prefix: str) -> list[str]:
        async with S3Client(self.endpoint, self.keys) as s3:
            return await s3.list_keys(S3_BUCKET, prefix)

    async def delete(self, keys: list[str]) -> int:
        async with S3Client(self.endpoint, self.keys) as s3:
            return await s3.delete_keys(S3_BUCKET, keys)

    def repository(self) -> S3Repository:
        """The platform's default repository the e2e operators are given: this store, folder ``e2e/``."""
        return S3Repository.model_validate({"endpoint": self.endpoint, "bucket": S3_BUCKET, "path": "e2e",
                                            "credentialsSecret": {"name": f"{S3_SERVICE}-keys"}})  # fmt: skip


@pytest_asyncio.fixture(loop_scope="session")
async def node(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[LocalNode]:
    """The conftest's node, but one archive attempt may take 20 s instead of 60 (an unreachable store fails sooner)."""
    images = default_image_map()
    for entry in images:
        if entry["image"].startswith(POSTGRES_IMAGE):
            entry["env"] = entry["env"] | {"KANRI_ARCHIVE_TIMEOUT": "20"}
    name = f"test-ar-{secrets.token_hex(3)}"
    options = with_test_network(
        NodeOptions(data_dir=tmp_path / "node", name=name, images=images, restart_backoff_base=0.5,
                    restart_backoff_max=5.0)
    )  # fmt: skip
    async with running_node(control_plane.kubeconfig, options) as local:
        yield local


async def start_store(
    client: Client, namespace: str, node: str | None = None, image: str | None = None, storage_class: str | None = None
) -> Store:
    """The object store deployed in ``namespace`` (its pod bound to ``node``, its image and volume class replaced,
    when given), ready."""
    keys = new_keys()
    await client.create(SECRET, keys_secret(namespace, keys))
    service, stateful_set = object_store(namespace, size="1Gi")
    if node is not None:
        stateful_set["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    if image is not None:
        stateful_set["spec"]["template"]["spec"]["containers"][0]["image"] = image
    if storage_class is not None:
        stateful_set["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] = storage_class
    await client.create(SERVICE, service)
    await client.create(STATEFUL_SET, stateful_set)
    endpoint = f"http://{await cluster_ip(client, namespace, S3_SERVICE)}:{S3_PORT}"
    found = Store(namespace, endpoint, S3Keys(keys.access_key_id, keys.secret_access_key))
    await eventually(lambda: _store_ready(client, found), timeout=90, interval=0.5)
    return found


@pytest_asyncio.fixture(loop_scope="session")
async def store(client: Client, node: LocalNode, namespace: str) -> Store:
    return await start_store(client, namespace)


async def _store_ready(client: Client, store: Store) -> bool:
    """The pod is Ready and the bucket it was told to create answers a listing."""
    pods = (await client.list(POD, store.namespace, label_selector=f"app.kubernetes.io/name={S3_SERVICE}"))[0]
    conditions = [get_condition((p.get("status") or {}).get("conditions"), "Ready") for p in pods]
    if not any(c is not None and c["status"] == "True" for c in conditions):
        return False
    try:
        await store.keys_under("")
    except Exception:
        return False
    return True


@pytest_asyncio.fixture(loop_scope="session")
async def archiving_operator(control_plane: Endpoint, namespace: str, store: Store) -> AsyncIterator[Operator]:
    """The operator with the platform's default repository: the store's Service, its key Secret in the operator's
    (here: the test's) namespace."""
    instances = HttpInstanceClient()
    try:
        yield Operator(control_plane, namespace, instances=instances, default_backup_repository=store.repository())
    finally:
        await instances.close()


async def _superuser_connect(client: Client, namespace: str, name: str) -> psycopg.AsyncConnection[Any]:
    """A superuser connection to the primary through ``-rw``."""
    secret = await client.get(SECRET, names.superuser_secret(name), namespace)
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    host = await cluster_ip(client, namespace, f"{name}-rw")
    return await psycopg.AsyncConnection.connect(host=host, port=5432, user=data["username"],
                                                 password=data["password"], dbname="postgres", connect_timeout=5,
                                                 autocommit=True)  # fmt: skip


async def superuser_sql(client: Client, namespace: str, name: str, query: str) -> list[Any] | None:
    """``query``'s rows on the primary as the superuser (through ``-rw``); None while it cannot answer."""
    try:
        async with await _superuser_connect(client, namespace, name) as conn:
            return list(await (await conn.execute(query)).fetchall())
    except psycopg.Error:
        return None


async def superuser_rows(client: Client, namespace: str, name: str, query: str, timeout: float = 30) -> list[Any]:
    """``query``'s rows on the primary as the superuser (through ``-rw``), retried only while no connection can be
    made: a new cluster's Service route can lag its Ready condition by a moment. A failed query raises; a command
    answers [] (run once: a connection that failed never sent it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        try:
            conn = await _superuser_connect(client, namespace, name)
        except psycopg.OperationalError:
            if loop.time() > deadline:
                raise
            await asyncio.sleep(1)
            continue
        async with conn:
            cursor = await conn.execute(query)
            return list(await cursor.fetchall()) if cursor.description is not None else []  # a command: no rows


async def switch_wal(client: Client, namespace: str, name: str) -> str:
    """Write a row, then close the current segment; its file name."""
    await write_row(client, namespace, name, 1)
    rows = await eventually(lambda: superuser_sql(client, namespace, name, "SELECT pg_walfile_name(pg_switch_wal())"))
    return str(rows[0][0])


async def archiving(client: Client, namespace: str, name: str, status: str, reason: str) -> Obj | None:
    found = await client.get(POSTGRES_CLUSTER, name, namespace)
    condition = get_condition((found.get("status") or {}).get("conditions"), "ContinuousArchiving")
    ok = condition is not None and condition["status"] == status and condition["reason"] == reason
    return found if ok else None


def segments(keys: list[str]) -> list[str]:
    return sorted(m.group(1) for key in keys if (m := SEGMENT.search(key)))


def number(segment: str) -> int:
    """A segment's position on its timeline (16 MiB segments: 256 per log id)."""
    return int(segment[8:16], 16) * 0x100 + int(segment[16:24], 16)


def gaps(found: list[str]) -> list[str]:
    """Segments missing between the first and the last archived one of each timeline."""
    missing: list[str] = []
    for timeline in sorted({s[:8] for s in found}):
        present = {number(s) for s in found if s.startswith(timeline)}
        missing += [f"{timeline}:{n:X}" for n in range(min(present), max(present)) if n not in present]
    return missing


async def warning_events(client: Client, namespace: str, reason: str) -> list[str]:
    events, _ = await client.list(EVENT, namespace)
    return [str(e.get("message")) for e in events if e.get("reason") == reason and e.get("type") == "Warning"]


async def test_archiving_survives_the_object_store_stopping_with_no_gap_and_delete_removes_the_backups(
    client: Client, store: Store, archiving_operator: Operator, namespace: str
) -> None:
    operator = archiving_operator
    manifest = cluster("arch", namespace, 1, backup={"retentionDays": 14}, deletionPolicy="Delete")
    await client.create(POSTGRES_CLUSTER, manifest)
    # another cluster's objects next to it: Delete must not touch them ("arch" is a prefix of "archive")
    async with S3Client(store.endpoint, store.keys) as s3:
        await s3.put(S3_BUCKET, f"e2e/{namespace}/{NEIGHBOUR}", b"not ours")
    async with operator.running(refresh=2.0):
        await eventually(lambda: ready(client, namespace, "arch", 1), timeout=180, interval=1)
        first = await switch_wal(client, namespace, "arch")
        await eventually(lambda: archiving(client, namespace, "arch", "True", "Archiving"), timeout=60, interval=1)
        prefix = f"e2e/{namespace}/arch/"  # the shared default repository: a folder per namespace
        await eventually(lambda: _has(store, prefix, first), timeout=60, interval=1)

        # The store stops: the next segment cannot be archived, and that shows everywhere it should.
        await client.patch(STATEFUL_SET, S3_SERVICE, {"spec": {"replicas": 0}}, namespace)
        await eventually(lambda: _no_store_pods(client, namespace), timeout=60, interval=0.5)
        stuck = await switch_wal(client, namespace, "arch")
        failing = await eventually(lambda: archiving(client, namespace, "arch", "False", "ArchiveFailing"),
                                   timeout=120, interval=1)  # fmt: skip
        condition = get_condition(failing["status"]["conditions"], "ContinuousArchiving")
        assert condition is not None
        assert "cannot archive" in condition["message"]
        metric = {"namespace": namespace, "cluster": "arch"}
        assert operator.registry.get_sample_value("kanri_postgres_archiving_failing", metric) == 1
        assert await eventually(lambda: warning_events(client, namespace, "ArchiveFailing"), timeout=30)
        ready_files = await superuser_sql(client, namespace, "arch", "SELECT pg_ls_dir('pg_wal/archive_status')")
        assert ready_files is not None
        assert f"{stuck}.ready" in {row[0] for row in ready_files}  # kept in pg_wal until it is archived
        await switch_wal(client, namespace, "arch")  # a second segment waits too

        # Started again: archiving catches up, every segment from the first to the last is there.
        await client.patch(STATEFUL_SET, S3_SERVICE, {"spec": {"replicas": 1}}, namespace)
        await eventually(lambda: _store_ready(client, store), timeout=90, interval=0.5)
        last = await switch_wal(client, namespace, "arch")
        await eventually(lambda: _has(store, prefix, last), timeout=120, interval=1)
        await eventually(lambda: archiving(client, namespace, "arch", "True", "Archiving"), timeout=60, interval=1)
        assert operator.registry.get_sample_value("kanri_postgres_archiving_failing", metric) == 0
        found = segments(await store.keys_under(prefix))
        assert first in found
        assert stuck in found
        assert gaps(found) == []

        # deletionPolicy Delete: once the pods are gone, the cluster's objects go; the neighbour's stay.
        await client.delete(POSTGRES_CLUSTER, "arch", namespace)
        await eventually(lambda: gone(client, namespace, "arch"), timeout=120, interval=1)
        assert await store.keys_under(prefix) == []
        assert await store.keys_under(f"e2e/{namespace}/archive/") == [f"e2e/{namespace}/{NEIGHBOUR}"]
        events, _ = await client.list(EVENT, namespace)
        assert any(e.get("reason") == "BackupsDeleted" for e in events)


async def _has(store: Store, prefix: str, segment: str) -> bool:
    return segment in segments(await store.keys_under(prefix))


async def _no_store_pods(client: Client, namespace: str) -> bool:
    pods = (await client.list(POD, namespace, label_selector=f"app.kubernetes.io/name={S3_SERVICE}"))[0]
    return not pods


@pytest.mark.faults
async def test_archiving_follows_a_switchover_onto_the_new_timeline_and_retain_keeps_the_backups(
    client: Client, store: Store, archiving_operator: Operator, namespace: str
) -> None:
    operator = archiving_operator
    await client.create(POSTGRES_CLUSTER, cluster("tl", namespace, 2, backup={"retentionDays": 14}))
    async with operator.running(refresh=2.0):
        found = await eventually(lambda: ready(client, namespace, "tl", 2), timeout=240, interval=1)
        old = found["status"]["currentPrimary"]
        await switch_wal(client, namespace, "tl")
        await eventually(lambda: archiving(client, namespace, "tl", "True", "Archiving"), timeout=60, interval=1)
        target = next(i for i in ("tl-1", "tl-2") if i != old)
        await client.patch(POSTGRES_CLUSTER, "tl", {"metadata": {"annotations": {SWITCHOVER: target}}}, namespace)

        async def switched() -> Obj | None:
            now = await ready(client, namespace, "tl", 2)
            return now if now is not None and now["status"].get("currentPrimary") == target else None

        await eventually(switched, timeout=120, interval=1)
        segment = await switch_wal(client, namespace, "tl")
        assert segment.startswith("00000002")
        prefix = f"e2e/{namespace}/tl/"

        async def new_timeline() -> bool:
            keys = await store.keys_under(prefix)
            histories = {m.group(1) for key in keys if (m := HISTORY.search(key))}
            return "00000002" in histories and segment in segments(keys)

        await eventually(new_timeline, timeout=120, interval=1)
        await eventually(lambda: archiving(client, namespace, "tl", "True", "Archiving"), timeout=60, interval=1)
        assert gaps([s for s in segments(await store.keys_under(prefix)) if s.startswith("00000002")]) == []

        # deletionPolicy Retain (the default): the objects outlive the cluster.
        before = await store.keys_under(prefix)
        await client.delete(POSTGRES_CLUSTER, "tl", namespace)
        await eventually(lambda: gone(client, namespace, "tl"), timeout=120, interval=1)
        after = await store.keys_under(prefix)
        assert set(before) <= set(after)
        events, _ = await client.list(EVENT, namespace)
        assert any(e.get("reason") == "BackupsRetained" for e in events)
