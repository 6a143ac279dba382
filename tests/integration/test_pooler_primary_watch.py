"""The pooler agent follows the primary (kanri.postgres.pooler.agent.primary_watch) with a real PgBouncer (the
operator's configuration, tests/pgbouncer_support.py), a real primary and a real hot standby
(tests/integration/test_instance_manager.py's fixtures) and a TCP forwarder standing in for the ``-rw`` Service
(tests/forwarder.py): its route changes for new connections only, as a proxy's rules do, while connections made
before keep their server.

What goes wrong without the agent, seen first: while the route points at the standby (a demoted primary the
Service has not dropped yet) PgBouncer makes its server connection there; once the route points at the primary,
writes through PgBouncer still fail with ``read-only transaction``, because PgBouncer keeps and reuses that server
connection. With the agent looking through the same route, writes go through again once the route has moved (it
sent ``RECONNECT``). The e2e that found it: tests/e2e/test_postgres_pooler_e2e.py's switchover under load.

Then a client left in a transaction on the old primary when it froze (its manager and postgres processes stopped)
or was cut off (the forwarder drops its traffic): RECONNECT alone leaves it waiting, since it never releases its
server connection; the agent's second step (agent.stranded) ends it once the new primary answers, and the client's
next transaction goes to the new primary."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import psycopg
import pytest
import pytest_asyncio

from kanri.contract.pooler import POOLER_ROLE
from kanri.contract.scram import verifier
from kanri.postgres.pooler.agent import primary_watch, stranded
from kanri.postgres.pooler.agent.metrics import console_session
from tests.forwarder import Forwarder
from tests.integration.test_instance_exporter import server_processes
from tests.integration.test_instance_manager import Instance, Workspace, primary, replica, workspace
from tests.pgbouncer_support import PASSWORD, PGBOUNCER, Bouncer, running
from tests.support import eventually

__all__ = ["primary", "replica", "workspace"]  # the fixtures, imported to be used here

pytestmark = [
    pytest.mark.skipif(not PGBOUNCER.exists(), reason=f"no {PGBOUNCER} (make system installs Debian's pgbouncer)"),
    pytest.mark.timeout(240),
    pytest.mark.asyncio(loop_scope="session"),
]


HUNG_BOUND = 20.0
"""Seconds from the route's move to the new primary to the hung client's error. Expected: under 8 s (the agent's
connect through the route may be waiting on the old server, 4 s; a look a second; the stranded connection must be
seen at two looks); the rest is margin for a loaded 2-core machine."""


async def application(bouncer: Bouncer, workspace: Workspace, *, autocommit: bool) -> psycopg.AsyncConnection[Any]:
    """A client of PgBouncer as the application's owner."""
    return await psycopg.AsyncConnection.connect(
        host="127.0.0.1", port=bouncer.port, dbname="orders", user="orders_owner",
        password=workspace.passwords["app"], sslmode="verify-full", sslrootcert=str(bouncer.ca_file),
        connect_timeout=10, autocommit=autocommit, prepare_threshold=None,
    )  # fmt: skip


async def write_through(bouncer: Bouncer, workspace: Workspace, n: int) -> str | None:
    """One insert through PgBouncer as the application's owner; None when acknowledged, else the error."""
    try:
        async with await application(bouncer, workspace, autocommit=True) as conn:
            await conn.execute("INSERT INTO followed (n) VALUES (%s)", (n,))
        return None
    except psycopg.Error as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest_asyncio.fixture(loop_scope="session")
async def route(primary: Instance, replica: Instance, workspace: Workspace) -> AsyncIterator[Forwarder]:
    code, body = await primary.post_json("/pooler/role", workspace.token,
                                         {"verifier": verifier(PASSWORD), "databases": ["orders"]})  # fmt: skip
    assert code == 200, body
    await primary.query("CREATE TABLE IF NOT EXISTS followed (n int)", role="app", dbname="orders")

    async def replicated() -> bool:  # the role, its lookup and the table on the standby before it serves them
        found = await replica.query("SELECT to_regclass('followed') IS NOT NULL AND EXISTS (SELECT 1 FROM pg_roles "
                                    f"WHERE rolname = '{POOLER_ROLE}')", dbname="orders")  # fmt: skip
        return bool(found and found[0][0])

    await eventually(replicated, timeout=30)
    forwarder = Forwarder()
    await forwarder.start(replica.pg_port)
    try:
        yield forwarder
    finally:
        await forwarder.close()


