"""A tenant names its own "S3" server as its clusters' repository (issue 33, item 2), played against the operator's
real Manager with the test's hostile server on 127.0.0.1 (tests/hostile_s3.py; the e2e operator runs on the host):

- the server answers every ListObjectsV2 with IsTruncated=true and a fresh token; the tenant deletes as many clusters
  as the operator has reconcile workers, with deletionPolicy Delete. Another tenant's new cluster still gets its
  status within its usual time (measured in the same test before), the server gets at most the page limit of
  requests per attempt, and the tenant's clusters say so in BackupsDeleted=False/DeleteFailing, naming the limit;
- with an allow-list of endpoints configured, a cluster naming another endpoint shows ContinuousArchiving=False,
  reason EndpointNotAllowed, is deleted with deletionPolicy Delete all the same, and the server receives nothing.

Before this change the first test fails: each deleted cluster's finalizer paged forever inside a reconcile worker,
so the other tenant's cluster got no status at all (the issue measured 100 s against 1.5 s).
"""

from __future__ import annotations

import base64
import functools
import json
import re
import secrets
import time
from typing import Any

import pytest

from kanri.local import Endpoint
from kanri.postgres.backup.s3 import MAX_PAGES
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client, get_condition
from kanri.runtime.kinds import EVENT, NAMESPACE
from tests.e2e.postgres_helpers import cluster, gone
from tests.e2e.test_tenant_forged_pods_e2e import kubectl, tenant
from tests.hostile_s3 import HostileS3, hostile_s3
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
pytestmark = pytest.mark.timeout(600)
WORKERS = 4
"""The operator's reconcile workers (OperatorOptions.max_concurrent_reconciles): as many hostile clusters."""


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


async def _tenant_keys(control_plane: Endpoint, namespace: str, who: str) -> None:
    """The tenant's key Secret for its own store, made by the tenant (a namespace admin)."""
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "own-store-keys", "namespace": namespace},
              "data": {"accessKeyId": _b64("tenantkey"), "secretAccessKey": _b64(secrets.token_hex(16))}}  # fmt: skip
    await kubectl(control_plane, namespace, "create", "-f", "-", stdin=json.dumps(secret), who=who)


def _own_repository(server: HostileS3, bucket: str) -> Obj:
    return {"s3": {"endpoint": server.endpoint, "bucket": bucket, "credentialsSecret": {"name": "own-store-keys"}}}


async def _status_seen(client: Client, namespace: str, name: str) -> Obj | None:
    found = await client.get(POSTGRES_CLUSTER, name, namespace)
    status = found.get("status") or {}
    return status if status.get("phase") or status.get("conditions") else None


async def _time_to_status(client: Client, namespace: str, name: str, deadline: float) -> float:
    """Seconds from creating a cluster to its first status (phase or a condition); fails after ``deadline``."""
    started = time.monotonic()
    await client.create(POSTGRES_CLUSTER, cluster(name, namespace, 1))
    try:
        await eventually(lambda: _status_seen(client, namespace, name), timeout=deadline, interval=0.1)
    except TimeoutError:
        last = (await client.get(POSTGRES_CLUSTER, name, namespace)).get("status")
        raise AssertionError(f"{namespace}/{name} had no status {deadline:.0f}s after it was created (its status: "
                             f"{last!r}): the operator's workers were busy elsewhere") from None  # fmt: skip
    return time.monotonic() - started


async def _condition(client: Client, namespace: str, name: str, kind: str) -> Obj | None:
    try:
        found = await client.get(POSTGRES_CLUSTER, name, namespace)
    except ApiError as exc:
        if exc.not_found:
            return None
        raise
    return get_condition((found.get("status") or {}).get("conditions") or [], kind)


def _per_bucket(server: HostileS3) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, path in server.requests:
        bucket = path.strip("/").split("/", 1)[0]
        counts[bucket] = counts.get(bucket, 0) + 1
    return counts


