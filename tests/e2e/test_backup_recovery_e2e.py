"""Recovery and restore rehearsals end to end, on a local node through the operator (issue 13 items 7 and 8): real
PostgreSQL 15 and Barman Cloud in the pods, the object store a workload of the local cluster (SeaweedFS).

One source cluster with its first base backup. Row 1 is written, the server's clock read (the moment "between"),
row 2 written and its segment archived. Then:

- recoverable from day one (issue 29 item 2): the first rehearsal runs by itself once the first backup completed (not
  at the weekly slot), and ``kanri status`` shows it;
- point-in-time recovery: a new cluster with ``bootstrap.recovery {source, targetTime: between}`` is Ready and holds
  row 1 and not row 2, through its own Service, as its own app user;
- a rehearsal on demand (``kanri.dev/restore-test``) restores the latest backup plus the archive in a throwaway pod,
  passes, recovers past "between", is recorded with an Event and its pod removed;
- the first WAL file the backup needs is deleted from the bucket (a damaged backup): the next rehearsal fails loudly
  (status ``Failed`` with PostgreSQL's reason, a Warning Event) while the source cluster keeps serving;
- ``kanri status`` shows the instance, the backups line with the failed rehearsal, archiving and the Warning Event.
"""

from __future__ import annotations

import asyncio
import re
from datetime import datetime
from pathlib import PurePosixPath
from typing import Any

import pytest

from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.local.seaweedfs import backup_tools_bin
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.postgres.recovery.rehearsal import ANNOTATION, FIRST_BACKUP
from kanri.runtime import Client
from kanri.runtime.kinds import EVENT, POD
from tests.e2e.postgres_helpers import cluster, cluster_ip, credentials, gone, ready, rows_through, write_row
from tests.e2e.test_backup_archiving_e2e import Store, segments, start_store, superuser_sql
from tests.integration.test_cli_status import invoke, row
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
NAME = "pitr"
pytestmark = [
    pytest.mark.timeout(720),
    pytest.mark.skipif(
        not (backup_tools_bin() / "barman-cloud-wal-archive").exists() or not (backup_tools_bin() / "weed").exists(),
        reason="no backup tools (make backup-tools)",
    ),
]


async def first_backup(client: Client, namespace: str) -> Obj | None:
    """The cluster's first PostgresBackup once it completed."""
    backups = (await client.list(POSTGRES_BACKUP, namespace))[0]
    done = [b for b in backups if b["spec"]["cluster"] == NAME and (b.get("status") or {}).get("phase") == "Completed"]
    return done[0] if done else None


async def server_time(client: Client, namespace: str) -> datetime:
    rows = await eventually(lambda: superuser_sql(client, namespace, NAME, "SELECT clock_timestamp()"))
    moment = rows[0][0]
    assert isinstance(moment, datetime)
    return moment


async def archived(store: Store, namespace: str, segment: str) -> bool:
    return segment in segments(await store.keys_under(f"e2e/{namespace}/{NAME}/"))


async def rehearse(client: Client, namespace: str, request: str) -> Obj:
    """Ask for a rehearsal with a new annotation value; the record that answered it."""
    await client.patch(POSTGRES_CLUSTER, NAME, {"metadata": {"annotations": {ANNOTATION: request}}}, namespace)

    async def answered() -> Obj | None:
        status = (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}
        record = (status.get("backup") or {}).get("lastRestoreTest") or {}
        return dict(record) if record.get("request") == request else None

    record: Obj = await eventually(answered, timeout=300, interval=1)
    return record


async def first_rehearsal(client: Client, namespace: str) -> Obj | None:
    """The rehearsal the operator ran on its own after the first backup, once recorded."""
    status = (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}
    record = (status.get("backup") or {}).get("lastRestoreTest") or {}
    return dict(record) if record.get("request") == FIRST_BACKUP else None


async def events(client: Client, namespace: str, reason: str) -> list[Obj]:
    found, _ = await client.list(EVENT, namespace)
    return [e for e in found if e.get("reason") == reason]


