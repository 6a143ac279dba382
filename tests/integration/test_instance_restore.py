"""Point-in-time recovery and the restore rehearsal against real PostgreSQL 15, a real SeaweedFS and real Barman
Cloud, no local node (no lock needed): a source primary archives WAL and gets a base backup (taken here with
barman-cloud-backup directly); a new instance restores it to a moment between two inserts (the row before present,
the row after absent), promotes, archives into its OWN server name and takes its own Secrets' passwords; a rehearsal
of the source's backup passes every check, and fails loudly once a WAL file the backup needs is deleted."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.instance.archive import ACCESS_KEY_FILE, SECRET_KEY_FILE
from kanri.local.ports import free_port
from kanri.local.seaweedfs import S3Keys, SeaweedFS, backup_tools_bin, s3_call
from tests.integration.test_instance_manager import (
    CLUSTER,
    PG_BIN,
    Instance,
    Workspace,
    chown_tree,
    python_for_instances,
    run_as,
)
from tests.seaweedfs_support import bucket_store
from tests.support import eventually

pytestmark = [
    pytest.mark.skipif(not (PG_BIN / "postgres").exists(), reason=f"no PostgreSQL binaries in {PG_BIN}"),
    pytest.mark.skipif(
        not (backup_tools_bin() / "barman-cloud-backup").exists(), reason="no backup tools (make backup-tools)"
    ),
    pytest.mark.timeout(240),
]

BUCKET = "kanri-restore"
DESTINATION = f"s3://{BUCKET}/pitr"
RESTORED = "orders-restored"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def store() -> AsyncIterator[SeaweedFS]:
    async with bucket_store(BUCKET) as weed:
        yield weed


def key_dir(root: Path, name: str, keys: S3Keys) -> Path:
    directory = root / "secrets" / name
    directory.mkdir(parents=True)
    (directory / ACCESS_KEY_FILE).write_text(keys.access_key_id)
    (directory / SECRET_KEY_FILE).write_text(keys.secret_access_key)
    return directory


def target(store: SeaweedFS, server: str) -> dict[str, str]:
    return {"destination": DESTINATION, "endpointURL": store.endpoint, "serverName": server}


def barman_env(store: SeaweedFS) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "AWS_ACCESS_KEY_ID": store.keys.access_key_id,
            "AWS_SECRET_ACCESS_KEY": store.keys.secret_access_key}  # fmt: skip


def run_barman(store: SeaweedFS, program: str, *args: str) -> str:
    """A Barman Cloud program as the instance user, keys in the environment."""
    user = run_as()
    ids: dict[str, Any] = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    argv = [str(backup_tools_bin() / program), "--cloud-provider", "aws-s3", "--endpoint-url", store.endpoint,
            "--addressing-style", "path", *args]  # fmt: skip
    done = subprocess.run(argv, env=barman_env(store), capture_output=True, text=True, timeout=120, check=False,
                          cwd="/tmp", **ids)  # fmt: skip
    assert done.returncode == 0, f"{program} failed: {done.stderr[-2000:]}"
    return str(done.stdout)


def delete_object(store: SeaweedFS, key: str) -> None:
    script = (
        "import sys, boto3\nfrom botocore.config import Config\n"
        "s3 = boto3.client('s3', endpoint_url=sys.argv[1], config=Config(s3={'addressing_style': 'path'}))\n"
        "s3.delete_object(Bucket=sys.argv[2], Key=sys.argv[3])\n"
    )
    env = {**barman_env(store), "AWS_DEFAULT_REGION": "us-east-1"}
    argv = [str(backup_tools_bin() / "python"), "-c", script, store.endpoint, BUCKET, key]
    subprocess.run(argv, env=env, check=True, timeout=60, capture_output=True)


def keys(store: SeaweedFS, prefix: str) -> list[str]:
    found = s3_call(store.endpoint, store.keys, "list", BUCKET, prefix)
    assert found is not None
    return found


@dataclass
class Source:
    instance: Instance
    backup: dict[str, Any]
    between: datetime
    """A moment after row A's commit and before row B's."""


async def archived_through(instance: Instance, segment: str) -> bool:
    status = await instance.status()
    return ((status["archiver"] or {}).get("lastArchivedWal") or "") >= segment


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def source(store: SeaweedFS) -> AsyncIterator[Source]:
    root = Path(tempfile.mkdtemp(prefix="kanri-restore-source-"))
    workspace = Workspace(root)
    workspace.write_secrets()
    backup_keys = key_dir(root, "backup", store.keys)
    workspace.write_config({}, [f"{CLUSTER}-1"], extra={"archive": target(store, CLUSTER)})
    chown_tree(root)
    instance = Instance(workspace, f"{CLUSTER}-1", "primary", extra_env={
        "KANRI_BARMAN_BIN": str(backup_tools_bin()), "KANRI_BACKUP_CREDENTIALS_DIR": str(backup_keys)})  # fmt: skip
    await instance.start()
    try:
        await instance.wait_ready()
        await instance.query("CREATE TABLE rows (name text PRIMARY KEY, at timestamptz DEFAULT clock_timestamp())",
                             role="app", dbname="orders")  # fmt: skip
        await instance.query("INSERT INTO rows SELECT 'bulk-' || i FROM generate_series(1, 500) i", dbname="orders")
        socket = str(instance.root / "run")
        run_barman(store, "barman-cloud-backup", "--host", socket, "--port", str(instance.pg_port), "--user",
                   "postgres", "--immediate-checkpoint", DESTINATION, CLUSTER)  # fmt: skip
        listing = json.loads(run_barman(store, "barman-cloud-backup-list", "--format", "json", DESTINATION, CLUSTER))
        [backup] = listing["backups_list"]
        await instance.query("INSERT INTO rows (name) VALUES ('A')", dbname="orders")
        [[between]] = await instance.query("SELECT clock_timestamp()")
        await eventually(lambda: _later(instance, between), timeout=10, interval=0.01)
        await instance.query("INSERT INTO rows (name) VALUES ('B')", dbname="orders")
        [[segment]] = await instance.query("SELECT pg_walfile_name(pg_switch_wal())")
        await eventually(lambda: archived_through(instance, str(segment)), timeout=60)
        yield Source(instance, backup, between)
    finally:
        if instance.process is not None and instance.process.returncode is None:
            await instance.stop(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


async def _later(instance: Instance, moment: datetime) -> bool:
    """The server's clock has moved past ``moment`` (so B's commit time is strictly later)."""
    [[now]] = await instance.query("SELECT clock_timestamp()")
    return bool(now > moment)


async def test_a_new_primary_restores_to_a_point_in_time_and_archives_into_its_own_server_name(
    store: SeaweedFS, source: Source
) -> None:
    root = Path(tempfile.mkdtemp(prefix="kanri-restored-"))
    workspace = Workspace(root)
    workspace.write_secrets()  # new passwords: the restored roles must take them
    own_keys = key_dir(root, "backup", store.keys)
    source_keys = key_dir(root, "recovery", store.keys)
    recovery = {"source": target(store, CLUSTER), "targetTime": source.between.isoformat()}
    workspace.write_config({}, [f"{RESTORED}-1"], extra={"archive": target(store, RESTORED), "recovery": recovery})
    chown_tree(root)
    source_wals_before = set(keys(store, f"pitr/{CLUSTER}/wals/"))
    restored = Instance(workspace, f"{RESTORED}-1", "primary", extra_env={
        "KANRI_BARMAN_BIN": str(backup_tools_bin()), "KANRI_BACKUP_CREDENTIALS_DIR": str(own_keys),
        "KANRI_RECOVERY_CREDENTIALS_DIR": str(source_keys)})  # fmt: skip
    await restored.start()
    try:
        await restored.wait_ready(timeout=180)
        names = {row[0] for row in await restored.query("SELECT name FROM rows", role="app", dbname="orders")}
        assert "A" in names
        assert "B" not in names
        assert len(names) == 501
        status = await restored.status()
        assert status["timeline"] == 2
        assert status["restore"]["state"] == "done"
        assert source.backup["backup_id"] in status["restore"]["message"]
        assert status["systemIdentifier"] == (await source.instance.status())["systemIdentifier"]
        conf = (restored.pgdata / "postgresql.conf").read_text()
        assert "restore_command" not in conf
        assert not (restored.pgdata / "recovery.signal").exists()
        # the new timeline goes to the new server name, never the source's
        await restored.query("CREATE TABLE after_restore (x int)", role="app", dbname="orders")
        [[segment]] = await restored.query("SELECT pg_walfile_name(pg_switch_wal())")
        await eventually(lambda: archived_through(restored, str(segment)), timeout=60)
        own = keys(store, f"pitr/{RESTORED}/wals/")
        assert any(Path(k).name.startswith(str(segment)) for k in own), own
        assert any(Path(k).name.startswith("00000002.history") for k in own), own
        new_in_source = set(keys(store, f"pitr/{CLUSTER}/wals/")) - source_wals_before
        assert not [k for k in new_in_source if Path(k).name.startswith("00000002")], new_in_source
        assert store.keys.secret_access_key not in restored.output()
    finally:
        if restored.process is not None and restored.process.returncode is None:
            await restored.stop(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


async def rehearsal(store: SeaweedFS, name: str) -> tuple[int, dict[str, Any], str]:
    """``kanri-instance restore-test`` of the source's backups, as an instance would run it."""
    root = Path(tempfile.mkdtemp(prefix=f"kanri-rehearsal-{name}-"))
    workspace = Workspace(root)
    workspace.write_secrets()
    backup_keys = key_dir(root, "backup", store.keys)
    workspace.write_config({}, [], extra={"archive": target(store, CLUSTER)})
    termination = root / "termination-log"
    instance = Instance(workspace, f"{CLUSTER}-restore-test", "primary", extra_env={
        "KANRI_BARMAN_BIN": str(backup_tools_bin()), "KANRI_BACKUP_CREDENTIALS_DIR": str(backup_keys),
        "KANRI_TERMINATION_LOG": str(termination)})  # fmt: skip
    for sub in ("volume", "run"):
        (instance.root / sub).mkdir(parents=True)
    termination.touch()
    chown_tree(root)
    python, _ = python_for_instances()
    user = run_as()
    ids: dict[str, Any] = {} if user is None else {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    port = free_port()
    try:
        proc = await asyncio.create_subprocess_exec(
            python, "-m", "kanri.instance", "restore-test", env={**instance.env(None), "KANRI_PG_PORT": str(port)},
            cwd=instance.root, stdin=subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE, **ids)  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), timeout=180)
        verdict = json.loads(termination.read_text())
        assert json.loads(out.decode().strip().splitlines()[-1]) == verdict  # the last stdout line is the verdict
        return proc.returncode or 0, verdict, out.decode() + err.decode()
    finally:
        shutil.rmtree(root, ignore_errors=True)


