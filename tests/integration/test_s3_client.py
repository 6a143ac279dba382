"""The operator's own S3 calls (kanri.postgres.backup.s3) against a real SeaweedFS: signed requests are accepted, keys
are
listed across pages and under a prefix only, deleted in batches, and a wrong secret is refused without the secret
showing in the error. No local node: no lock needed."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from kanri.local.seaweedfs import SeaweedFS, backup_tools_bin, s3_call
from kanri.postgres.backup.s3 import S3Client, S3Error, S3Keys
from tests.seaweedfs_support import bucket_store

pytestmark = [
    pytest.mark.skipif(not (backup_tools_bin() / "weed").exists(), reason="no backup tools (make backup-tools)"),
    pytest.mark.timeout(120),
]

BUCKET = "kanri-s3-client"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def store() -> AsyncIterator[SeaweedFS]:
    async with bucket_store(BUCKET) as weed:
        yield weed


def _client(weed: SeaweedFS, secret: str | None = None) -> S3Client:
    return S3Client(weed.endpoint, S3Keys(weed.keys.access_key_id, secret or weed.keys.secret_access_key))


async def test_lists_pages_under_a_prefix_and_deletes_only_those_keys(store: SeaweedFS) -> None:
    keys = [f"dev/orders/wals/0000000100000000/0000000100000000000000{i:02X}.gz" for i in range(1, 13)]
    keys += ["dev/orders/wals/00000002.history", "dev/orders/base/20261202T000000/data.tar"]
    others = ["dev/orders2/wals/x.gz", "dev/other/y"]
    async with _client(store) as s3:
        for key in keys + others:
            await s3.put(BUCKET, key, b"segment")
        # five keys a page: the client follows the continuation token to the end
        found = await s3.list_keys(BUCKET, "dev/orders/", page_size=5)
        assert sorted(found) == sorted(keys)
        assert s3_call(store.endpoint, store.keys, "list", BUCKET, "dev/orders/") == sorted(keys)
        assert await s3.delete_keys(BUCKET, found) == len(keys)
        assert await s3.list_keys(BUCKET, "dev/orders/") == []
        assert sorted(await s3.list_keys(BUCKET, "dev/")) == sorted(others)
        assert await s3.delete_keys(BUCKET, []) == 0


async def test_a_wrong_secret_is_refused_and_the_error_does_not_show_it(store: SeaweedFS) -> None:
    wrong = secrets.token_hex(16)
    async with _client(store, wrong) as s3:
        with pytest.raises(S3Error) as raised:
            await s3.list_keys(BUCKET, "dev/")
    assert "HTTP 403" in str(raised.value)
    assert wrong not in str(raised.value)
    assert store.keys.secret_access_key not in str(raised.value)


async def test_an_unreachable_endpoint_is_an_s3_error() -> None:
    async with S3Client("http://127.0.0.1:9", S3Keys("a", "b"), timeout=5) as s3:
        with pytest.raises(S3Error, match="ListObjectsV2 on bucket b"):
            await s3.list_keys("b", "x/")
