"""The instance manager's high-availability side against real PostgreSQL 15: replication pause, planned switchover
(demote + promote), rejoin of a former primary (pg_rewind, or a clone when rewinding is impossible), and the
self-fencing of an isolated or frozen primary.

Instances run as in tests/integration/test_instance_manager.py (its helpers are reused): real managers as the
``postgres`` user on 127.0.0.1. Every test builds its own cluster in its own workspace. Replicas reach "the primary"
through a small TCP forwarder the test points at one instance or another, as the ``-rw`` Service follows the role
label in a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kanri.local.ports import free_port
from tests.forwarder import Forwarder
from tests.integration.test_instance_manager import (
    BASE_PARAMETERS,
    CLUSTER,
    PG_BIN,
    Instance,
    Workspace,
    _cleanup,
    all_argv,
    chown_tree,
    postmasters,
)
from tests.support import eventually

pytestmark = [
    pytest.mark.skipif(not (PG_BIN / "postgres").exists(), reason=f"no PostgreSQL binaries in {PG_BIN}"),
    pytest.mark.timeout(240),
]

FIRST, SECOND = f"{CLUSTER}-1", f"{CLUSTER}-2"


@pytest.fixture
def workspace() -> Iterator[Workspace]:
    root = Path(tempfile.mkdtemp(prefix="kanri-instance-ha-"))
    ws = Workspace(root)
    ws.write_secrets()
    ws.write_config(BASE_PARAMETERS, [FIRST, SECOND])
    chown_tree(root)
    try:
        yield ws
    finally:
        if not os.environ.get("KANRI_TEST_KEEP"):
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def forwarder() -> AsyncIterator[Forwarder]:
    fwd = Forwarder()
    yield fwd
    await fwd.close()


@contextlib.asynccontextmanager
async def pair(
    workspace: Workspace, forwarder: Forwarder, env: dict[str, str] | None = None
) -> AsyncIterator[tuple[Instance, Instance]]:
    """A primary (``orders-1``) and a streaming replica (``orders-2``) reaching it through ``forwarder``."""
    primary = Instance(workspace, FIRST, "primary", extra_env=dict(env or {}))
    replica = Instance(workspace, SECOND, "replica", extra_env=dict(env or {}))
    try:
        await forwarder.start(primary.pg_port)
        await primary.start(primary_port=forwarder.port)
        await primary.wait_ready()
        await replica.start(primary_port=forwarder.port)
        await replica.wait_ready()
        await primary.query("CREATE TABLE ledger (id int PRIMARY KEY, note text)", role="app", dbname="orders")
        yield primary, replica
    finally:
        await _cleanup(replica, primary)


async def ids(instance: Instance) -> set[int]:
    try:
        rows = await instance.query("SELECT id FROM ledger", role="app", dbname="orders")
    except psycopg.errors.UndefinedTable:
        return set()
    return {row[0] for row in rows}


async def insert(instance: Instance, *values: int) -> None:
    for value in values:
        await instance.query(f"INSERT INTO ledger VALUES ({value}, 'row {value}')", role="app", dbname="orders")


def lsn(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) | int(low, 16)


async def streaming_from(replica: Instance, primary: Instance, timeline: int) -> dict[str, Any] | None:
    """``replica``'s status once it streams on ``timeline`` and ``primary`` lists it as a streaming standby."""
    status = await replica.status()
    if not (status["role"] == "replica" and status["streaming"] and status["timeline"] == timeline):
        return None
    standbys = (await primary.status()).get("replicas") or []
    return status if any(r["name"] == replica.name and r["state"] == "streaming" for r in standbys) else None