async def test_a_point_in_time_restore_and_rehearsals_that_pass_and_fail_loudly_on_a_damaged_backup(
    client: Client, control_plane: Endpoint, node: LocalNode, namespace: str
) -> None:
    store = await start_store(client, namespace)
    instances = HttpInstanceClient()
    operator = Operator(control_plane, namespace, instances=instances, default_backup_repository=store.repository())
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 1, backup={"retentionDays": 14}))
    try:
        async with operator.running(refresh=2.0):
            await eventually(lambda: ready(client, namespace, NAME, 1), timeout=240, interval=1)
            backup = await eventually(lambda: first_backup(client, namespace), timeout=180, interval=1)
            await write_row(client, namespace, NAME, 1)
            await asyncio.sleep(1)
            between = await server_time(client, namespace)
            await asyncio.sleep(1)
            await write_row(client, namespace, NAME, 2)
            rows = await eventually(lambda: superuser_sql(client, namespace, NAME,
                                                          "SELECT pg_walfile_name(pg_switch_wal())"))  # fmt: skip
            segment = str(rows[0][0])
            await eventually(lambda: archived(store, namespace, segment), timeout=120, interval=1)

            # point-in-time recovery into a new cluster: row 1 committed before the target, row 2 after it
            recovery = {"source": NAME, "targetTime": between.isoformat()}
            await client.create(POSTGRES_CLUSTER, cluster("pitr-back", namespace, 1, bootstrap={"recovery": recovery}))
            await eventually(lambda: ready(client, namespace, "pitr-back", 1), timeout=300, interval=2)
            user, password = await credentials(client, namespace, "pitr-back")
            restored = await rows_through(await cluster_ip(client, namespace, "pitr-back-rw"), user, password)
            assert restored == [1], restored

            # nobody asked: the first rehearsal ran once the first backup completed (meanwhile, beside the restore)
            first = await eventually(lambda: first_rehearsal(client, namespace), timeout=240, interval=1)
            print(f"\nfirst rehearsal, after the first backup: {first}")
            assert first["result"] == "Succeeded", first
            output = await asyncio.to_thread(
                invoke, "status", NAME, "-n", namespace, "--kubeconfig", str(control_plane.kubeconfig)
            )
            backups = next(line for line in output.splitlines() if line.startswith("Backups:"))
            assert "last restore rehearsal Succeeded" in backups, backups
            await eventually(lambda: gone(client, namespace, f"{NAME}-restore-test", POD), timeout=60, interval=1)

            # a rehearsal of the good backup: every check passes, the pod is removed
            good = await rehearse(client, namespace, "first")
            print(f"\nrehearsal of {backup['status']['backupId']}: {good}")
            assert good["result"] == "Succeeded", good
            assert good.get("recoveredTo"), good
            assert datetime.fromisoformat(good["recoveredTo"]) > between, good  # replayed past row 1, to row 2
            # the Event follows the status write it reports
            await eventually(lambda: events(client, namespace, "RestoreTestSucceeded"), timeout=30, interval=0.5)
            await eventually(lambda: gone(client, namespace, f"{NAME}-restore-test", POD), timeout=60, interval=1)

            # damaged: the first WAL file the backup needs is gone from the bucket
            begin = str(backup["status"]["beginWAL"])
            keys = await store.keys_under(f"e2e/{namespace}/{NAME}/wals/")
            doomed = [k for k in keys if re.fullmatch(rf"{begin}(\.[a-z0-9]+)?", PurePosixPath(k).name)]  # not .backup
            assert len(doomed) == 1, (begin, keys)
            assert await store.delete(doomed) == 1
            bad = await rehearse(client, namespace, "second")
            print(f"rehearsal after {doomed[0]} was deleted: {bad}")
            assert bad["result"] == "Failed", bad
            assert "PostgreSQL stopped before the end of recovery" in str(bad.get("message")), bad

            async def warnings() -> list[Obj]:
                return [e for e in await events(client, namespace, "RestoreTestFailed") if e.get("type") == "Warning"]

            await eventually(warnings, timeout=30, interval=0.5)  # NotYet: no Warning Event for the failed rehearsal
            await eventually(lambda: gone(client, namespace, f"{NAME}-restore-test", POD), timeout=60, interval=1)
            # the source never noticed: still Ready, still taking writes
            assert await ready(client, namespace, NAME, 1)
            await write_row(client, namespace, NAME, 3)

            # `kanri status` tells all of it from the cluster the operator runs (issue 15 item 6)
            output = await asyncio.to_thread(
                invoke, "status", NAME, "-n", namespace, "--kubeconfig", str(control_plane.kubeconfig)
            )
            print(output)
            assert f"PostgresCluster {namespace}/{NAME}" in output
            assert row(output, f"{NAME}-1")[1:4] == ["Primary", "yes", "Running, ready"], output
            backups = next(line for line in output.splitlines() if line.startswith("Backups:"))
            assert "last successful" in backups, backups
            assert "last restore rehearsal Failed" in backups, backups
            assert re.search(r"recoverable from \d{4}-\d\d-\d\dT", backups), backups
            assert row(output, "ContinuousArchiving")[1:3] == ["True", "Archiving"], output
            assert re.search(r"PostgresCluster/pitr +RestoreTestFailed ", output), output  # a Warning Event
    finally:
        await instances.close()
