"""Each namespace's own identity in the default repository, made by the operator through a real SeaweedFS's IAM API
(kanri.postgres.backup.tenant_identity), its key pair kept in a Secret of the real API server: the store itself confines
the
keys to the namespace's folder (list, read, write, delete elsewhere are refused), a second call makes nothing new, a
lost or tampered Secret gets a new key and the old one stops working. No local node: no lock needed."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from kanri.local.seaweedfs import SeaweedFS, backup_tools_bin
from kanri.postgres.backup.iam import IamClient, IamError
from kanri.postgres.backup.s3 import S3Client, S3Error, S3Keys
from kanri.postgres.backup.tenant_identity import TenantIdentities, keys_secret_name, user_name
from kanri.runtime import Client, Kind
from kanri.runtime.kinds import SECRET
from tests.seaweedfs_support import bucket_store
from tests.support import eventually

pytestmark = [
    pytest.mark.skipif(not (backup_tools_bin() / "weed").exists(), reason="no backup tools (make backup-tools)"),
    pytest.mark.timeout(180),
]
BUCKET = "kanri-backups"
Obj = dict[str, Any]


class NoCache:
    """Nothing cached: every read goes to the API server."""

    def get(self, kind: Kind, name: str, namespace: str = "") -> Obj | None:
        return None


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def store() -> AsyncIterator[SeaweedFS]:
    async with bucket_store(BUCKET) as weed:
        yield weed


def platform(weed: SeaweedFS) -> S3Keys:
    return S3Keys(weed.keys.access_key_id, weed.keys.secret_access_key)


async def refused(coroutine: Any) -> str:
    try:
        await coroutine
    except S3Error as exc:
        return str(exc)
    raise AssertionError("the store allowed it")


async def test_each_namespace_gets_keys_the_store_confines_to_its_own_folder(
    store: SeaweedFS, client: Client, namespace: str
) -> None:
    identities = TenantIdentities(store.endpoint, BUCKET, "dev", namespace)
    alice = await identities.keys(client, NoCache(), platform(store), "tenant-a")
    bob = await identities.keys(client, NoCache(), platform(store), "tenant-b")
    assert alice.access_key_id != bob.access_key_id
    assert platform(store).access_key_id not in (alice.access_key_id, bob.access_key_id)
    async with S3Client(store.endpoint, bob) as s3:
        await s3.put(BUCKET, "dev/tenant-b/payroll/base/1/data.tar", b"salaries")
    async with S3Client(store.endpoint, alice) as s3:
        await s3.put(BUCKET, "dev/tenant-a/orders/wals/1.gz", b"mine")
        assert await s3.list_keys(BUCKET, "dev/tenant-a/") == ["dev/tenant-a/orders/wals/1.gz"]
        # everything outside its folder is refused by the store itself
        for attempt in (s3.list_keys(BUCKET, "dev/tenant-b/"), s3.list_keys(BUCKET, "dev/"), s3.list_keys(BUCKET, ""),
                        s3.put(BUCKET, "dev/tenant-b/payroll/base/1/data.tar", b"planted"),
                        s3.put(BUCKET, "dev/tenant-ab/x", b"look-alike folder")):  # fmt: skip
            message = await refused(attempt)
            assert "403" in message, message
            assert alice.secret_access_key not in message
        message = await refused(s3.delete_keys(BUCKET, ["dev/tenant-b/payroll/base/1/data.tar"]))
        assert "AccessDenied" in message, message
    async with S3Client(store.endpoint, bob) as s3:  # the object is still there
        assert await s3.list_keys(BUCKET, "dev/tenant-b/") == ["dev/tenant-b/payroll/base/1/data.tar"]
    # nor can the tenant's keys widen themselves through IAM
    async with IamClient(store.endpoint, alice) as iam:
        with pytest.raises(IamError):
            await iam.put_user_policy(user_name(BUCKET, "dev", "tenant-a"), "more", '{"Statement": []}')
        with pytest.raises(IamError):
            await iam.create_user("kanri-evil")
    # the key pair is kept in the operator's namespace
    kept = await client.get(SECRET, keys_secret_name("tenant-a"), namespace)
    assert base64.b64decode(kept["data"]["accessKeyId"]).decode() == alice.access_key_id


async def test_a_second_call_makes_nothing_and_a_lost_or_tampered_secret_gets_a_new_key(
    store: SeaweedFS, client: Client, namespace: str
) -> None:
    identities = TenantIdentities(store.endpoint, BUCKET, "idem", namespace)
    first = await identities.keys(client, NoCache(), platform(store), "shop")
    user = user_name(BUCKET, "idem", "shop")
    fresh = TenantIdentities(store.endpoint, BUCKET, "idem", namespace)  # a restarted operator: no memory
    assert await fresh.keys(client, NoCache(), platform(store), "shop") == first
    async with IamClient(store.endpoint, platform(store)) as iam:
        assert await iam.list_access_keys(user) == [first.access_key_id]
    # the kept Secret is lost: a new key, and the old one (nobody can tell who holds it) no longer works
    await client.delete(SECRET, keys_secret_name("shop"), namespace)
    second = await TenantIdentities(store.endpoint, BUCKET, "idem", namespace).keys(
        client, NoCache(), platform(store), "shop"
    )
    assert second.access_key_id != first.access_key_id
    async with IamClient(store.endpoint, platform(store)) as iam:
        assert await iam.list_access_keys(user) == [second.access_key_id]

    async def old_key_refused() -> bool:
        async with S3Client(store.endpoint, first) as s3:
            try:
                await s3.list_keys(BUCKET, "idem/shop/")
            except S3Error:
                return True
        return False

    await eventually(old_key_refused, timeout=30, interval=0.5)
    # a Secret holding a key id that is not the user's (here: the platform's own) is replaced, never used
    secret = await client.get(SECRET, keys_secret_name("shop"), namespace)
    secret["data"]["accessKeyId"] = base64.b64encode(platform(store).access_key_id.encode()).decode()
    await client.replace(SECRET, secret)
    third = await TenantIdentities(store.endpoint, BUCKET, "idem", namespace).keys(
        client, NoCache(), platform(store), "shop"
    )
    assert third.access_key_id not in (platform(store).access_key_id, second.access_key_id)
    async with S3Client(store.endpoint, third) as s3:
        assert await s3.list_keys(BUCKET, "idem/shop/") == []


async def test_a_store_without_a_writable_iam_api_fails_with_the_stores_reason(client: Client, namespace: str) -> None:
    async with bucket_store(BUCKET, "-s3.iam.readOnly=true") as weed:
        identities = TenantIdentities(weed.endpoint, BUCKET, "dev", namespace)

        async def failure() -> IamError | None:
            try:
                await identities.keys(client, NoCache(), platform(weed), "tenant-a")
            except IamError as exc:
                return exc if exc.code else None  # not up yet: try again
            return None

        error = await eventually(failure, timeout=60, interval=0.5)
        assert error.code == "AccessDenied", error
        assert weed.keys.secret_access_key not in str(error)