async def test_a_tenant_store_that_pages_forever_delays_no_other_tenants_cluster(
    client: Client, control_plane: Endpoint, namespace: str
) -> None:
    other = f"tenant-b-{secrets.token_hex(3)}"
    labels = {"kanri.dev/test": "true"}
    await client.create(
        NAMESPACE, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other, "labels": labels}}
    )
    instances = HttpInstanceClient()
    hostile = [f"hostile-{i}" for i in range(WORKERS)]
    try:
        async with hostile_s3("pages") as server:
            operator = Operator(control_plane, namespace, instances=instances, also_watch=(other,))
            async with operator.running() as manager:

                async def synced() -> bool:
                    return manager.ready()

                await eventually(synced, timeout=60)
                # The usual time, measured here: another tenant's new cluster, nothing else going on.
                baseline = await _time_to_status(client, other, "baseline", deadline=120)
                bound = 3 * baseline + 10

                # Tenant A, a namespace admin: clusters archiving to its own server, deleted with deletionPolicy
                # Delete, every write through kubectl --as the tenant.
                who = await tenant(control_plane, namespace)
                await _tenant_keys(control_plane, namespace, who)
                for i, name in enumerate(hostile):
                    body = cluster(name, namespace, 0, deletionPolicy="Delete",
                                   backup={"repository": _own_repository(server, f"bucket-{i}")})  # fmt: skip
                    await kubectl(control_plane, namespace, "create", "-f", "-", stdin=json.dumps(body), who=who)
                for name in hostile:
                    await eventually(functools.partial(_status_seen, client, namespace, name), timeout=120)
                for name in hostile:
                    await kubectl(control_plane, namespace, "delete", "postgrescluster", name, "--wait=false",
                                  who=who)  # fmt: skip

                # the finalizer's deletion is under way against the hostile server
                async def paging() -> bool:
                    return len(server.requests) > 10

                await eventually(paging, timeout=120, interval=0.1)
                before = len(server.requests)

                # Tenant B's new cluster gets its status within its usual time all the same.
                during = await _time_to_status(client, other, "during", deadline=bound + 60)
                print(f"time to first status: baseline {baseline:.2f}s, during the hostile deletion {during:.2f}s "
                      f"(bound {bound:.1f}s); hostile requests meanwhile: {len(server.requests) - before}")  # fmt: skip
                pending = [n for n in hostile if await _condition(client, namespace, n, "BackupsDeleted")]
                assert pending, "the hostile clusters were no longer being deleted during the measurement"
                assert during < bound, (f"{during:.1f}s to a status while a tenant's store pages forever; usual "
                                        f"{baseline:.1f}s")  # fmt: skip

                # The tenant's cluster names the limit; the server never got more than the limit per attempt.
                async def failing() -> Obj | None:
                    found = await _condition(client, namespace, hostile[0], "BackupsDeleted")
                    if found is None or found.get("reason") != "DeleteFailing":
                        return None
                    return found if f"limit of {MAX_PAGES} pages" in str(found.get("message")) else None

                try:
                    condition = await eventually(failing, timeout=180, interval=0.2)
                except TimeoutError as exc:
                    last = await _condition(client, namespace, hostile[0], "BackupsDeleted")
                    raise AssertionError(f"BackupsDeleted of {hostile[0]} never named the page limit: {last}") from exc
                attempts = int(re.findall(r"attempt (\d+)", str(condition["message"]))[0])
                counts = _per_bucket(server)
                print(f"BackupsDeleted of {hostile[0]}: {condition['message']}; requests per bucket: {counts}")
                assert counts["bucket-0"] <= MAX_PAGES * (attempts + 1), counts
                assert counts["bucket-0"] > 0, counts
                # one deletion at a time in the tenant's namespace: the others queue, the namespace's work is bounded
                running = sum(1 for n in counts.values() if n % MAX_PAGES)
                assert running <= 1, f"more than one deletion at a time in one namespace: {counts}"
                assert "tenantkey" not in str(condition["message"])

                # Tenant B's clusters go normally (their finalizers are not stuck behind tenant A's).
                for name in ("baseline", "during"):
                    await client.delete(POSTGRES_CLUSTER, name, other)
                for name in ("baseline", "during"):
                    await eventually(functools.partial(gone, client, other, name), timeout=120)
                # and tenant A's, released by hand (the documented escape) so the namespace can go
                for name in hostile:
                    await client.patch(POSTGRES_CLUSTER, name, {"metadata": {"finalizers": None}}, namespace)
    finally:
        await instances.close()
        await client.delete(NAMESPACE, other)


async def test_an_endpoint_outside_the_allow_list_is_refused_and_never_called(
    client: Client, control_plane: Endpoint, namespace: str
) -> None:
    instances = HttpInstanceClient()
    try:
        async with hostile_s3("pages") as server:
            operator = Operator(control_plane, namespace, instances=instances,
                                allowed_backup_endpoints=("minio.storage.svc:9000",))  # fmt: skip
            async with operator.running():
                who = await tenant(control_plane, namespace)
                await _tenant_keys(control_plane, namespace, who)
                body = cluster("refused", namespace, 1, deletionPolicy="Delete",
                               backup={"repository": _own_repository(server, "tenant-bucket")})  # fmt: skip
                await kubectl(control_plane, namespace, "create", "-f", "-", stdin=json.dumps(body), who=who)

                async def refused() -> Obj | None:
                    found = await _condition(client, namespace, "refused", "ContinuousArchiving")
                    return found if found is not None and found.get("reason") == "EndpointNotAllowed" else None

                condition = await eventually(refused, timeout=120)
                assert condition["status"] == "False"
                assert server.endpoint in condition["message"]
                assert "--allowed-backup-endpoint" in condition["message"]
                # deleted with deletionPolicy Delete: the finalizer calls nothing there either, and lets go
                await kubectl(control_plane, namespace, "delete", "postgrescluster", "refused", "--wait=false",
                              who=who)  # fmt: skip
                await eventually(lambda: gone(client, namespace, "refused"), timeout=120)

                async def told() -> list[Obj]:
                    events, _ = await client.list(EVENT, namespace)
                    return [e for e in events if e.get("reason") == "BackupsNotDeleted"]

                (event, *_) = await eventually(told, timeout=30)
                assert server.endpoint in event["message"]
        assert server.requests == [], f"the operator called an endpoint it does not allow: {server.requests[:5]}"
    finally:
        await instances.close()