async def test_a_rehearsal_of_a_good_backup_passes_every_check(store: SeaweedFS, source: Source) -> None:
    code, verdict, output = await rehearsal(store, "good")
    assert code == 0, output[-3000:]
    assert verdict["result"] == "Succeeded"
    assert verdict["backup"] == source.backup["backup_id"]
    checks = {c["name"]: c for c in verdict["checks"]}
    assert set(checks) == {"recovery", "rows", "amcheck", "checksums"}
    assert all(c["ok"] for c in checks.values()), checks
    assert "502 rows" in checks["rows"]["message"]  # 500 + A + B: replayed to the end of the archive
    assert "blocks verified" in checks["checksums"]["message"]
    assert verdict["recoveredTo"] is not None
    assert datetime.fromisoformat(verdict["recoveredTo"]) > source.between
    assert store.keys.secret_access_key not in output


async def restoring(store: SeaweedFS, name: str, recovery: dict[str, Any]) -> tuple[Instance, Path]:
    """A new primary with ``recovery`` in its config and no archive target of its own, started."""
    root = Path(tempfile.mkdtemp(prefix=f"kanri-{name}-"))
    workspace = Workspace(root)
    workspace.write_secrets()
    source_keys = key_dir(root, "recovery", store.keys)
    workspace.write_config({}, [f"{name}-1"], extra={"recovery": {"source": target(store, CLUSTER), **recovery}})
    chown_tree(root)
    instance = Instance(workspace, f"{name}-1", "primary", extra_env={
        "KANRI_BARMAN_BIN": str(backup_tools_bin()), "KANRI_RECOVERY_CREDENTIALS_DIR": str(source_keys)})  # fmt: skip
    await instance.start()
    return instance, root