async def test_a_paused_replica_stops_receiving_stays_paused_across_a_restart_and_resume_catches_up(
    workspace: Workspace, forwarder: Forwarder
) -> None:
    async with pair(workspace, forwarder) as (primary, replica):
        await insert(primary, 1)
        await eventually(lambda: _has(replica, {1}), timeout=30)

        assert (await replica.post("/replication/pause", None))[0] == 401
        code, paused = await replica.post_json("/replication/pause", workspace.token, {})
        assert code == 200, paused
        assert (paused["paused"], paused["timeline"]) == (True, 1)
        assert lsn(paused["receiveLsn"]) >= lsn(paused["replayLsn"]) > 0
        assert "primary_conninfo" not in (replica.pgdata / "postgresql.conf").read_text()
        assert (replica.pgdata.parent / "kanri-replication-paused").is_file()
        assert await replica.query("SELECT count(*) FROM pg_stat_wal_receiver") == [(0,)]
        code, refused = await primary.post_json("/replication/pause", workspace.token, {})
        assert code == 409, refused
        assert "primary" in refused["error"]

        # not ready while paused (kept out of -ro), with the reason; /status says so
        code, ready = await replica.get("/readyz")
        assert (code, ready) == (503, {"ready": False, "reason": "replication paused"})
        assert (await replica.status())["replicationPaused"] is True
        assert (await primary.status())["replicationPaused"] is False

        # the primary moves on; the paused replica receives nothing, also after its manager restarts
        await insert(primary, 2)
        await primary.query("SELECT pg_switch_wal()")
        written = (await primary.status())["writeLsn"]
        assert lsn(written) > lsn(paused["receiveLsn"])
        assert await replica.stop() == 0
        await replica.start(primary_port=forwarder.port)
        await eventually(lambda: _accepts(replica), timeout=60)
        code, again = await replica.post_json("/replication/pause", workspace.token, {})  # idempotent
        assert code == 200, again
        assert (again["paused"], again["timeline"]) == (True, 1)
        assert lsn(again["receiveLsn"]) <= lsn(paused["receiveLsn"])
        status = await replica.status()
        assert (status["replicationPaused"], status["streaming"]) == (True, False)
        assert "primary_conninfo" not in (replica.pgdata / "postgresql.conf").read_text()
        assert await ids(replica) == {1}
        await eventually(lambda: _no_standby(primary, SECOND), timeout=30)  # its WAL sender has gone for good

        # resume: the receiver starts again and catches up
        code, resumed = await replica.post_json("/replication/resume", workspace.token, {})
        assert (code, resumed) == (200, {"paused": False, "resumed": True})
        assert not (replica.pgdata.parent / "kanri-replication-paused").exists()
        await eventually(lambda: _has(replica, {1, 2}), timeout=30)
        await replica.wait_ready()
        assert (await replica.status())["replicationPaused"] is False
        assert await primary.post_json("/replication/resume", workspace.token, {}) == (
            200, {"paused": False, "resumed": False})  # fmt: skip

        # a promotion of a paused replica works and ends the pause
        await replica.post_json("/replication/pause", workspace.token, {})
        code, promoted = await replica.post("/promote", workspace.token)
        assert code == 200, promoted
        status = await replica.status()
        assert (status["role"], status["replicationPaused"]) == ("primary", False)
        assert not (replica.pgdata.parent / "kanri-replication-paused").exists()
        await replica.wait_ready()


async def test_a_switchover_demotes_the_primary_cleanly_and_it_follows_the_promoted_replica_without_rewind(
    workspace: Workspace, forwarder: Forwarder
) -> None:
    async with pair(workspace, forwarder) as (primary, replica):
        await insert(primary, *range(1, 51))
        code, refused = await replica.post_json("/demote", workspace.token, {})
        assert code == 409, refused

        code, demoted = await primary.post_json("/demote", workspace.token, {})
        assert code == 200, demoted
        assert (demoted["demoted"], demoted["timeline"]) == (True, 1)
        assert (primary.pgdata / "standby.signal").exists()
        assert (await primary.status())["role"] == "replica"

        # the operator's gate: the target has received past the shutdown checkpoint
        async def received_past_checkpoint() -> bool:
            return lsn((await replica.status())["receiveLsn"]) > lsn(demoted["checkpointLsn"])

        await eventually(received_past_checkpoint, timeout=30)
        code, promoted = await replica.post("/promote", workspace.token)
        assert code == 200, promoted
        assert promoted["timeline"] == 2
        forwarder.point(replica.pg_port)  # -rw follows the role label

        await eventually(lambda: streaming_from(primary, replica, timeline=2), timeout=60)
        await insert(replica, 51)
        await eventually(lambda: _has(primary, set(range(1, 52))), timeout=30)
        assert await ids(replica) == set(range(1, 52))
        status = await primary.status()
        assert (status["role"], status["inRecovery"], status["fenced"]) == ("replica", True, False)
        await primary.wait_ready()
        assert "pg_rewind" not in primary.output()
        # the demoted primary's slots would only hold WAL back on a standby: dropped
        await eventually(lambda: _no_slots(primary), timeout=30)
        # a demoted instance refuses a second demote
        code, refused = await primary.post_json("/demote", workspace.token, {})
        assert code == 409, refused


