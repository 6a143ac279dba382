"""Base backups through the instance API against real PostgreSQL 15, a real SeaweedFS and real Barman Cloud: a backup
completes into barman's layout, a repeated id starts nothing, a standby backs up too, a failure is reported without a
secret, a restarted manager still answers for a finished id, and expiring a backup removes it and the WAL only it
needed. No local node: no lock needed."""

from __future__ import annotations

import asyncio
import re
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.instance.archive import SECRET_KEY_FILE
from kanri.local.seaweedfs import SeaweedFS, backup_tools_bin, s3_call
from tests.integration.test_instance_manager import CLUSTER, PG_BIN, Instance, Workspace, chown_tree
from tests.seaweedfs_support import bucket_store
from tests.support import eventually

pytestmark = [
    pytest.mark.skipif(not (PG_BIN / "postgres").exists(), reason=f"no PostgreSQL binaries in {PG_BIN}"),
    pytest.mark.skipif(
        not (backup_tools_bin() / "barman-cloud-backup").exists(), reason="no backup tools (make backup-tools)"
    ),
    pytest.mark.timeout(240),
]

BUCKET = "kanri-backups"
PREFIX = f"test/{CLUSTER}"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def store() -> AsyncIterator[SeaweedFS]:
    async with bucket_store(BUCKET) as weed:
        yield weed


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def workspace(store: SeaweedFS) -> AsyncIterator[Workspace]:
    root = Path(tempfile.mkdtemp(prefix="kanri-base-backup-"))
    workspace = Workspace(root)
    workspace.write_secrets()
    workspace.write_backup_keys(store.keys.access_key_id, store.keys.secret_access_key)
    target = {"destination": f"s3://{BUCKET}/test", "endpointURL": store.endpoint, "serverName": CLUSTER}
    workspace.write_config({}, [f"{CLUSTER}-1", f"{CLUSTER}-2"], extra={"archive": target})
    chown_tree(root)
    yield workspace
    shutil.rmtree(root, ignore_errors=True)


def _env(workspace: Workspace) -> dict[str, str]:
    return {
        "KANRI_BARMAN_BIN": str(backup_tools_bin()),
        "KANRI_BACKUP_CREDENTIALS_DIR": str(workspace.root / "secrets" / "backup"),
    }


async def _stop(instance: Instance) -> None:
    if instance.process is not None and instance.process.returncode is None:
        await instance.stop(timeout=30)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def primary(workspace: Workspace) -> AsyncIterator[Instance]:
    instance = Instance(workspace, f"{CLUSTER}-1", "primary", extra_env=_env(workspace))
    await instance.start()
    try:
        await instance.wait_ready()
        yield instance
    finally:
        await _stop(instance)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def standby(workspace: Workspace, primary: Instance) -> AsyncIterator[Instance]:
    instance = Instance(workspace, f"{CLUSTER}-2", "replica", extra_env=_env(workspace))
    await instance.start(primary_port=primary.pg_port)
    try:
        await instance.wait_ready()
        yield instance
    finally:
        await _stop(instance)


async def _get(instance: Instance, workspace: Workspace, backup: str) -> tuple[int, dict[str, Any]]:
    import aiohttp

    headers = {"Authorization": f"Bearer {workspace.token}"}
    async with aiohttp.ClientSession() as http, http.get(f"{instance.url}/backups/{backup}", headers=headers) as answer:
        return answer.status, await answer.json()


