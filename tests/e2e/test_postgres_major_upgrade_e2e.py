"""Major upgrades carried out end to end (issue 14 item 3): PyPI PostgreSQL 14 → 15 in the local node's pods, real
Barman Cloud backups into the local object store (the fresh-backup gate), the real ``pg_upgrade``.

- A primary and two replicas with data and extensions: unapproved it waits and keeps serving 14; approved, the
  operator takes the fresh backup itself (``<cluster>-pre-upgrade-15-<approvedAt>``, issue 29 item 1: nobody runs
  ``kanri backup``) and waits for it; then the check pod, the stop, ``pg_upgrade --link`` on the primary's volume,
  the replicas cloned again: every instance runs 15, the data is checksummed equal, the extensions are there
  (pg_stat_statements updated by the update_extensions.sql pg_upgrade wrote), the statistics rebuilt, the downtime
  is recorded, writes go on and reach both replicas.
- A catalog pg_upgrade cannot carry (a ``regproc`` column: a real incompatibility) ends ``Failed`` with the check's
  own reason naming the table, and the cluster keeps serving on 14 — the check never stopped it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import json
import sys
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.pg_binaries import installed, newest_per_major
from kanri.local.seaweedfs import S3_BUCKET, S3_SERVICE, backup_tools_bin
from kanri.postgres import names
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.postgres.upgrade.machine import pre_upgrade_backup
from kanri.runtime import ApiError, Client, parse_optional_time
from kanri.runtime.kinds import EVENT, POD, SECRET, STATEFUL_SET
from tests.e2e.postgres_helpers import cluster, every_instance_has, pod_ips, ready, write_row
from tests.e2e.test_backup_archiving_e2e import (  # noqa: F401  (node, store: the fixtures)
    Store,
    node,
    store,
    superuser_rows,
    superuser_sql,
)
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
_NEWEST = newest_per_major(installed())
pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.skipif(not {14, 15} <= set(_NEWEST), reason="PyPI PostgreSQL 14 and 15 not installed"),
    pytest.mark.skipif(not (backup_tools_bin() / "barman-cloud-backup").exists(), reason="no backup tools"),
]
CHECKSUM = "SELECT md5(string_agg(id::text || ':' || note, ',' ORDER BY id)) FROM ledger"
PGSS_VERSION = "SELECT extversion FROM pg_extension WHERE extname = 'pg_stat_statements'"
LEDGER_ANALYZED = (
    "SELECT last_analyze IS NOT NULL AND EXISTS (SELECT 1 FROM pg_stats WHERE tablename = 'ledger') "
    "FROM pg_stat_user_tables WHERE relname = 'ledger'"
)


async def _when(rows: Awaitable[list[Any] | None], expected: list[Any]) -> list[Any] | None:
    """``rows`` once they are ``expected`` (None before: for eventually)."""
    found = await rows
    return found if found == expected else None


@pytest_asyncio.fixture(loop_scope="session")
async def upgrading_operator(control_plane: Endpoint, namespace: str, store: Store) -> AsyncIterator[Operator]:  # noqa: F811
    repository = S3Repository.model_validate({"endpoint": store.endpoint, "bucket": S3_BUCKET, "path": "upgrade",
                                              "credentialsSecret": {"name": f"{S3_SERVICE}-keys"}})  # fmt: skip
    instances = HttpInstanceClient()
    try:
        yield Operator(control_plane, namespace, instances=instances, default_backup_repository=repository)
    finally:
        await instances.close()


async def _ledger(client: Client, namespace: str, name: str, rows: int) -> list[Any]:
    """pgcrypto and a ledger of ``rows`` hashed rows on the primary; the ledger's checksum."""
    await superuser_rows(client, namespace, name, "CREATE EXTENSION pgcrypto")
    await superuser_rows(client, namespace, name, "CREATE TABLE ledger (id int PRIMARY KEY, note text)")
    await superuser_rows(client, namespace, name, "INSERT INTO ledger SELECT g, encode(digest(g::text, 'sha256'), "
                        f"'hex') FROM generate_series(1, {rows}) g")  # fmt: skip
    return await superuser_rows(client, namespace, name, CHECKSUM)


