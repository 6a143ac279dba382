"""The PostgresBackup controller and the cluster's backup schedule against the real API server; the instance side is
an HTTP fake of the instance managers' API (``/status`` and ``/backups``), spoken to by the operator's real client.

"Now" is injected (``OperatorOptions.backup_now``), so a test moves the schedule and retention's clock forward without
waiting: the first backup as soon as the cluster is Ready, taken from the replica; a second backup waits Pending
(WaitingForBackup) while one runs; an operator restarted in the middle resumes without a second backup; a schedule
slot gets exactly one backup; retention expires what the recovery window no longer needs and deletes its objects; a
failed attempt is retried under a new key (the backoff made small here) and the last failed one turns
LastBackupSucceeded False with an Event and the failure counter; a backup that fails once then succeeds completes."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from kanri.local.controlplane import Endpoint
from kanri.postgres.backup import controller as backup_controller
from kanri.postgres.backup import plan as backup_plan
from kanri.postgres.backup import retry as backup_retry
from kanri.postgres.backup.archiving import BackupSettings
from kanri.postgres.backup.controller import PostgresBackupReconciler
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.runtime import ApiError, Cache, Client, EventRecorder
from tests.integration.test_postgres_failover import HaFake, event_reasons, pods_running, ready, status_of
from tests.integration.test_postgres_reconciler import SYSID, condition, pgc
from tests.integration.test_postgres_restore_ops import get_or_none, platform
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


class BackupFake(HaFake):
    """An instance manager that also answers ``/backups``: a backup runs until the test finishes it."""

    def __init__(self, name: str, address: str, role: str) -> None:
        super().__init__(name, address, role)
        self.records: dict[str, Obj] = {}
        self.started: list[str] = []
        """Ids a backup was started for (a second start of one id would show twice)."""
        self.posts: list[str] = []
        self.expired: list[list[str]] = []
        self.expired_in: list[str | None] = []
        """The serverName of each expire request (None: the instance's own system)."""
        self.serial = 0

    async def start(self, port: int) -> int:
        app = web.Application()
        app.router.add_get("/status", self._status)
        app.router.add_post("/backups", self._start_backup)
        app.router.add_post("/backups/expire", self._expire)
        app.router.add_get("/backups/{id}", self._record)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, self.address, port).start()
        self.port = int(self.runner.addresses[0][1])
        return self.port

    async def _start_backup(self, request: web.Request) -> web.Response:
        key = (await request.json())["id"]
        self.posts.append(key)
        if key in self.records:
            return web.json_response(self.records[key])
        if any(r["phase"] == "Running" for r in self.records.values()):
            return web.json_response({"error": "another backup is running on this instance"}, status=409)
        self.records[key] = {"id": key, "phase": "Running", "startedAt": "2026-12-02T10:00:00+00:00",
                             "fromStandby": self.report["role"] == "replica"}  # fmt: skip
        self.started.append(key)
        return web.json_response(self.records[key], status=202)

    async def _record(self, request: web.Request) -> web.Response:
        record = self.records.get(request.match_info["id"])
        if record is None:
            return web.json_response({"error": "no such backup"}, status=404)
        return web.json_response(record)

    async def _expire(self, request: web.Request) -> web.Response:
        body = await request.json()
        ids = body["ids"]
        self.expired.append(ids)
        self.expired_in.append(body.get("serverName"))
        return web.json_response({"deleted": ids, "failed": {}})

    def finish(self, key: str, end: datetime, *, failed: str | None = None) -> str:
        """Complete (or fail) the backup of ``key``; its barman id."""
        self.serial += 1
        backup_id = f"{end:%Y%m%dT%H%M}{self.serial:02d}"
        record = self.records[key]
        if failed is not None:
            record.update(phase="Failed", error=failed, completedAt=end.isoformat())
            return backup_id
        record.update(phase="Completed", completedAt=end.isoformat(), backupId=backup_id,
                      beginTime=(end - timedelta(seconds=5)).isoformat(), endTime=end.isoformat(),
                      beginWal="000000010000000000000004", endWal="000000010000000000000004", beginLsn="0/4000028",
                      endLsn="0/4000138", sizeBytes=31_457_280, timeline=1)  # fmt: skip
        return backup_id


