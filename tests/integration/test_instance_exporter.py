"""The instance exporter against real PostgreSQL 15: a primary and a streaming replica, each a real instance manager
process serving ``/metrics``; the values follow what the servers do (commits, checkpoints, a fenced replica)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from kanri.local.ports import free_port
from tests.integration.test_instance_manager import (
    BASE_PARAMETERS,
    CLUSTER,
    PG_BIN,
    Instance,
    Workspace,
    _cleanup,
    chown_tree,
    postmasters,
)
from tests.support import eventually

pytestmark = [
    pytest.mark.skipif(not (PG_BIN / "postgres").exists(), reason=f"no PostgreSQL binaries in {PG_BIN}"),
    pytest.mark.timeout(180),
    pytest.mark.asyncio(loop_scope="session"),
]

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


def exporting(instance: Instance) -> Instance:
    instance.extra_env["KANRI_METRICS_PORT"] = str(free_port())
    return instance


async def scrape(instance: Instance) -> tuple[str, Series]:
    """The exporter's text and its samples: (name, labels) → value."""
    url = f"http://127.0.0.1:{instance.extra_env['KANRI_METRICS_PORT']}/metrics"
    async with aiohttp.ClientSession() as http, http.get(url) as response:
        assert response.status == 200
        text = await response.text()
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return text, series


def value(series: Series, name: str, **labels: str) -> float | None:
    """The value of the one series ``name`` with at least ``labels`` (None when absent)."""
    found = [v for (n, ls), v in series.items() if n == name and set(labels.items()) <= ls]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


@pytest.fixture(scope="module")
def workspace() -> Iterator[Workspace]:
    root = Path(tempfile.mkdtemp(prefix="kanri-exporter-"))
    ws = Workspace(root)
    ws.write_secrets()
    ws.write_config(BASE_PARAMETERS, [f"{CLUSTER}-1", f"{CLUSTER}-2"])
    chown_tree(root)
    try:
        yield ws
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def pair(workspace: Workspace) -> AsyncIterator[tuple[Instance, Instance]]:
    primary = exporting(Instance(workspace, f"{CLUSTER}-1", "primary"))
    replica = exporting(Instance(workspace, f"{CLUSTER}-2", "replica"))
    try:
        await primary.start()
        await primary.wait_ready()
        await replica.start(primary_port=primary.pg_port)
        await replica.wait_ready()
        yield primary, replica
    finally:
        await _cleanup(replica, primary)


async def test_primary_exports_role_standbys_databases_wal_volume_and_counters(
    pair: tuple[Instance, Instance],
) -> None:
    primary, _ = pair

    async def streaming_standby() -> Series | None:
        _, series = await scrape(primary)
        return series if value(series, "kanri_instance_standby_streaming", standby=f"{CLUSTER}-2") == 1 else None

    series = await eventually(streaming_standby, timeout=30)
    base = {"namespace": "test", "cluster": CLUSTER, "instance": f"{CLUSTER}-1"}
    assert value(series, "kanri_instance_up", **base) == 1
    assert value(series, "kanri_instance_role", role="primary", **base) == 1
    assert value(series, "kanri_instance_timeline") == 1
    assert value(series, "kanri_instance_fenced") == 0
    assert value(series, "kanri_instance_postgres_running") == 1
    assert value(series, "kanri_instance_replication_lag_bytes", standby=f"{CLUSTER}-2") is not None
    assert value(series, "kanri_instance_replication_lag_seconds", standby=f"{CLUSTER}-2") is not None
    assert (value(series, "kanri_instance_database_size_bytes", database="orders") or 0) > 1_000_000
    wal = value(series, "kanri_instance_wal_bytes") or 0
    size = value(series, "kanri_instance_volume_size_bytes") or 0
    free = value(series, "kanri_instance_volume_free_bytes") or 0
    assert 16 * 1024 * 1024 <= wal < size
    assert 0 < free < size
    assert value(series, "kanri_instance_archived_total") is not None
    assert value(series, "kanri_instance_archive_pending") == 0  # this primary does not archive: nothing waits

    commits = value(series, "kanri_instance_xact_commit_total", database="orders") or 0
    checkpoints = value(series, "kanri_instance_checkpoints_requested_total") or 0
    async with await primary.connect(dbname="orders") as conn:
        for _ in range(5):
            await conn.execute("SELECT 1")  # autocommit: each statement is a committed transaction
        await conn.execute("CHECKPOINT")

        async def counted() -> Series | None:
            _, now = await scrape(primary)
            done = (value(now, "kanri_instance_xact_commit_total", database="orders") or 0) >= commits + 5 and (
                value(now, "kanri_instance_checkpoints_requested_total") or 0
            ) > checkpoints
            idle = value(now, "kanri_instance_connections", state="idle") or 0
            return now if done and idle >= 1 else None  # this very connection, idle between statements

        await eventually(counted, timeout=30)


