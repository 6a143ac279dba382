"""The default backup repository is a tenant boundary (issue 33 item 1), played as the hostile tenant of the report: a
ServiceAccount bound to the built-in ``admin`` ClusterRole plus a Role for kanri's kinds in its own namespace only,
every write through ``kubectl --as``.

The platform's namespace (the test's) holds the object store and its key pair, the operator's default repository.
Tenant B's cluster ``payroll`` holds a secret row and has its first base backup. Tenant A:

- makes a cluster ``orders`` with ``backup: {retentionDays: 1}`` and reads the key pair the operator put into its
  ``orders-backup-credentials`` (a namespace admin may read its Secrets): it is not the platform's, and with it the
  store refuses listing the bucket, listing B's folder, reading B's backup and planting an object in B's folder, while
  A's own folder works — and ``orders`` archives with those keys (``ContinuousArchiving=True``), as ``payroll``
  took its base backup with B's;
- asks the operator to restore B's database through its own ``bootstrap.recovery`` naming the platform's store,
  path ``<path>/<B>`` and the copied Secret (the report's attack, ``Restored=True`` in 40 s before the fix): the
  cluster reports ``Restored=False`` ``ForeignRepositoryFolder`` naming both folders, and no pod of it is made.

On the code before the fix, ``orders-backup-credentials`` held the platform's keys: the first listing of B's folder
succeeded (the test fails there), and the restore reached ``Restored=True`` with B's row.
"""

from __future__ import annotations

import base64
import json
import secrets
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from kanri.contract.backup import ACCESS_KEY_FILE, SECRET_KEY_FILE
from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.local.seaweedfs import S3_BUCKET, backup_tools_bin
from kanri.postgres import names
from kanri.postgres.backup.s3 import S3Client, S3Error, S3Keys
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import POD
from tests.e2e.postgres_helpers import cluster, ready, write_row
from tests.e2e.test_backup_archiving_e2e import Store, archiving, start_store, switch_wal
from tests.e2e.test_tenant_forged_pods_e2e import kubectl, tenant
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not (backup_tools_bin() / "barman-cloud-wal-archive").exists() or not (backup_tools_bin() / "weed").exists(),
        reason="no backup tools (make backup-tools)",
    ),
]


async def other_namespace(kube_api: k8s.ApiClient, stem: str) -> str:
    name = f"{stem}-{secrets.token_hex(3)}"
    await k8s.CoreV1Api(kube_api).create_namespace(
        k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name, labels={"kanri.dev/test": "true"}))
    )
    return name


async def completed_backup(client: Client, namespace: str, name: str) -> Obj | None:
    found = (await client.list(POSTGRES_BACKUP, namespace))[0]
    done = [b for b in found if b["spec"]["cluster"] == name and (b.get("status") or {}).get("phase") == "Completed"]
    return done[0] if done else None


async def refused(what: str, attempt: Any) -> str:
    try:
        await attempt
    except S3Error as exc:
        return str(exc)
    raise AssertionError(f"the store allowed the tenant to {what} with the keys the operator gave it")


async def restored_condition(client: Client, namespace: str, name: str) -> Obj | None:
    found = await client.get(POSTGRES_CLUSTER, name, namespace)
    return get_condition((found.get("status") or {}).get("conditions"), "Restored")