async def test_pgbouncer_keeps_a_standby_connection_until_the_agent_following_the_primary_renews_it(
    route: Forwarder,
    primary: Instance,
    replica: Instance,
    workspace: Workspace,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with running(tmp_path_factory.mktemp("pgbouncer"), {}, route.port) as bouncer:
        # the route still points at the demoted primary, now a standby: PgBouncer's server connection lands there
        # (PgBouncer may still be starting: connection refused until it listens)
        refused: list[str | None] = []

        async def read_only() -> bool:
            refused.append(await write_through(bouncer, workspace, 0))
            return refused[-1] is not None and "read-only" in refused[-1]

        try:
            await eventually(read_only, timeout=30)
        except TimeoutError:
            raise AssertionError(f"wanted a read-only error, last {refused[-1:]}; log:\n{bouncer.log()}") from None
        # the route moves to the primary; without the agent PgBouncer goes on with the standby's connection
        route.point(primary.pg_port, cut=False)
        stale = [await write_through(bouncer, workspace, n) for n in range(1, 4)]
        assert all(e is not None and "read-only" in e for e in stale), f"{stale}; PgBouncer's log:\n{bouncer.log()}"

        # the agent running from before the switchover on: it looks through the route while it is the standby's...
        route.point(replica.pg_port, cut=False)
        decision = primary_watch.PrimaryWatch()
        renewed_before = renewals()
        stop = asyncio.Event()
        connect = primary_watch.checker(f"host=127.0.0.1 port={route.port} dbname=orders", bouncer.auth_file,
                                        bouncer.ca_file, sslmode="disable")  # fmt: skip
        renew = primary_watch.renewer(bouncer.port, bouncer.auth_file, bouncer.ca_file)
        agent = asyncio.create_task(primary_watch.watch(connect, renew, interval=0.3, stop=stop, decision=decision))
        try:

            async def saw_the_standby() -> bool:
                return decision.disturbed

            await eventually(saw_the_standby, timeout=30)
            assert renewals() == renewed_before
            # ...then the route moves to the primary: the agent sees it and PgBouncer renews its server connection
            route.point(primary.pg_port, cut=False)
            last: list[str | None] = ["not tried"]

            async def writes_again() -> bool:
                last[0] = await write_through(bouncer, workspace, 100)
                return last[0] is None

            try:
                await eventually(writes_again, timeout=30, interval=0.3)
            except TimeoutError:
                raise AssertionError(f"writes through PgBouncer still fail: {last[0]}; agent saw primary "
                                     f"{decision.primary}; PgBouncer's log:\n{bouncer.log()}") from None  # fmt: skip
            assert renewals() == renewed_before + 1
            assert decision.primary == f"127.0.0.1:{primary.pg_port}", "the agent's last look reached the primary"
        finally:
            stop.set()
            await asyncio.wait_for(agent, 10)
        rows = await primary.query("SELECT n FROM followed ORDER BY n", role="app", dbname="orders")
        assert [r[0] for r in rows] == [100], "only the write acknowledged after the renewal is stored"


def renewals() -> float:
    (family,) = primary_watch.RENEWALS.collect()
    (sample,) = family.samples
    return float(sample.value)


def instance_processes(instance: Instance) -> list[int]:
    """The instance manager, its postmaster and the postmaster's children (backends, walsender...)."""
    assert instance.process is not None
    return [instance.process.pid, *server_processes(instance)]


@contextmanager
def frozen(instance: Instance) -> Iterator[list[int]]:
    """The instance's processes stopped (SIGSTOP: the kernel still answers for their sockets), resumed on exit."""
    stopped: list[int] = []
    try:
        for pid in instance_processes(instance):  # the manager and the postmaster first: no new child after
            os.kill(pid, signal.SIGSTOP)
            stopped.append(pid)
        yield stopped
    finally:
        for pid in stopped:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def hung_error(client: asyncio.Task[None], since: float) -> tuple[float, str]:
    """Seconds from ``since`` until the hung client's statement failed, and its error (the test's bound plus some
    more: past it, the client is cancelled and the failure says it was still waiting)."""
    done, _ = await asyncio.wait({client}, timeout=HUNG_BOUND + 10)
    if not done:
        client.cancel()
        raise AssertionError(f"the client on the old primary still waits {time.monotonic() - since:.1f} s after the "
                             "route moved")  # fmt: skip
    error = client.exception()
    assert isinstance(error, psycopg.Error), f"the hung statement ended with {error!r}, wanted an error"
    return time.monotonic() - since, f"{type(error).__name__}: {error}"


async def in_transaction(conn: psycopg.AsyncConnection[Any], n: int, started: asyncio.Event) -> None:
    """One insert acknowledged in a transaction, then (once ``started`` is set by the test) a second one."""
    await conn.execute("INSERT INTO followed (n) VALUES (%s)", (n,))
    await started.wait()
    await conn.execute("INSERT INTO followed (n) VALUES (%s)", (n + 1,))
    await conn.commit()


async def test_a_client_left_on_a_frozen_or_cut_off_old_primary_gets_an_error_and_the_next_goes_to_the_new_one(
    route: Forwarder,
    primary: Instance,
    replica: Instance,
    workspace: Workspace,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    route.point(primary.pg_port, cut=False)
    with running(tmp_path_factory.mktemp("pgbouncer"), {}, route.port) as bouncer:
        decision = primary_watch.PrimaryWatch()
        stop = asyncio.Event()
        connect = primary_watch.checker(f"host=127.0.0.1 port={route.port} dbname=orders", bouncer.auth_file,
                                        bouncer.ca_file, sslmode="disable")  # fmt: skip
        renew = primary_watch.renewer(bouncer.port, bouncer.auth_file, bouncer.ca_file)
        free = stranded.freer(bouncer.port, bouncer.auth_file, bouncer.ca_file, stranded.StrandedServers())
        agent = asyncio.create_task(primary_watch.watch(connect, renew, stop=stop, decision=decision, free=free))
        ended_before = primary_watch.ENDED.count
        measured: dict[str, float] = {}
        try:

            async def following(instance: Instance) -> bool:
                return decision.primary == f"127.0.0.1:{instance.pg_port}"

            await eventually(lambda: following(primary), timeout=30)
            # PgBouncer 1.18 runs with the operator's TCP settings
            with console_session(bouncer.port, bouncer.auth_file, bouncer.ca_file) as console:
                taken = {str(r[0]): str(r[1]) for r in console.execute("SHOW CONFIG").fetchall()}
            assert {k: taken[k] for k in ("tcp_keepalive", "tcp_keepidle", "tcp_keepintvl", "tcp_user_timeout")} == {
                "tcp_keepalive": "1",
                "tcp_keepidle": "5",
                "tcp_keepintvl": "2",
                "tcp_user_timeout": "10000",
            }
            assert await write_through(bouncer, workspace, 200) is None, bouncer.log()

            async def replicated() -> bool:  # the new primary will have it
                rows = await replica.query("SELECT count(*) FROM followed WHERE n = 200", dbname="orders")
                return bool(rows and rows[0][0] == 1)

            await eventually(replicated, timeout=30)

            # 1. the primary freezes with a client in a transaction on it; the replica is promoted, the route moves
            client = await application(bouncer, workspace, autocommit=False)
            started = asyncio.Event()
            hung = asyncio.create_task(in_transaction(client, 210, started))
            await eventually(lambda: _true(client.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS),
                             timeout=10)  # fmt: skip
            with frozen(primary):
                started.set()
                code, body = await replica.post("/promote", workspace.token)
                assert code == 200, body
                route.point(replica.pg_port, cut=False)
                moved = time.monotonic()
                measured["frozen"], error = await hung_error(hung, moved)
                assert measured["frozen"] < HUNG_BOUND, (measured, error, bouncer.log())
                await client.close()
                assert await write_through(bouncer, workspace, 220) is None, bouncer.log()
            on_new = await replica.query("SELECT n FROM followed WHERE n >= 200 ORDER BY n", role="app",
                                         dbname="orders")  # fmt: skip
            assert [r[0] for r in on_new] == [200, 220], "the frozen transaction never committed; the next did"
            assert primary_watch.ENDED.count == ended_before + 1

            # 2. the new primary is cut off with a client in a transaction on it; the route moves back to the other
            await eventually(lambda: following(replica), timeout=30)
            client = await application(bouncer, workspace, autocommit=False)
            started = asyncio.Event()
            hung = asyncio.create_task(in_transaction(client, 230, started))
            await eventually(lambda: _true(client.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS),
                             timeout=10)  # fmt: skip
            route.hold(replica.pg_port)
            started.set()
            route.point(primary.pg_port, cut=False)
            moved = time.monotonic()
            measured["cut off"], error = await hung_error(hung, moved)
            assert measured["cut off"] < HUNG_BOUND, (measured, error, bouncer.log())
            await client.close()
            assert await write_through(bouncer, workspace, 240) is None, bouncer.log()
            assert await following(primary)
            on_other = await primary.query("SELECT n FROM followed WHERE n >= 200 ORDER BY n", role="app",
                                           dbname="orders")  # fmt: skip
            assert [r[0] for r in on_other] == [200, 240]
            assert primary_watch.ENDED.count == ended_before + 2
            print(f"hung client's error after the route moved: {measured}")
        finally:
            route.release(replica.pg_port)
            stop.set()
            await asyncio.wait_for(agent, 15)


async def _true(value: bool) -> bool:
    return value