async def test_replica_exports_its_wal_receiver_and_a_fence_shows_as_down(
    pair: tuple[Instance, Instance], workspace: Workspace
) -> None:
    primary, replica = pair
    _, series = await scrape(replica)
    assert value(series, "kanri_instance_role", role="replica", instance=f"{CLUSTER}-2") == 1
    assert value(series, "kanri_instance_wal_receiver_streaming") == 1
    assert value(series, "kanri_instance_replay_lag_bytes") is not None
    assert value(series, "kanri_instance_standby_streaming") is None  # a replica has no WAL senders here

    code, _ = await replica.post_json("/fence", workspace.token, {"reason": "exporter test"})
    assert code == 200
    try:

        async def fenced() -> Series | None:
            _, now = await scrape(replica)
            return now if value(now, "kanri_instance_up") == 0 else None

        now = await eventually(fenced, timeout=30)
        assert value(now, "kanri_instance_fenced") == 1
        assert value(now, "kanri_instance_postgres_running") == 0
        assert value(now, "kanri_instance_role") is None  # unknown without PostgreSQL: not guessed

        async def standby_gone() -> bool:
            _, seen = await scrape(primary)
            return value(seen, "kanri_instance_standby_streaming", standby=f"{CLUSTER}-2") is None

        await eventually(standby_gone, timeout=30)
    finally:
        code, _ = await replica.post_json("/unfence", workspace.token, {})
        assert code == 200

    async def back() -> bool:
        _, now = await scrape(replica)
        return value(now, "kanri_instance_up") == 1 and value(now, "kanri_instance_wal_receiver_streaming") == 1

    await eventually(back, timeout=60)

    # The manager's log: one JSON object per line (log_events parses each), every one with the instance's keys, and
    # the fence's line with its reason (the keys the exporter's labels and the cluster's conditions use).
    lines = replica.log_events()
    keys = {"namespace": "test", "cluster": CLUSTER, "instance": f"{CLUSTER}-2"}
    assert all(keys.items() <= line.items() and {"event", "level", "timestamp"} <= set(line) for line in lines)
    assert any(line["event"].startswith("fenced") and line.get("reason") == "exporter test" for line in lines), lines


def server_processes(instance: Instance) -> list[int]:
    """The postmaster of ``instance`` and every process it forked (backends, WAL receiver, ...)."""
    (postmaster,) = (int(pid) for pid in postmasters(instance.pgdata))
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == postmaster:  # the field after the state: the parent's pid
            children.append(int(stat.parent.name))
    return [postmaster, *children]


async def test_a_frozen_postgresql_does_not_hold_a_scrape_and_shows_as_down(pair: tuple[Instance, Instance]) -> None:
    """Every PostgreSQL process of the replica stopped (SIGSTOP): its statement timeout cannot fire, the exporter's
    own deadline must; meanwhile each scrape answers from the last snapshot."""
    _, replica = pair
    frozen = server_processes(replica)
    for pid in frozen:
        os.kill(pid, signal.SIGSTOP)
    try:

        async def down() -> bool:
            async with asyncio.timeout(10):  # a scrape that waited on PostgreSQL would not answer at all
                _, series = await scrape(replica)
            return value(series, "kanri_instance_up") == 0 and value(series, "kanri_instance_postgres_running") == 1

        await eventually(down, timeout=60, interval=0.5)
    finally:
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    async def back() -> bool:
        _, series = await scrape(replica)
        return value(series, "kanri_instance_up") == 1 and value(series, "kanri_instance_wal_receiver_streaming") == 1

    await eventually(back, timeout=60)


async def test_no_password_in_the_metrics(pair: tuple[Instance, Instance], workspace: Workspace) -> None:
    for instance in pair:
        text, _ = await scrape(instance)
        assert "kanri_instance_up" in text
        for password in workspace.passwords.values():
            assert password not in text
        assert workspace.token not in text