async def _record(client: Client, namespace: str, name: str, phase: str) -> Obj | None:
    status = (await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {}
    record = status.get("upgrade")
    return record if record and record.get("phase") == phase else None


async def _first_backup(client: Client, namespace: str, name: str) -> str | None:
    """The first base backup completed (so the approval below comes after it)."""
    status = (await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {}
    return (status.get("backup") or {}).get("lastSuccessful")


async def _completed(client: Client, namespace: str, name: str) -> Obj | None:
    try:
        status = (await client.get(POSTGRES_BACKUP, name, namespace)).get("status") or {}
    except ApiError as exc:
        if exc.not_found:
            return None
        raise
    assert status.get("phase") != "Failed", status
    return status if status.get("phase") == "Completed" else None


async def _reasons(client: Client, namespace: str) -> list[str]:
    events, _ = await client.list(EVENT, namespace)
    return [str(e.get("reason")) for e in sorted(events, key=lambda e: str(e.get("firstTimestamp") or ""))]


async def _images(client: Client, namespace: str, name: str, replicas: int) -> set[str]:
    found = set()
    for n in range(1, replicas + 1):
        sts = await client.get(STATEFUL_SET, f"{name}-{n}", namespace)
        found |= {c["image"] for c in sts["spec"]["template"]["spec"]["containers"]}
    return found


async def _versions(client: Client, namespace: str, name: str) -> set[str] | None:
    """server_version of every instance (through each pod's address), None while one cannot answer."""
    seen = set()
    for ip in (await pod_ips(client, namespace, name)).values():
        rows = await _superuser_at(client, namespace, name, ip, "SHOW server_version")
        if not rows:
            return None
        seen.add(str(rows[0][0]))
    return seen or None


async def _superuser_at(client: Client, namespace: str, name: str, host: str, query: str) -> list[Any] | None:
    secret = await client.get(SECRET, names.superuser_secret(name), namespace)
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    try:
        async with await psycopg.AsyncConnection.connect(host=host, port=5432, user=data["username"],
                                                          password=data["password"], dbname="postgres",
                                                          connect_timeout=5, autocommit=True) as conn:  # fmt: skip
            return list(await (await conn.execute(query)).fetchall())
    except psycopg.Error:
        return None


async def _pre_upgrade_backup(client: Client, namespace: str, name: str, to: int) -> str:
    """The backup the operator took for the approved upgrade on its own, once Completed: its name."""
    record = await eventually(lambda: _record(client, namespace, name, "WaitingForPreconditions"), timeout=60)
    approved_at = parse_optional_time(record["approvedAt"])
    assert approved_at is not None
    backup = pre_upgrade_backup(name, to, approved_at)
    await eventually(lambda: _completed(client, namespace, backup), timeout=240, interval=1)
    return backup


async def test_a_cluster_of_three_is_upgraded_from_14_to_15_after_approval_and_a_fresh_backup(
    client: Client,
    upgrading_operator: Operator,
    namespace: str,
    store: Store,  # noqa: F811
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster("up", namespace, 3, version=14, backup={"retentionDays": 7}))
    async with upgrading_operator.running(refresh=2.0):
        await eventually(lambda: ready(client, namespace, "up", 3), timeout=240, interval=1)
        before = await _ledger(client, namespace, "up", 20000)
        assert before
        assert before[0][0]
        # 14 ships pg_stat_statements 1.9, 15 ships 1.10: pg_upgrade writes update_extensions.sql for it
        await superuser_rows(client, namespace, "up", "CREATE EXTENSION pg_stat_statements")
        assert await superuser_rows(client, namespace, "up", PGSS_VERSION) == [("1.9",)]
        await write_row(client, namespace, "up", 1)
        await eventually(lambda: _first_backup(client, namespace, "up"), timeout=120, interval=1)

        # unapproved: recorded, nothing changes
        await client.patch(POSTGRES_CLUSTER, "up", {"spec": {"version": 15}}, namespace)
        await eventually(lambda: _record(client, namespace, "up", "WaitingForApproval"), timeout=30)
        assert await _images(client, namespace, "up", 3) == {"kanri.dev/postgres:14"}
        # approved: the backup gate (the first backup was taken before the approval)
        await client.patch(POSTGRES_CLUSTER, "up", {"spec": {"upgrade": {"approvedVersion": 15}}}, namespace)
        gated = await eventually(lambda: _record(client, namespace, "up", "WaitingForPreconditions"), timeout=60)
        assert "no base backup completed after the approval" in gated["message"]
        assert "the pre-upgrade backup up-pre-upgrade-15-" in gated["message"]
        # nobody runs `kanri backup`: the operator takes it
        await _pre_upgrade_backup(client, namespace, "up", 15)
        # a commit after the last backup, in a WAL segment nothing closes before the stop: the upgrade must archive
        # it, or the old system's archive would end before the upgrade and this commit could not be restored
        await superuser_rows(client, namespace, "up", "CREATE TABLE marker AS SELECT 42 AS answer")
        assert await superuser_rows(client, namespace, "up", "SELECT answer FROM marker") == [(42,)]
        where = await superuser_rows(client, namespace, "up", "SELECT pg_walfile_name(pg_current_wal_lsn())")
        assert where, "the primary answers"
        last_segment = str(where[0][0])

        upgrading = await eventually(lambda: _record(client, namespace, "up", "Upgrading"), timeout=180, interval=1)
        assert upgrading["primary"] in {"up-1", "up-2", "up-3"}
        done = await eventually(lambda: _record(client, namespace, "up", "Succeeded"), timeout=600, interval=1)
        assert done["downtimeSeconds"] > 0
        assert done["from"] == 14
        assert done["to"] == 15
        print(f"major upgrade 14 -> 15: downtime {done['downtimeSeconds']} s, pg_upgrade "
              f"{done.get('pgUpgradeSeconds')} s")  # fmt: skip
        await eventually(lambda: ready(client, namespace, "up", 3), timeout=120, interval=1)
        assert await _images(client, namespace, "up", 3) == {"kanri.dev/postgres:15"}
        versions = await eventually(lambda: _versions(client, namespace, "up"), timeout=60)
        assert versions == {_NEWEST[15].tag}, versions
        assert await superuser_rows(client, namespace, "up", CHECKSUM) == before
        assert await superuser_rows(client, namespace, "up", "SELECT extname FROM pg_extension WHERE extname = "
                                   "'pgcrypto'") == [("pgcrypto",)]  # fmt: skip
        # after the upgrade, on the new primary: update_extensions.sql ran, and the statistics were rebuilt (before
        # 18 pg_upgrade carries none, and the new server's activity counters start empty, so autovacuum would not
        # analyze the unchanged ledger: last_analyze is the post-upgrade vacuumdb --analyze-in-stages)
        updated = await eventually(lambda: _when(superuser_sql(client, namespace, "up", PGSS_VERSION), [("1.10",)]),
                                   timeout=120, interval=2)  # fmt: skip
        assert updated == [("1.10",)]
        analyzed = await eventually(lambda: _when(superuser_sql(client, namespace, "up", LEDGER_ANALYZED), [(True,)]),
                                    timeout=120, interval=2)  # fmt: skip
        assert analyzed == [(True,)]
        # writes go on and reach both re-cloned replicas
        await write_row(client, namespace, "up", 2)
        await eventually(lambda: every_instance_has(client, namespace, "up", [1, 2]), timeout=60, interval=1)
        # the new system archives into a folder of its own and gets its first base backup at once; the old system's
        # backups and WAL stay where they were
        status = (await client.get(POSTGRES_CLUSTER, "up", namespace))["status"]
        assert status["backup"]["serverName"] == "up.pg15"
        first = await eventually(lambda: _completed(client, namespace, "up-pg15-initial"), timeout=240, interval=2)
        assert first["serverName"] == "up.pg15"
        folder = f"upgrade/{namespace}"
        new_base = await store.keys_under(f"{folder}/up.pg15/base/")
        assert any(key.endswith("backup.info") for key in new_base), new_base
        assert await store.keys_under(f"{folder}/up.pg15/wals/")
        old_bases = {key.split("/")[4] for key in await store.keys_under(f"{folder}/up/base/")}
        assert len(old_bases) == 2, old_bases  # up-initial and the pre-upgrade backup, on PostgreSQL 14
        assert await store.keys_under(f"{folder}/up/wals/{last_segment[:16]}/{last_segment}"), last_segment

        # the way back: the old system restored, to its end, into a new cluster of the old major (docs: Rollback)
        back = cluster("back", namespace, 1, version=14, bootstrap={"recovery": {"source": "up"}})
        await client.create(POSTGRES_CLUSTER, back)
        await eventually(lambda: ready(client, namespace, "back", 1), timeout=300, interval=2)
        assert await superuser_rows(client, namespace, "back", "SELECT answer FROM marker") == [(42,)]
        assert await superuser_rows(client, namespace, "back", CHECKSUM) == before
        assert await superuser_rows(client, namespace, "back", "SHOW server_version") == [(_NEWEST[14].tag,)]
        reasons = await _reasons(client, namespace)
        # every step as an Event (with client-go's per-object spam filter the last ones were dropped: the stop and
        # start add routine Events about the cluster; the recorder's budget is per object and reason now)
        for reason in ("UpgradeWaitingForApproval", "UpgradeWaitingForPreconditions", "UpgradeBackupRequested",
                       "UpgradeChecking",
                       "UpgradeCheckPassed", "UpgradeStopping", "UpgradeRunning", "UpgradeDataUpgraded",
                       "UpgradeSucceeded"):  # fmt: skip
            assert reason in reasons, reasons
        assert "FailedOver" not in reasons  # the planned downtime is no failover


async def test_an_upgrade_the_check_refuses_fails_and_the_cluster_keeps_serving_14(
    client: Client,
    upgrading_operator: Operator,
    namespace: str,
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster("bad", namespace, 1, version=14, backup={"retentionDays": 7}))
    async with upgrading_operator.running(refresh=2.0):
        await eventually(lambda: ready(client, namespace, "bad", 1), timeout=240, interval=1)
        await eventually(lambda: _first_backup(client, namespace, "bad"), timeout=120, interval=1)
        # a regproc column: pg_upgrade cannot carry reg* OIDs into another major's catalog
        await superuser_rows(client, namespace, "bad", "CREATE TABLE procs (p regproc)")
        await client.patch(POSTGRES_CLUSTER, "bad", {"spec": {"version": 15, "upgrade": {"approvedVersion": 15}}},
                           namespace)  # fmt: skip
        await _pre_upgrade_backup(client, namespace, "bad", 15)
        failed = await eventually(lambda: _record(client, namespace, "bad", "Failed"), timeout=300, interval=1)
        assert "reg*" in failed["message"], failed["message"]
        assert "procs" in failed["message"], failed["message"]
        await eventually(lambda: _event_seen(client, namespace, "UpgradeCheckFailed"), timeout=30, interval=0.5)
        # still 14, still serving, and not retried: a later pass leaves the record and the instance alone
        assert await _images(client, namespace, "bad", 1) == {"kanri.dev/postgres:14"}
        await write_row(client, namespace, "bad", 7)
        await asyncio.sleep(10)
        assert await _record(client, namespace, "bad", "Failed") == failed
        pods, _ = await client.list(POD, namespace, label_selector="kanri.dev/upgrade")
        assert pods == []


@contextlib.asynccontextmanager
async def _operator_process(operator: Operator, repository: Path) -> AsyncIterator[asyncio.subprocess.Process]:
    """``kanri run`` in a process of its own (the default repository from ``repository``), which the test may
    SIGKILL; killed at the end if still running."""
    namespace = operator.namespace
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kanri.cli.main", "run", f"--kubeconfig={operator.control_plane.kubeconfig}",
        f"--namespace={namespace}", f"--leader-election-namespace={namespace}", "--no-leader-election",
        "--health-port=0", f"--default-backup-repository={repository}",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


_STEPS = ("Stopping", "Upgrading", "Starting")


async def _no_upgrade_pods(client: Client, namespace: str) -> bool:
    pods, _ = await client.list(POD, namespace, label_selector="kanri.dev/upgrade")
    return not pods


async def _reached(client: Client, namespace: str, name: str, step: str) -> Obj | None:
    """status.upgrade once the upgrade reached ``step`` (or a later one)."""
    status = (await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {}
    record = status.get("upgrade") or {}
    if record.get("phase") == "Succeeded":
        return dict(record)
    if record.get("phase") == "Upgrading" and _STEPS.index(record.get("step") or "Stopping") >= _STEPS.index(step):
        return dict(record)
    return None


async def _event_count(client: Client, namespace: str, reason: str) -> int:
    events, _ = await client.list(EVENT, namespace)
    return sum(int(e.get("count") or 1) for e in events if e.get("reason") == reason)


async def _event_seen(client: Client, namespace: str, reason: str) -> bool:
    return await _event_count(client, namespace, reason) > 0


@pytest.mark.skipif(not {17, 18} <= set(_NEWEST), reason="PyPI PostgreSQL 17 and 18 not installed")
async def test_a_primary_and_a_replica_on_a_pinned_17_are_upgraded_to_18_by_operators_killed_mid_way(
    client: Client,
    upgrading_operator: Operator,
    namespace: str,
    store: Store,  # noqa: F811
    tmp_path: Path,
) -> None:
    """17 -> 18, with the operator SIGKILLed three times: once the downtime began (step Stopping recorded), once
    pg_upgrade was to run (step Upgrading recorded), once the instances were starting on 18 (step Starting); a fourth
    operator finishes. pg_upgrade runs exactly once, the data
    is checksummed equal. The cluster is pinned to the older minor 17.10 (``imageName``): it stays on 17.10 while the
    upgrade waits, and the upgrade lands on the imageName asked with the new version."""
    # 18 is the major whose initdb turns data checksums on by default and whose analyze takes --missing-stats-only:
    # the upgrade pod's initdb must copy the old cluster's checksum setting or pg_upgrade refuses
    pinned = {"version": 17, "imageName": "kanri.dev/postgres:17.10", "backup": {"retentionDays": 7}}
    await client.create(POSTGRES_CLUSTER, cluster("hop", namespace, 2, **pinned))
    repository = tmp_path / "repository.yaml"
    default = upgrading_operator.default_backup_repository
    assert default is not None
    repository.write_text(json.dumps(default.model_dump(by_alias=True, exclude_none=True)))
    async with upgrading_operator.running(refresh=2.0):
        await eventually(lambda: ready(client, namespace, "hop", 2), timeout=240, interval=1)
        assert await _versions(client, namespace, "hop") == {"17.10"}
        before = await _ledger(client, namespace, "hop", 5000)
        await eventually(lambda: _first_backup(client, namespace, "hop"), timeout=120, interval=1)
        upgrade = {"version": 18, "imageName": "kanri.dev/postgres:18.6", "upgrade": {"approvedVersion": 18}}
        await client.patch(POSTGRES_CLUSTER, "hop", {"spec": upgrade}, namespace)
        await eventually(lambda: _record(client, namespace, "hop", "WaitingForPreconditions"), timeout=60)
        # waiting: the instances keep 17.10, not the spec's 18.6 nor 17's default (an unasked-for minor update)
        assert await _images(client, namespace, "hop", 2) == {"kanri.dev/postgres:17.10"}
        await _pre_upgrade_backup(client, namespace, "hop", 18)
    cuts: list[str] = []
    for step in _STEPS:
        async with _operator_process(upgrading_operator, repository) as doomed:
            reached = functools.partial(_reached, client, namespace, "hop", step)
            record = await eventually(reached, timeout=300, interval=0.05)
            if step == "Starting":  # the step is recorded before its Event is posted: the kill must not drop it
                await eventually(lambda: _event_seen(client, namespace, "UpgradeDataUpgraded"), timeout=30,
                                 interval=0.05)  # fmt: skip
            doomed.kill()
        cuts.append(f"{record['phase']}/{record.get('step')}")
    print(f"operators killed at: {cuts}")
    assert cuts == [f"Upgrading/{step}" for step in _STEPS], "a kill came after the step it was meant to cut"
    async with upgrading_operator.running(refresh=2.0):
        done = await eventually(lambda: _record(client, namespace, "hop", "Succeeded"), timeout=600, interval=1)
        assert (done["from"], done["to"]) == (17, 18)
        print(f"major upgrade 17 -> 18: downtime {done['downtimeSeconds']} s, pg_upgrade "
              f"{done.get('pgUpgradeSeconds')} s")  # fmt: skip
        await eventually(lambda: ready(client, namespace, "hop", 2), timeout=180, interval=1)
        assert await _images(client, namespace, "hop", 2) == {"kanri.dev/postgres:18.6"}
        versions = await eventually(lambda: _versions(client, namespace, "hop"), timeout=60)
        assert versions == {_NEWEST[18].tag}, versions
        assert await superuser_rows(client, namespace, "hop", CHECKSUM) == before
        await write_row(client, namespace, "hop", 3)
        await eventually(lambda: every_instance_has(client, namespace, "hop", [3]), timeout=60, interval=1)
        status = (await client.get(POSTGRES_CLUSTER, "hop", namespace))["status"]
        assert status["backup"]["serverName"] == "hop.pg18"
        # pg_upgrade ran once: one data directory upgraded, never a second run over it
        assert await _event_count(client, namespace, "UpgradeDataUpgraded") == 1
        # and no pod of the upgrade is left behind by a killed operator (it would keep its address and the label)
        await eventually(lambda: _no_upgrade_pods(client, namespace), timeout=60, interval=1)

        # the new system is restorable: its first base backup, in hop.pg18, into a new cluster of 18
        await eventually(lambda: _completed(client, namespace, "hop-pg18-initial"), timeout=240, interval=2)
        await client.create(POSTGRES_CLUSTER, cluster("hop-back", namespace, 1, version=18,
                                                      bootstrap={"recovery": {"source": "hop"}}))  # fmt: skip
        await eventually(lambda: ready(client, namespace, "hop-back", 1), timeout=300, interval=2)
        assert await superuser_rows(client, namespace, "hop-back", CHECKSUM) == before
        assert await superuser_rows(client, namespace, "hop-back", "SHOW server_version") == [(_NEWEST[18].tag,)]