async def test_a_former_primary_that_diverged_rejoins_with_pg_rewind(
    workspace: Workspace, forwarder: Forwarder
) -> None:
    async with pair(workspace, forwarder) as (primary, replica):
        await insert(primary, 1, 2)
        await eventually(lambda: _has(replica, {1, 2}), timeout=30)
        written = await diverge(workspace, forwarder, primary, replica)
        [[history]] = await replica.query("SELECT pg_read_file('pg_wal/00000002.history')")
        switchpoint = lsn(str(history).split()[1])

        code, refused = await replica.post_json("/rejoin", workspace.token, {})  # the running primary
        assert code == 409, refused
        code, started = await primary.post_json("/rejoin", workspace.token, {})
        assert (code, started) == (202, {"rejoin": "started"})
        assert await primary.post_json("/rejoin", workspace.token, {}) == (202, {"rejoin": "running"})
        rejoin = await eventually(lambda: _rejoin_finished(primary), timeout=120)
        assert (rejoin["state"], rejoin["method"]) == ("done", "rewind"), rejoin
        assert rejoin["message"].startswith(f"pg_rewind from 127.0.0.1:{forwarder.port} (to timeline 2) in ")
        # measured before the rewind discarded it: everything the old primary wrote past the switchpoint, its lost
        # rows included (the fence's shutdown checkpoint comes after them)
        divergence = rejoin["divergence"]
        assert (divergence["timeline"], lsn(divergence["switchpoint"])) == (1, switchpoint), divergence
        assert divergence["bytes"] == lsn(divergence["end"]) - switchpoint
        assert divergence["bytes"] >= written - switchpoint > 0, (divergence, written, switchpoint)

        await eventually(lambda: streaming_from(primary, replica, timeline=2), timeout=60)
        await insert(replica, 200)
        await eventually(lambda: _has(primary, {1, 2, 100, 200}), timeout=30)
        assert await ids(primary) == {1, 2, 100, 200}  # the divergent rows 900, 901 are gone
        status = await primary.status()
        assert (status["fenced"], status["role"], status["replicationPaused"]) == (False, "replica", False)
        assert not (primary.root / "run" / "kanri-rewind.pgpass").exists()
        assert not any(workspace.passwords["superuser"] in argv for argv in all_argv().values())
        for instance in (primary, replica):
            assert not any(password in instance.output() for password in workspace.passwords.values())
        await primary.wait_ready()


async def test_a_former_primary_that_cannot_be_rewound_rejoins_with_a_clone(
    workspace: Workspace, forwarder: Forwarder
) -> None:
    async with pair(workspace, forwarder) as (primary, replica):
        await insert(primary, 1, 2)
        await eventually(lambda: _has(replica, {1, 2}), timeout=30)
        await diverge(workspace, forwarder, primary, replica)
        # the WAL pg_rewind must read to find the changed blocks is gone
        for segment in (primary.pgdata / "pg_wal").iterdir():
            if segment.is_file() and len(segment.name) == 24:
                segment.unlink()

        code, started = await primary.post_json("/rejoin", workspace.token, {})
        assert (code, started) == (202, {"rejoin": "started"})
        rejoin = await eventually(lambda: _rejoin_finished(primary), timeout=180)
        assert (rejoin["state"], rejoin["method"]) == ("done", "clone"), rejoin
        assert rejoin["message"].startswith(f"pg_rewind from 127.0.0.1:{forwarder.port} failed: "), rejoin
        assert "cloned instead in" in rejoin["message"]

        await eventually(lambda: streaming_from(primary, replica, timeline=2), timeout=60)
        await insert(replica, 200)
        await eventually(lambda: _has(primary, {1, 2, 100, 200}), timeout=30)
        assert await ids(primary) == {1, 2, 100, 200}
        assert not primary.pgdata.with_name("pgdata.kanri-old").exists()
        await primary.wait_ready()


