"""Base backups end to end: real PostgreSQL 15 in the local node's pods, real Barman Cloud, the object store a
workload of the local cluster (SeaweedFS), the operator's real Manager and its PostgresBackup controller.

One cluster (a primary and a streaming replica) goes through: the first backup as soon as it is Ready, taken from the
replica; an on-demand backup with ``kanri backup --wait``; then the operator's backup clock (the test hook
``OperatorOptions.backup_now``: the S3 server rejects skewed requests, so the clock of the requests stays real) is
moved two days on, which makes the schedule's 03:00 slot due and ages the two earlier backups out of the 1-day
recovery window (barman's own times are real, so all three ended "two days ago"; the newest is always kept):
retention deletes them from the bucket, with the WAL only they needed, and their PostgresBackups.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from typer.testing import CliRunner

from kanri.cli.main import app
from kanri.local import Endpoint
from kanri.local.seaweedfs import S3_BUCKET, S3_SERVICE, backup_tools_bin
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.runtime import ApiError, Client, get_condition
from kanri.runtime.kinds import EVENT
from tests.e2e.postgres_helpers import cluster, ready, write_row
from tests.e2e.test_backup_archiving_e2e import (  # noqa: F401  (node, store: the fixtures)
    Store,
    node,
    number,
    segments,
    store,
    superuser_sql,
    switch_wal,
)
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        not (backup_tools_bin() / "barman-cloud-backup").exists() or not (backup_tools_bin() / "weed").exists(),
        reason="no backup tools (make backup-tools)",
    ),
]


class Clock:
    """The operator's "now" for backups, moved by the test."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


@pytest_asyncio.fixture(loop_scope="session")
async def clocked(
    control_plane: Endpoint,
    namespace: str,
    store: Store,  # noqa: F811
) -> AsyncIterator[tuple[Operator, Clock]]:
    """The operator with the platform's default repository (the store's Service) and a clock the test moves."""
    repository = S3Repository.model_validate({"endpoint": store.endpoint, "bucket": S3_BUCKET, "path": "e2e",
                                              "credentialsSecret": {"name": f"{S3_SERVICE}-keys"}})  # fmt: skip
    instances = HttpInstanceClient()
    clock = Clock()
    try:
        yield Operator(control_plane, namespace, instances=instances, default_backup_repository=repository,
                       backup_now=clock), clock  # fmt: skip
    finally:
        await instances.close()


async def phase_is(client: Client, namespace: str, name: str, phase: str) -> Obj | None:
    try:
        found = await client.get(POSTGRES_BACKUP, name, namespace)
    except ApiError as exc:
        if exc.not_found:
            return None
        raise
    status = found.get("status") or {}
    if status.get("phase") == "Failed" and phase != "Failed":
        raise AssertionError(f"backup {name} failed: {status}")
    return status if status.get("phase") == phase else None


async def base_ids(bucket: Store, prefix: str) -> set[str]:
    """Barman backup ids with objects under ``<prefix>base/``."""
    return {key[len(prefix) + len("base/") :].split("/", 1)[0] for key in await bucket.keys_under(f"{prefix}base/")}


async def test_first_on_demand_and_scheduled_backups_complete_and_retention_expires_an_aged_one(
    client: Client,
    store: Store,  # noqa: F811
    clocked: tuple[Operator, Clock],
    namespace: str,
    control_plane: Endpoint,
) -> None:
    operator, clock = clocked
    manifest = cluster("bk", namespace, 2, backup={"retentionDays": 1, "schedule": "0 3 * * *"})
    await client.create(POSTGRES_CLUSTER, manifest)
    prefix = f"e2e/{namespace}/bk/"  # the shared default repository: a folder per namespace
    async with operator.running(refresh=2.0):
        found = await eventually(lambda: ready(client, namespace, "bk", 2), timeout=240, interval=1)
        primary = found["status"]["currentPrimary"]
        await write_row(client, namespace, "bk", 1)

        # The first backup, as soon as the cluster was Ready, from the streaming replica.
        initial = await eventually(lambda: phase_is(client, namespace, "bk-initial", "Completed"), timeout=240,
                                   interval=1)  # fmt: skip
        assert initial["instance"] != primary
        assert initial["backupId"] in await base_ids(store, prefix)
        assert initial["beginWAL"]
        assert initial["endWAL"]
        assert initial["sizeBytes"] > 0

        # On demand, as a user would: kanri backup --wait (a PostgresBackup, followed to Completed).
        # So that the two backups start in different segments: a new segment, and a checkpoint in it (a backup of a
        # standby starts at its last restartpoint, which follows the primary's checkpoints).
        await switch_wal(client, namespace, "bk")
        await superuser_sql(client, namespace, "bk", "CHECKPOINT")  # (None: a command has no rows to fetch)
        await switch_wal(client, namespace, "bk")
        argv = ["backup", "bk", "--name", "bk-manual", "--wait", "--timeout", "240", "-n", namespace,
                "--kubeconfig", str(control_plane.kubeconfig)]  # fmt: skip
        result = await asyncio.to_thread(CliRunner().invoke, app, argv)
        assert result.exit_code == 0, result.output
        manual = await eventually(lambda: phase_is(client, namespace, "bk-manual", "Completed"), timeout=10)
        assert f"backup {manual['backupId']} completed" in result.output
        assert number(manual["beginWAL"]) > number(initial["beginWAL"])

        cluster_status = (await client.get(POSTGRES_CLUSTER, "bk", namespace))["status"]
        succeeded = get_condition(cluster_status["conditions"], "LastBackupSucceeded")
        assert succeeded is not None
        assert succeeded["status"] == "True"
        labels = {"namespace": namespace, "cluster": "bk"}
        assert operator.registry.get_sample_value("kanri_postgres_backup_last_success_timestamp_seconds", labels)
        old_wal = [s for s in segments(await store.keys_under(prefix)) if number(s) < number(manual["beginWAL"])]
        assert old_wal  # archived before the on-demand backup began: only the first backup needs it

        # Two days on (the operator's clock): the 03:00 slot is due, and the first backup leaves the window.
        clock.offset = timedelta(days=2)
        now = clock()
        slot = (now if now.hour >= 3 else now - timedelta(days=1)).replace(hour=3, minute=0, second=0, microsecond=0)
        scheduled = f"bk-{slot:%Y%m%d}0300"
        await eventually(lambda: phase_is(client, namespace, scheduled, "Completed"), timeout=240, interval=1)

        async def expired(name: str) -> bool:
            try:
                await client.get(POSTGRES_BACKUP, name, namespace)
                return False
            except ApiError as exc:
                return exc.not_found

        await eventually(lambda: expired("bk-initial"), timeout=120, interval=1)
        await eventually(lambda: expired("bk-manual"), timeout=30, interval=1)
        newest = (await client.get(POSTGRES_BACKUP, scheduled, namespace))["status"]
        assert await base_ids(store, prefix) == {newest["backupId"]}  # the newest is always kept
        left = [s for s in segments(await store.keys_under(prefix)) if number(s) < number(manual["beginWAL"])]
        assert left == []  # the WAL only the expired backups needed went with them
        events, _ = await client.list(EVENT, namespace)
        assert any(e.get("reason") == "BackupsExpired" for e in events)
        backup = (await client.get(POSTGRES_CLUSTER, "bk", namespace))["status"]["backup"]
        assert backup["firstRecoverabilityPoint"]
        assert backup["lastSuccessful"]
        assert backup["lastScheduled"]
