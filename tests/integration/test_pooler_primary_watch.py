"""The pooler agent follows the primary (kanri.postgres.pooler.agent.primary_watch) with a real PgBouncer (the
operator's configuration, tests/pgbouncer_support.py), a real primary and a real hot standby
(tests/integration/test_instance_manager.py's fixtures) and a TCP forwarder standing in for the ``-rw`` Service
(tests/forwarder.py): its route changes for new connections only, as a proxy's rules do, while connections made
before keep their server.

What goes wrong without the agent, seen first: while the route points at the standby (a demoted primary the
Service has not dropped yet) PgBouncer makes its server connection there; once the route points at the primary,
writes through PgBouncer still fail with ``read-only transaction``, because PgBouncer keeps and reuses that server
connection. With the agent looking through the same route, writes go through again once the route has moved (it
sent ``RECONNECT``). The e2e that found it: tests/e2e/test_postgres_pooler_e2e.py's switchover under load."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import psycopg
import pytest
import pytest_asyncio

from kanri.contract.pooler import POOLER_ROLE
from kanri.contract.scram import verifier
from kanri.postgres.pooler.agent import primary_watch
from tests.forwarder import Forwarder
from tests.integration.test_instance_manager import Instance, Workspace, primary, replica, workspace
from tests.pgbouncer_support import PASSWORD, PGBOUNCER, Bouncer, running
from tests.support import eventually

__all__ = ["primary", "replica", "workspace"]  # the fixtures, imported to be used here

pytestmark = [
    pytest.mark.skipif(not PGBOUNCER.exists(), reason=f"no {PGBOUNCER} (make system installs Debian's pgbouncer)"),
    pytest.mark.timeout(240),
    pytest.mark.asyncio(loop_scope="session"),
]


async def write_through(bouncer: Bouncer, workspace: Workspace, n: int) -> str | None:
    """One insert through PgBouncer as the application's owner; None when acknowledged, else the error."""
    try:
        async with await psycopg.AsyncConnection.connect(
            host="127.0.0.1", port=bouncer.port, dbname="orders", user="orders_owner",
            password=workspace.passwords["app"], sslmode="verify-full", sslrootcert=str(bouncer.ca_file),
            connect_timeout=10, autocommit=True, prepare_threshold=None,
        ) as conn:  # fmt: skip
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