async def diverge(workspace: Workspace, forwarder: Forwarder, primary: Instance, replica: Instance) -> int:
    """A failover the old primary did not notice: the replica is promoted while the old primary keeps taking writes
    (rows 900, 901, lost by design), the new primary takes its own (100); then the operator fences the old one.
    Returns the old primary's WAL insert position after its lost rows."""
    code, promoted = await replica.post("/promote", workspace.token)
    assert code == 200, promoted
    forwarder.point(replica.pg_port)
    await insert(primary, 900, 901)
    [[written]] = await primary.query("SELECT pg_current_wal_insert_lsn()::text")
    await insert(replica, 100)
    code, fenced = await primary.post_json("/fence", workspace.token, {"reason": "failover: orders-2 promoted"})
    assert code == 200, fenced
    assert not postmasters(primary.pgdata)
    return lsn(str(written))


async def test_a_fence_is_not_held_by_a_standby_that_no_longer_answers(
    workspace: Workspace, forwarder: Forwarder
) -> None:
    """A fast shutdown waits until every standby confirmed the shutdown checkpoint: a standby that no longer answers
    (frozen here; across a partition or on a stopped node in a cluster) held a fenced primary's stop, and so its
    rejoin, for wal_sender_timeout (60 s). The fence stops it while the standby is still frozen (an immediate
    shutdown after FENCED_STOP_TIMEOUT), and nothing committed is lost."""
    async with pair(workspace, forwarder) as (primary, replica):
        await insert(primary, 1, 2)
        await eventually(lambda: _has(replica, {1, 2}), timeout=30)
        with frozen(replica):
            await insert(primary, 3)  # WAL the frozen standby never confirms
            fence = primary.post_json("/fence", workspace.token, {"reason": "failover: orders-2 promoted"})
            try:  # well below wal_sender_timeout (60 s): a fence waiting for the standby ends only after it
                code, fenced = await asyncio.wait_for(fence, timeout=45)
            except TimeoutError:
                raise AssertionError(f"the fence waited for the frozen standby:\n{primary.output()[-3000:]}") from None
            assert (code, fenced["stopped"]) == (200, True), fenced
            assert not postmasters(primary.pgdata)  # stopped while the standby is still frozen
        assert "immediate shutdown" in primary.output()
        assert (await primary.post("/unfence", workspace.token))[0] == 200
        await primary.wait_ready()
        assert await ids(primary) == {1, 2, 3}  # crash recovery replayed the commit the standby never confirmed