async def test_a_namespace_admin_cannot_reach_another_namespaces_backups_with_the_keys_it_is_given(
    client: Client, control_plane: Endpoint, node: LocalNode, namespace: str, kube_api: k8s.ApiClient
) -> None:
    store: Store = await start_store(client, namespace)
    tenant_a = await other_namespace(kube_api, "tenant-a")
    tenant_b = await other_namespace(kube_api, "tenant-b")
    instances = HttpInstanceClient()
    operator = Operator(control_plane, namespace, instances=instances, default_backup_repository=store.repository(),
                        also_watch=(tenant_a, tenant_b))  # fmt: skip
    core = k8s.CoreV1Api(kube_api)
    try:
        async with operator.running(refresh=2.0):
            # tenant B: a cluster with a secret row and its first base backup, in its folder of the default repository
            await client.create(POSTGRES_CLUSTER, cluster("payroll", tenant_b, 1, backup={"retentionDays": 1}))
            # tenant A, a namespace admin of its own namespace only, makes a cluster that archives to the default
            # (at once: both bootstrap side by side; nothing below reads A's cluster before B's backup is complete)
            who = await tenant(control_plane, tenant_a)
            orders = cluster("orders", tenant_a, 1, backup={"retentionDays": 1})
            await kubectl(control_plane, tenant_a, "create", "-f", "-", stdin=json.dumps(orders), who=who)
            await eventually(lambda: ready(client, tenant_b, "payroll", 1), timeout=240, interval=1)
            await write_row(client, tenant_b, "payroll", 4242)
            await eventually(lambda: completed_backup(client, tenant_b, "payroll"), timeout=240, interval=1)

            secret_name = names.backup_secret("orders")
            raw = json.loads(await eventually(
                lambda: _secret_as(control_plane, tenant_a, secret_name, who), timeout=120, interval=1))  # fmt: skip
            given = S3Keys(base64.b64decode(raw["data"][ACCESS_KEY_FILE]).decode(),
                           base64.b64decode(raw["data"][SECRET_KEY_FILE]).decode())  # fmt: skip
            assert given.access_key_id != store.keys.access_key_id, "the platform's own key pair was handed out"
            assert given.secret_access_key != store.keys.secret_access_key, "the platform's secret was handed out"

            own, theirs = f"e2e/{tenant_a}/", f"e2e/{tenant_b}/"
            async with S3Client(store.endpoint, store.keys) as platform:
                victims = await platform.list_keys(S3_BUCKET, theirs + "payroll/base/")
            assert victims, f"no base backup of payroll under {theirs}"
            async with S3Client(store.endpoint, given) as s3:
                for what, attempt in (
                    ("list the bucket", s3.list_keys(S3_BUCKET, "")),
                    ("list every namespace's folder", s3.list_keys(S3_BUCKET, "e2e/")),
                    ("list another namespace's folder", s3.list_keys(S3_BUCKET, theirs)),
                    ("plant an object in another namespace's folder", s3.put(S3_BUCKET, theirs + "payroll/x", b"x")),
                    ("plant a look-alike folder", s3.put(S3_BUCKET, f"e2e/{tenant_a}x/y", b"x")),
                ):
                    message = await refused(what, attempt)
                    assert "HTTP 403" in message, (what, message)
                    assert given.secret_access_key not in message
                message = await refused("delete another namespace's backup", s3.delete_keys(S3_BUCKET, victims[:1]))
                assert "AccessDenied" in message, message
                await s3.put(S3_BUCKET, own + "probe", b"the own folder works")
                assert own + "probe" in await s3.list_keys(S3_BUCKET, own)
                await s3.delete_keys(S3_BUCKET, [own + "probe"])
            async with S3Client(store.endpoint, store.keys) as platform:
                assert await platform.list_keys(S3_BUCKET, theirs + "payroll/base/") == victims

            # the keys A was given are the ones its cluster archives with, and that works
            await eventually(lambda: ready(client, tenant_a, "orders", 1), timeout=240, interval=1)
            segment = await switch_wal(client, tenant_a, "orders")
            await eventually(lambda: _archived(store, own + "orders/", segment), timeout=120, interval=1)
            await eventually(lambda: archiving(client, tenant_a, "orders", "True", "Archiving"), timeout=60)

            # the report's attack: restore B's database through the operator, naming B's folder and A's keys
            recovery = {"source": "payroll", "repository": {"s3": {
                "endpoint": store.endpoint, "bucket": S3_BUCKET, "path": f"e2e/{tenant_b}",
                "credentialsSecret": {"name": secret_name, "accessKeyIdKey": ACCESS_KEY_FILE,
                                      "secretAccessKeyKey": SECRET_KEY_FILE}}}}  # fmt: skip
            thief = cluster("thief", tenant_a, 1, bootstrap={"recovery": recovery})
            await kubectl(control_plane, tenant_a, "create", "-f", "-", stdin=json.dumps(thief), who=who)
            condition = await eventually(lambda: _refused_restore(client, tenant_a), timeout=90, interval=1)
            assert f"'e2e/{tenant_b}'" in condition["message"], condition
            assert f"'e2e/{tenant_a}'" in condition["message"], condition
            described = await kubectl(control_plane, tenant_a, "describe", "postgrescluster", "thief", who=who)
            assert "ForeignRepositoryFolder" in described, described
            pods = (await client.list(POD, tenant_a, label_selector="kanri.dev/cluster=thief"))[0]
            assert pods == [], [p["metadata"]["name"] for p in pods]
            still = await restored_condition(client, tenant_a, "thief")
            assert still is not None, "the Restored condition went away"
            assert still["status"] == "False", still
    finally:
        await instances.close()
        for extra in (tenant_a, tenant_b):
            await core.delete_namespace(extra)


async def _secret_as(control_plane: Endpoint, namespace: str, name: str, who: str) -> str | None:
    """The Secret as the tenant reads it (its JSON), once the operator made it."""
    try:
        return await kubectl(control_plane, namespace, "get", "secret", name, "-o", "json", who=who)
    except AssertionError:
        return None


async def _archived(store: Store, prefix: str, segment: str) -> bool:
    return any(segment in key for key in await store.keys_under(prefix))


async def _refused_restore(client: Client, namespace: str) -> Obj | None:
    condition = await restored_condition(client, namespace, "thief")
    if condition is not None and condition.get("reason") == "ForeignRepositoryFolder":
        return condition
    if condition is not None and condition.get("status") == "True":
        raise AssertionError(f"another namespace's database was restored: {condition}")
    return None