@contextlib.asynccontextmanager
async def backup_fakes(cluster: str) -> AsyncIterator[tuple[dict[str, BackupFake], HttpInstanceClient]]:
    """``<cluster>-1`` primary, ``<cluster>-2`` a streaming replica."""
    prefix = f"127.79.{secrets.randbelow(250) + 1}"
    fakes: dict[str, BackupFake] = {}
    for n in (1, 2):
        fake = BackupFake(f"{cluster}-{n}", f"{prefix}.{n}", "primary" if n == 1 else "replica")
        fake.report.update(systemIdentifier=SYSID, dataVersion=16, binaryVersion=16, problems=[])
        fakes[fake.name] = fake
    port = 0
    for fake in fakes.values():
        port = await fake.start(port)
    instances = HttpInstanceClient(port=port, timeout=1.0, plain=True)
    try:
        yield fakes, instances
    finally:
        await instances.close()
        for fake in fakes.values():
            with contextlib.suppress(Exception):
                await fake.runner.cleanup()


async def started(fakes: dict[str, BackupFake], key: str) -> BackupFake:
    """The fake the backup of ``key`` was started on (once it was)."""

    async def where() -> BackupFake | None:
        return next((f for f in fakes.values() if key in f.started), None)

    return await eventually(where, timeout=20)