async def _finished(instance: Instance, workspace: Workspace, backup: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        code, body = await _get(instance, workspace, backup)
        assert code == 200, body
        return body if body["phase"] != "Running" else None

    found: dict[str, Any] = await eventually(done, timeout=120, interval=0.5)
    return found


def _keys(store: SeaweedFS, prefix: str) -> list[str]:
    keys = s3_call(store.endpoint, store.keys, "list", BUCKET, prefix)
    assert keys is not None
    return keys


async def _write_and_switch(instance: Instance) -> None:
    await instance.query("CREATE TABLE IF NOT EXISTS t (x int); INSERT INTO t SELECT generate_series(1, 1000)")
    await instance.query("SELECT pg_switch_wal()")


async def test_a_backup_completes_into_barmans_layout_and_a_repeated_id_starts_nothing(
    store: SeaweedFS, workspace: Workspace, primary: Instance
) -> None:
    await _write_and_switch(primary)
    code, started = await primary.post_json("/backups", workspace.token, {"id": "first-backup"})
    assert code == 202, started
    assert started["phase"] == "Running"
    assert started["fromStandby"] is False
    code, again = await primary.post_json("/backups", workspace.token, {"id": "first-backup"})
    assert code == 200, again  # the same id: its record, not a second backup
    assert again["startedAt"] == started["startedAt"]

    record = await _finished(primary, workspace, "first-backup")
    assert record["phase"] == "Completed", record
    assert re.fullmatch(r"[0-9]{8}T[0-9]{6}", record["backupId"])
    assert record["beginWal"]
    assert record["endWal"]
    assert record["beginWal"] <= record["endWal"]
    assert record["sizeBytes"] > 0
    assert record["beginTime"] <= record["endTime"]
    assert record["error"] is None
    keys = _keys(store, f"{PREFIX}/base/{record['backupId']}/")
    assert any(key.endswith("backup.info") for key in keys), keys
    assert any(".tar" in key for key in keys), keys
    # retries after completion still answer the record, and nothing else was uploaded
    code, after = await primary.post_json("/backups", workspace.token, {"id": "first-backup"})
    assert (code, after["backupId"]) == (200, record["backupId"])
    bases = {key.split("/")[3] for key in _keys(store, f"{PREFIX}/base/")}
    assert bases == {record["backupId"]}
    assert store.keys.secret_access_key not in primary.output()


async def test_the_backup_endpoints_need_the_token_and_answer_404_for_an_unknown_id(
    workspace: Workspace, primary: Instance
) -> None:
    assert (await primary.post("/backups", None))[0] == 401
    assert (await primary.post("/backups", "wrong"))[0] == 401
    assert (await _get(primary, workspace, "never-asked"))[0] == 404
    assert (await _get(primary, workspace, "..%2Fetc"))[0] in (400, 404)
    code, body = await primary.post_json("/backups", workspace.token, {"id": "Not/A/Key"})
    assert code == 400, body


def _last_needed(timeline: str, end_lsn: str) -> str:
    """The segment holding the backup's last byte of WAL: the one before ``end_lsn``. barman's endWal names the
    segment ``end_lsn`` is in, which is the next one when the backup ended exactly on a segment boundary (a standby
    backup right after the primary switched segments): that one holds nothing the backup needs."""
    high, low = end_lsn.split("/")
    last = ((int(high, 16) << 32) | int(low, 16)) - 1
    return f"{timeline}{last >> 32:08X}{(last & 0xFFFFFFFF) // (16 * 1024 * 1024):08X}"


async def test_a_standby_takes_a_backup_with_the_concurrent_api(
    store: SeaweedFS, workspace: Workspace, primary: Instance, standby: Instance
) -> None:
    await _write_and_switch(primary)
    code, started = await standby.post_json("/backups", workspace.token, {"id": "from-standby"})
    assert code == 202, started
    assert started["fromStandby"] is True
    record = await _finished(standby, workspace, "from-standby")
    assert record["phase"] == "Completed", record
    assert any(key.endswith("backup.info") for key in _keys(store, f"{PREFIX}/base/{record['backupId']}/"))
    # the backup's last segment is on the primary, which has no reason to close it: /wal/switch does (a standby
    # refuses: it has no WAL of its own), and the segment reaches the archive — the backup is restorable now
    code, body = await standby.post_json("/wal/switch", workspace.token, {})
    assert code == 409, body
    code, body = await primary.post_json("/wal/switch", workspace.token, {})
    assert code == 200, body
    end = _last_needed(record["endWal"][:8], record["endLsn"])
    assert body["segment"] >= end, (body, record)
    await eventually(lambda: asyncio.sleep(0, _keys(store, f"{PREFIX}/wals/{end[:16]}/{end}") or None), timeout=60)
    assert (await primary.post("/wal/switch", None))[0] == 401


async def test_a_failed_backup_is_reported_without_the_secret_and_a_restarted_manager_still_answers(
    workspace: Workspace, primary: Instance
) -> None:
    secret_file = workspace.root / "secrets" / "backup" / SECRET_KEY_FILE
    good = secret_file.read_text()
    wrong = "wrong-" + secrets.token_hex(12)
    secret_file.write_text(wrong)
    try:
        code, _ = await primary.post_json("/backups", workspace.token, {"id": "bad-keys"})
        assert code == 202
        record = await _finished(primary, workspace, "bad-keys")
    finally:
        secret_file.write_text(good)
    assert record["phase"] == "Failed"
    assert record["error"], record
    assert wrong not in str(record)
    assert wrong not in primary.output()
    assert good not in str(record)

    await primary.stop(timeout=30)
    await primary.start()
    await primary.wait_ready()
    code, first = await _get(primary, workspace, "first-backup")
    assert (code, first["phase"]) == (200, "Completed")
    assert (await _get(primary, workspace, "bad-keys"))[1]["phase"] == "Failed"


async def test_expiring_the_oldest_backup_removes_it_and_the_wal_only_it_needed(
    store: SeaweedFS, workspace: Workspace, primary: Instance
) -> None:
    _, first = await _get(primary, workspace, "first-backup")
    await _write_and_switch(primary)
    code, _ = await primary.post_json("/backups", workspace.token, {"id": "second-backup"})
    assert code == 202
    second = await _finished(primary, workspace, "second-backup")
    assert second["phase"] == "Completed", second
    _, standby_backup = await _get_standby_record(workspace)
    wals_before = [Path(key).name for key in _keys(store, f"{PREFIX}/wals/")]
    assert any(name[:24] < second["beginWal"] for name in wals_before), wals_before

    expired = [first["backupId"]]
    if standby_backup is not None:
        expired.append(standby_backup)
    code, answer = await primary.post_json("/backups/expire", workspace.token, {"ids": expired})
    assert code == 200, answer
    assert sorted(answer["deleted"]) == sorted(expired)
    assert answer["failed"] == {}
    bases = {key.split("/")[3] for key in _keys(store, f"{PREFIX}/base/")}
    assert bases == {second["backupId"]}
    wals_after = [Path(key).name for key in _keys(store, f"{PREFIX}/wals/")]
    assert wals_after, "the WAL the kept backup needs is still there"
    assert all(name[:24] >= second["beginWal"] for name in wals_after if not name.endswith(".history")), wals_after
    # expiring again (a retried request) is not an error
    code, again = await primary.post_json("/backups/expire", workspace.token, {"ids": [first["backupId"]]})
    assert code == 200, again
    assert again["deleted"] == [first["backupId"]]


async def _get_standby_record(workspace: Workspace) -> tuple[int, str | None]:
    """The standby's backup id, from its record on disk (the standby fixture may have stopped already)."""
    import json

    path = workspace.root / f"{CLUSTER}-2" / "volume" / "kanri-backups" / "from-standby.json"
    if not path.exists():
        return 404, None
    return 200, json.loads(path.read_text()).get("backupId")


async def test_expiring_in_an_earlier_systems_folder_is_for_this_clusters_systems_only(
    store: SeaweedFS, workspace: Workspace, primary: Instance
) -> None:
    # after a major upgrade the operator expires the old system's backups under their own server name; a folder of
    # another cluster in the same repository is refused before barman runs
    code, answer = await primary.post_json("/backups/expire", workspace.token,
                                           {"ids": ["20260101T000000"], "serverName": "billing"})  # fmt: skip
    assert code == 400, answer
    code, answer = await primary.post_json("/backups/expire", workspace.token,
                                           {"ids": ["20260101T000000"], "serverName": f"{CLUSTER}.x"})  # fmt: skip
    assert code == 400, answer
    code, answer = await primary.post_json("/backups/expire", workspace.token,
                                           {"ids": ["20260101T000000"], "serverName": f"{CLUSTER}.pg14"})  # fmt: skip
    assert code == 200, answer
    assert answer["deleted"] == ["20260101T000000"]  # not there: counts as deleted, as a retried request does
