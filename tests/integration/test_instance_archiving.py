"""Continuous WAL archiving by the instance manager against real PostgreSQL 15, a real SeaweedFS and real Barman
Cloud: the segment reaches the bucket, pg_stat_archiver shows in /status, an unreachable object store shows as
failures (and WAL is kept), and archiving catches up once the store is back. No local node: no lock needed."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.local.seaweedfs import SeaweedFS, backup_tools_bin, s3_call
from tests.integration.test_instance_manager import CLUSTER, PG_BIN, Instance, Workspace, chown_tree
from tests.seaweedfs_support import bucket_store
from tests.support import eventually

pytestmark = [
    pytest.mark.skipif(not (PG_BIN / "postgres").exists(), reason=f"no PostgreSQL binaries in {PG_BIN}"),
    pytest.mark.skipif(
        not (backup_tools_bin() / "barman-cloud-wal-archive").exists(), reason="no backup tools (make backup-tools)"
    ),
    pytest.mark.timeout(180),
]

BUCKET = "kanri-backups"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def store() -> AsyncIterator[SeaweedFS]:
    async with bucket_store(BUCKET) as weed:
        yield weed


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def primary(store: SeaweedFS) -> AsyncIterator[Instance]:
    root = Path(tempfile.mkdtemp(prefix="kanri-archiving-"))
    workspace = Workspace(root)
    workspace.write_secrets()
    backup = workspace.write_backup_keys(store.keys.access_key_id, store.keys.secret_access_key)
    target = {"destination": f"s3://{BUCKET}/test", "endpointURL": store.endpoint, "serverName": CLUSTER}
    workspace.write_config({}, [f"{CLUSTER}-1"], extra={"archive": target})
    chown_tree(root)
    instance = Instance(
        workspace,
        f"{CLUSTER}-1",
        "primary",
        extra_env={"KANRI_BARMAN_BIN": str(backup_tools_bin()), "KANRI_BACKUP_CREDENTIALS_DIR": str(backup)},
    )
    await instance.start()
    try:
        await instance.wait_ready()
        yield instance
    finally:
        if instance.process is not None and instance.process.returncode is None:
            await instance.stop(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


async def _switch(instance: Instance) -> str:
    """Write a little, close the segment, and return its file name."""
    await instance.query("CREATE TABLE IF NOT EXISTS t (x int); INSERT INTO t VALUES (1)")
    rows = await instance.query("SELECT pg_walfile_name(pg_switch_wal())")
    return str(rows[0][0])


async def _archiver(instance: Instance) -> dict[str, Any]:
    archiver: dict[str, Any] = (await instance.status())["archiver"]
    return archiver


async def test_a_closed_segment_is_archived_to_the_bucket_and_reported(store: SeaweedFS, primary: Instance) -> None:
    segment = await _switch(primary)

    async def archived() -> dict[str, Any] | None:
        found = await _archiver(primary)
        return found if found["lastArchivedWal"] is not None and found["lastArchivedWal"] >= segment else None

    archiver = await eventually(archived, timeout=60)
    assert archiver["mode"] == "on"
    assert archiver["lastArchivedTime"] is not None
    keys = s3_call(store.endpoint, store.keys, "list", BUCKET, f"test/{CLUSTER}/wals/")
    assert keys is not None
    assert any(Path(key).name.startswith(segment) for key in keys), keys
    # the key pair is never on a command line PostgreSQL logs, nor in the config PostgreSQL reads
    conf = (primary.pgdata / "postgresql.conf").read_text()
    assert "archive-wal %p" in conf
    assert store.keys.secret_access_key not in conf + primary.output()


async def test_a_stopped_store_shows_as_failures_and_archiving_catches_up_after(
    store: SeaweedFS, primary: Instance
) -> None:
    store.stop()
    segment = await _switch(primary)

    async def failing() -> dict[str, Any] | None:
        found = await _archiver(primary)
        return found if found["failedCount"] > 0 and found["lastFailedWal"] == segment else None

    failed = await eventually(failing, timeout=120)
    assert failed["lastArchivedWal"] < segment
    assert (primary.pgdata / "pg_wal" / segment).exists()  # kept until it is archived

    store.start()
    await eventually(store.accepting, timeout=60)

    async def caught_up() -> bool:
        return ((await _archiver(primary))["lastArchivedWal"] or "") >= segment

    await eventually(caught_up, timeout=120)
    keys = s3_call(store.endpoint, store.keys, "list", BUCKET, f"test/{CLUSTER}/wals/")
    assert keys is not None
    assert any(Path(key).name.startswith(segment) for key in keys), keys