class Clock:
    """The operator's "now" for backups, moved by the test."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return datetime.now(UTC) + self.offset


def pgbackup(name: str, namespace: str, cluster: str) -> Obj:
    return {"apiVersion": POSTGRES_BACKUP.api_version, "kind": POSTGRES_BACKUP.kind,
            "metadata": {"name": name, "namespace": namespace}, "spec": {"cluster": cluster}}  # fmt: skip


async def backup_status(client: Client, namespace: str, name: str) -> Obj:
    found = await get_or_none(client, POSTGRES_BACKUP, name, namespace)
    return dict((found or {}).get("status") or {})


async def phase_is(client: Client, namespace: str, name: str, phase: str) -> Obj | None:
    status = await backup_status(client, namespace, name)
    return status if status.get("phase") == phase else None


async def uid_of(client: Client, namespace: str, name: str) -> str:
    return str((await client.get(POSTGRES_BACKUP, name, namespace))["metadata"]["uid"])


async def test_the_first_backup_follows_readiness_one_runs_at_a_time_and_a_restarted_operator_starts_none_twice(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    default = await platform(client, namespace)
    await client.create(POSTGRES_CLUSTER, pgc("shop", namespace, replicas=2, backup={"retentionDays": 7}))
    async with backup_fakes("shop") as (fakes, instances):
        operator = Operator(control_plane, namespace, instances=instances, default_backup_repository=default)
        async with operator.running(refresh=0.3):
            await pods_running(client, namespace, fakes)  # type: ignore[arg-type]
            await eventually(lambda: ready(client, namespace, "shop"), timeout=30)
            running = await eventually(lambda: phase_is(client, namespace, "shop-initial", "Running"), timeout=30)
            assert running["instance"] == "shop-2"  # the streaming replica, not the primary
            initial = await client.get(POSTGRES_BACKUP, "shop-initial", namespace)
            assert initial["metadata"]["labels"]["kanri.dev/backup-trigger"] == "initial"
            assert not initial["metadata"].get("ownerReferences")  # deletionPolicy Retain: it outlives the cluster
            key = initial["metadata"]["uid"]
            await eventually(lambda: _true(fakes["shop-2"].started == [key]), timeout=10)
            await client.create(POSTGRES_BACKUP, pgbackup("manual", namespace, "shop"))
            waiting = await eventually(lambda: phase_is(client, namespace, "manual", "Pending"), timeout=10)
            assert waiting["reason"] == "WaitingForBackup"
            assert "shop-initial" in waiting["message"]
        # The operator stops with the backup Running; its successor polls the same id and starts nothing new.
        polls = len(fakes["shop-2"].posts)
        async with operator.running(refresh=0.3):
            await eventually(lambda: _true(len(fakes["shop-2"].posts) > polls or _polled(fakes["shop-2"])), timeout=10)
            fakes["shop-2"].finish(key, datetime.now(UTC))
            done = await eventually(lambda: phase_is(client, namespace, "shop-initial", "Completed"), timeout=20)
            assert done["backupId"]
            assert done["beginWAL"] == "000000010000000000000004"
            assert done["sizeBytes"] == 31_457_280
            assert done["endLSN"] == "0/4000138"
            manual = await eventually(lambda: phase_is(client, namespace, "manual", "Running"), timeout=20)
            manual_key = await uid_of(client, namespace, "manual")
            assert manual["instance"] == "shop-2"
            (await started(fakes, manual_key)).finish(manual_key, datetime.now(UTC))
            await eventually(lambda: phase_is(client, namespace, "manual", "Completed"), timeout=20)

            async def summarised() -> Obj | None:
                status = await status_of(client, namespace, "shop")
                backup = status.get("backup") or {}
                return backup if backup.get("lastSuccessful") and backup.get("firstRecoverabilityPoint") else None

            summary = await eventually(summarised, timeout=20)
            assert summary["lastScheduled"]
            succeeded = await eventually(lambda: condition(client, namespace, "shop", "LastBackupSucceeded"))
            assert (succeeded["status"], succeeded["reason"]) == ("True", "Completed")
            assert fakes["shop-2"].started == [key, manual_key]  # one backup per object, however many polls
            assert fakes["shop-1"].started == []
            assert "BackupCompleted" in await event_reasons(client, namespace, "shop")
            assert operator.registry.get_sample_value(
                "kanri_postgres_backup_last_success_timestamp_seconds", {"namespace": namespace, "cluster": "shop"}
            )
            # Converged: a further second of passes writes nothing.
            await _quiet(operator)


def _polled(fake: BackupFake) -> bool:
    return len(fake.posts) >= 1


async def _true(value: bool) -> bool:
    return value


async def _quiet(operator: Operator) -> None:
    """Converged: within 10 s, a window of 1.5 s (five passes) without a single write."""

    async def window_without_writes() -> bool:
        before = operator.writes()
        await asyncio.sleep(1.5)
        return operator.writes() == before

    await eventually(window_without_writes, timeout=10)


async def test_a_schedule_slot_gets_one_backup_and_retention_expires_what_the_window_no_longer_needs(
    control_plane: Endpoint, client: Client, namespace: str
) -> None:
    default = await platform(client, namespace)
    clock = Clock()
    await client.create(POSTGRES_CLUSTER, pgc("inv", namespace, replicas=2, deletionPolicy="Delete",
                                              backup={"retentionDays": 1, "schedule": "0 3 * * *"}))  # fmt: skip
    async with backup_fakes("inv") as (fakes, instances):
        operator = Operator(control_plane, namespace, instances=instances, default_backup_repository=default,
                            backup_now=clock)  # fmt: skip
        async with operator.running(refresh=0.3):
            await pods_running(client, namespace, fakes)  # type: ignore[arg-type]
            await eventually(lambda: phase_is(client, namespace, "inv-initial", "Running"), timeout=40)
            initial = await client.get(POSTGRES_BACKUP, "inv-initial", namespace)
            assert initial["metadata"]["ownerReferences"][0]["kind"] == "PostgresCluster"  # Delete: goes with it
            initial_id = (await started(fakes, initial["metadata"]["uid"])).finish(initial["metadata"]["uid"],
                                                                                     datetime.now(UTC))  # fmt: skip
            await eventually(lambda: phase_is(client, namespace, "inv-initial", "Completed"), timeout=20)
            assert (await backup_status(client, namespace, "inv-initial"))["serverName"] == "inv"  # its folder
            await client.create(POSTGRES_BACKUP, pgbackup("extra", namespace, "inv"))
            await eventually(lambda: phase_is(client, namespace, "extra", "Running"), timeout=20)
            extra_key = await uid_of(client, namespace, "extra")
            extra_id = (await started(fakes, extra_key)).finish(extra_key, datetime.now(UTC))
            await eventually(lambda: phase_is(client, namespace, "extra", "Completed"), timeout=20)
            assert fakes["inv-1"].expired == []  # both inside the window

            # Two days later: the 03:00 slot is due (one backup for the latest slot). Once it completed, both older
            # backups ended before the 1-day window: the newer of them stays (a restore to the window's first moment
            # starts from it), the older one is expired.
            clock.offset = timedelta(days=2)
            slot = (clock() if clock().hour >= 3 else clock() - timedelta(days=1)).replace(hour=3, minute=0, second=0,
                                                                                      microsecond=0)  # fmt: skip
            name = f"inv-{slot:%Y%m%d}0300"
            await eventually(lambda: phase_is(client, namespace, name, "Running"), timeout=20)
            scheduled = await client.get(POSTGRES_BACKUP, name, namespace)
            assert scheduled["metadata"]["labels"]["kanri.dev/backup-trigger"] == "schedule"

            async def made_up() -> bool:  # two slots passed unseen: one backup makes up for them
                return "MissedScheduleMadeUp" in await event_reasons(client, namespace, "inv")

            await eventually(made_up, timeout=10)
            (await started(fakes, scheduled["metadata"]["uid"])).finish(scheduled["metadata"]["uid"], clock())
            await eventually(lambda: phase_is(client, namespace, name, "Completed"), timeout=20)
            await eventually(lambda: _true(fakes["inv-1"].expired == [[initial_id]]), timeout=20)  # on the primary
            assert fakes["inv-1"].expired_in == [None]  # the current system's folder: no serverName sent

            async def expired_object_gone() -> bool:
                return await get_or_none(client, POSTGRES_BACKUP, "inv-initial", namespace) is None

            await eventually(expired_object_gone, timeout=20)
            assert "BackupsExpired" in await event_reasons(client, namespace, "inv")
            names = {b["metadata"]["name"] for b in (await client.list(POSTGRES_BACKUP, namespace))[0]}
            assert names == {"extra", name}  # exactly one backup for the slot, however many passes saw it due
            extra_end = backup_plan.parse_time((await backup_status(client, namespace, "extra"))["completedAt"])
            assert extra_end is not None

            async def recoverable_from_the_window_base() -> Obj | None:
                backup = (await status_of(client, namespace, "inv")).get("backup") or {}
                point = backup_plan.parse_time(backup.get("firstRecoverabilityPoint"))
                return backup if point == extra_end.replace(microsecond=0) else None

            await eventually(recoverable_from_the_window_base, timeout=20)
            assert all(extra_id not in ids for ids in fakes["inv-1"].expired)


async def test_a_failed_backup_is_retried_then_failed_for_good_and_one_that_fails_once_completes(
    control_plane: Endpoint, client: Client, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast = backup_retry.RetryPolicy(base=timedelta(seconds=0.5), cap=timedelta(seconds=1), max_attempts=2)
    monkeypatch.setattr(backup_retry, "DEFAULT", fast)
    monkeypatch.setattr(backup_controller, "POLL", 0.5)  # four records to read: no 5 s wait for each
    default = await platform(client, namespace)
    await client.create(POSTGRES_CLUSTER, pgc("pay", namespace, replicas=2, backup={"retentionDays": 7}))
    async with backup_fakes("pay") as (fakes, instances):
        operator = Operator(control_plane, namespace, instances=instances, default_backup_repository=default)
        async with operator.running(refresh=0.3):
            await pods_running(client, namespace, fakes)  # type: ignore[arg-type]
            await eventually(lambda: phase_is(client, namespace, "pay-initial", "Running"), timeout=40)
            key = await uid_of(client, namespace, "pay-initial")
            refused = "barman-cloud-backup exited 1: connection refused"
            (await started(fakes, key)).finish(key, datetime.now(UTC), failed=refused)
            # The second attempt runs under its own key (the first key would only answer the failed record).
            second = backup_retry.attempt_id(key, 2)
            (await started(fakes, second)).finish(second, datetime.now(UTC), failed=refused)
            failed = await eventually(lambda: phase_is(client, namespace, "pay-initial", "Failed"), timeout=20)
            assert (failed["reason"], failed["attempts"], failed["lastErrorReason"]) == (
                "BackupFailed",
                2,
                "BackupFailed",
            )
            assert "connection refused" in failed["message"]
            assert "all 2 attempts failed" in failed["message"]
            assert "BackupRetryScheduled" in await event_reasons(client, namespace, "pay-initial")
            lost = await eventually(lambda: condition(client, namespace, "pay", "LastBackupSucceeded"), timeout=20)
            assert (lost["status"], lost["reason"]) == ("False", "BackupFailed")
            assert "connection refused" in lost["message"]
            assert "BackupFailed" in await event_reasons(client, namespace, "pay")
            assert "BackupFailed" in await event_reasons(client, namespace, "pay-initial")
            labels = {"namespace": namespace, "cluster": "pay"}
            assert operator.registry.get_sample_value("kanri_postgres_backup_failures_total", labels) == 1.0
            assert operator.registry.get_sample_value("kanri_postgres_backup_last_succeeded", labels) == 0.0
            # The store comes back between two attempts: the retry completes, the attempts recorded.
            await client.create(POSTGRES_BACKUP, pgbackup("retried", namespace, "pay"))
            await eventually(lambda: phase_is(client, namespace, "retried", "Running"), timeout=20)
            key = await uid_of(client, namespace, "retried")
            (await started(fakes, key)).finish(key, datetime.now(UTC), failed=refused)
            second = backup_retry.attempt_id(key, 2)
            (await started(fakes, second)).finish(second, datetime.now(UTC))
            done = await eventually(lambda: phase_is(client, namespace, "retried", "Completed"), timeout=20)
            assert (done["attempts"], done["lastErrorReason"]) == (2, "BackupFailed")
            assert "connection refused" in done["lastError"]
            assert operator.registry.get_sample_value("kanri_postgres_backup_failures_total", labels) == 1.0
            # A backup of a cluster that does not exist waits, saying so.
            await client.create(POSTGRES_BACKUP, pgbackup("nowhere", namespace, "ghost"))
            waiting = await eventually(lambda: phase_is(client, namespace, "nowhere", "Pending"), timeout=20)
            assert waiting["reason"] == "ClusterNotFound"


async def test_the_running_intent_is_written_only_over_the_version_read(client: Client, namespace: str) -> None:
    """The guard behind "never a second intent": a status merge patch carrying a stale resourceVersion is refused."""
    stale = await client.create(POSTGRES_BACKUP, pgbackup("raced", namespace, "shop"))
    await client.patch_status(POSTGRES_BACKUP, "raced", {"status": {"phase": "Running", "instance": "shop-1"}},
                              namespace)  # fmt: skip
    events = EventRecorder(client, component="test")
    reconciler = PostgresBackupReconciler(Cache(client), client, instances=HttpInstanceClient(), events=events,
                                          settings=BackupSettings)  # fmt: skip
    with pytest.raises(ApiError) as refused:
        await reconciler.write(stale, {"phase": "Running", "instance": "shop-2"}, guard=True)
    assert refused.value.status == 409
    assert (await backup_status(client, namespace, "raced"))["instance"] == "shop-1"