async def test_an_isolated_or_frozen_primary_fences_itself_and_one_in_contact_does_not(
    workspace: Workspace, forwarder: Forwarder
) -> None:
    window = 3.0  # shorter than the default 4 s, long enough that a busy machine does not fence by accident
    apiserver = StandIn()
    await apiserver.open()
    env = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(apiserver.port),
        "KANRI_ISOLATION_CHECK": "on",
        "KANRI_ISOLATION_WINDOW": str(window),
    }
    try:
        async with pair(workspace, forwarder, env) as (primary, replica):
            # in contact with the API server: it stays up well past the window
            await stays_in_contact(primary, "apiserver", 3 * window)
            assert (await replica.status())["isolation"] == {"lastContact": None, "via": None}  # not a primary

            # the API server is gone, a standby still replies: still in contact
            await apiserver.close()
            await stays_in_contact(primary, "standby", 3 * window)

            # neither: the primary fences itself within the window
            assert await replica.stop() == 0
            fence = await eventually(lambda: _fenced(primary), timeout=30)
            assert fence.startswith("isolated: neither the API server nor a standby answered for "), fence
            await eventually(lambda: _stopped(primary), timeout=60)  # the marker first, then the fast shutdown

            # back in contact, unfenced; then frozen (SIGSTOP) longer than the window: fenced at once when thawed
            await apiserver.open()
            assert (await primary.post("/unfence", workspace.token))[0] == 200
            await primary.wait_ready()
            await stays_in_contact(primary, "apiserver", window)
            await freeze(primary, seconds=window + 1.5)
            fence = await eventually(lambda: _fenced(primary), timeout=30)
            assert fence.startswith("isolated: the manager did not run for "), fence
            assert "frozen" in fence
            await eventually(lambda: _stopped(primary), timeout=60)
    finally:
        await apiserver.close()


class StandIn:
    """A listening TCP port in place of the API server (the check only connects)."""

    def __init__(self) -> None:
        self.port = free_port()
        self._server: asyncio.Server | None = None

    async def open(self) -> None:
        async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.close()

        self._server = await asyncio.start_server(accept, "127.0.0.1", self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None


async def stays_in_contact(instance: Instance, via: str, span: float) -> None:
    """Poll until ``instance`` reports contact ``via`` for ``span`` seconds of its own clock (lastContact), and it
    never fenced itself meanwhile."""
    first: datetime | None = None

    async def long_enough() -> bool:
        nonlocal first
        status = await instance.status()
        assert not status["fenced"], status.get("fenceReason")
        contact = status["isolation"]
        if contact is None or contact["via"] != via or contact["lastContact"] is None:
            return False
        seen = datetime.fromisoformat(contact["lastContact"])
        first = first or seen
        return (seen - first).total_seconds() >= span

    await eventually(long_enough, timeout=span + 60)


def process_tree(root: int) -> list[int]:
    """``root`` and its descendants (from /proc's parent pids)."""
    parents: dict[int, int] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                parents[int(proc.name)] = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    tree, frontier = [root], [root]
    while frontier:
        frontier = [pid for pid, parent in parents.items() if parent in frontier]
        tree += frontier
    return tree


@contextlib.contextmanager
def frozen(instance: Instance) -> Iterator[None]:
    """The manager and every PostgreSQL process SIGSTOPped for the block, SIGCONTed after it."""
    assert instance.process is not None
    pids = process_tree(instance.process.pid)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):  # a short-lived child (a backend, a check) may be gone already
            os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in reversed(pids):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def freeze(instance: Instance, seconds: float) -> None:
    """SIGSTOP the manager and every PostgreSQL process, hold for ``seconds`` (the fault's length), SIGCONT."""
    with frozen(instance):
        await asyncio.sleep(seconds)  # the duration of the freeze itself, not a wait for a condition


async def _has(instance: Instance, expected: set[int]) -> bool:
    try:
        return expected <= await ids(instance)
    except psycopg.OperationalError:
        return False


async def _accepts(instance: Instance) -> bool:
    if not await instance.alive():  # the manager's HTTP server is not up yet
        return False
    status = await instance.status()
    return bool(status["running"] and status["inRecovery"] is not None)


async def _no_standby(primary: Instance, name: str) -> bool:
    return not [r for r in (await primary.status())["replicas"] if r["name"] == name]


async def _stopped(instance: Instance) -> bool:
    return not postmasters(instance.pgdata) and not (await instance.status())["running"]


async def _no_slots(instance: Instance) -> bool:
    return not await instance.query("SELECT slot_name FROM pg_replication_slots")


async def _rejoin_finished(instance: Instance) -> dict[str, Any] | None:
    rejoin = (await instance.status())["rejoin"]
    return rejoin if rejoin is not None and rejoin["state"] != "running" else None


async def _fenced(instance: Instance) -> str | None:
    status = await instance.status()
    return str(status["fenceReason"]) if status["fenced"] else None