async def test_target_immediate_stops_at_the_end_of_the_backup(store: SeaweedFS, source: Source) -> None:
    restored, root = await restoring(store, "immediate", {"targetImmediate": True})
    try:
        await restored.wait_ready(timeout=180)
        [[count, late]] = await restored.query(
            "SELECT count(*), count(*) FILTER (WHERE name IN ('A', 'B')) FROM rows", dbname="orders"
        )
        assert (count, late) == (500, 0)  # what the backup held, nothing replayed after it
        assert (await restored.query("SHOW archive_mode"))[0][0] == "off"  # no repository of its own: no archiving
    finally:
        if restored.process is not None and restored.process.returncode is None:
            await restored.stop(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


async def test_a_target_before_every_backup_is_reported_and_nothing_is_initialised(
    store: SeaweedFS, source: Source
) -> None:
    restored, root = await restoring(store, "too-early", {"targetTime": "2020-01-01T00:00:00Z"})
    try:

        async def told() -> dict[str, Any] | None:
            if not await restored.alive():  # the HTTP API is not up yet
                return None
            status = await restored.status()
            return status if "ended before 2020-01-01" in (status["lastError"] or "") else None

        status = await eventually(told, timeout=60)
        assert status["lastError"].startswith("restore failed: no complete backup in s3://kanri-restore/pitr/orders")
        assert status["restore"]["state"] == "running"
        assert not status["running"]
        assert not (restored.pgdata / "PG_VERSION").exists()  # never an initdb instead
    finally:
        if restored.process is not None and restored.process.returncode is None:
            await restored.stop(timeout=30)
        shutil.rmtree(root, ignore_errors=True)


# Last: it damages the source's archive the tests above restore from.
async def test_a_rehearsal_fails_loudly_when_a_wal_file_of_the_backup_is_gone(store: SeaweedFS, source: Source) -> None:
    begin = str(source.backup["begin_wal"])
    [wal] = [k for k in keys(store, f"pitr/{CLUSTER}/wals/") if Path(k).name in (begin, f"{begin}.gz")]
    delete_object(store, wal)
    code, verdict, _ = await rehearsal(store, "damaged")
    assert code == 1
    assert verdict["result"] == "Failed"
    [check] = verdict["checks"]
    assert check["name"] == "recovery"
    assert not check["ok"]
    assert "PostgreSQL stopped before the end of recovery" in verdict["message"], verdict
    assert "checkpoint record" in verdict["message"] or "WAL ends" in verdict["message"], verdict
