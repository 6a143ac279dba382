"""A real SeaweedFS (``weed mini``) on 127.0.0.1 for integration tests that need an S3 store and no local node."""

from __future__ import annotations

import contextlib
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

from kanri.local.seaweedfs import S3Keys, SeaweedFS, s3_call
from tests.support import eventually


@contextlib.asynccontextmanager
async def bucket_store(bucket: str, *extra_args: str) -> AsyncIterator[SeaweedFS]:
    """A store whose admin key pair is random, with ``bucket`` made, for as long as the block runs; its data is
    removed afterwards. ``extra_args``: more of weed's flags (a later one wins)."""
    root = Path(tempfile.mkdtemp(prefix="kanri-seaweedfs-"))
    weed = SeaweedFS(root, S3Keys("kanri-test", secrets.token_hex(16)), extra_args=list(extra_args))

    async def made() -> bool:
        return s3_call(weed.endpoint, weed.keys, "create-bucket", bucket) is not None

    try:
        async with weed.running():
            await eventually(made, timeout=60, interval=0.3)
            yield weed
    finally:
        shutil.rmtree(root, ignore_errors=True)
