"""PoolerClientsWaiting (deploy/monitoring/pooler-alerts.yaml) from a real saturated pool: a real PgBouncer with
the operator's configuration (tests/pgbouncer_support.py; ``default_pool_size = 1``) in front of a real primary and
its instance manager (tests/integration/test_instance_manager.py's fixtures, which serve no TLS: PgBouncer reaches it
with ``server_tls_sslmode = disable``, the one setting changed), the lookup role made by the manager's
``POST /pooler/role``; application clients log in through the lookup (SCRAM pass-through) and one holds the only
server connection in ``pg_sleep`` while the others queue. A real Prometheus scrapes the agent's collector with the
shortened rules (test_pooler_alerts_prometheus.scraping): PoolerClientsWaiting fires once the oldest has waited
over 10 s, with the pool's ``database`` and ``user``; PoolerNoServerConnections does not (the pool has its server
connection)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest
import pytest_asyncio

from kanri.contract.scram import verifier
from tests.integration.test_instance_manager import Instance, Workspace, primary, workspace
from tests.integration.test_pooler_alerts_prometheus import scraping, serve, until_firing
from tests.pgbouncer_support import PASSWORD, PGBOUNCER, Bouncer, running

__all__ = ["primary", "workspace"]  # the fixtures, imported to be used here

pytestmark = [
    pytest.mark.skipif(not PGBOUNCER.exists(), reason=f"no {PGBOUNCER} (make system installs Debian's pgbouncer)"),
    pytest.mark.timeout(240),
    pytest.mark.asyncio(loop_scope="session"),
]
HOLD_SECONDS = 40


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def bouncer(
    workspace: Workspace, primary: Instance, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Bouncer]:
    code, body = await primary.post_json("/pooler/role", workspace.token,
                                         {"verifier": verifier(PASSWORD), "databases": ["orders"]})  # fmt: skip
    assert code == 200, body
    with running(tmp_path_factory.mktemp("pgbouncer"), {"default_pool_size": "1"}, primary.pg_port) as started:
        yield started


@pytest.fixture(scope="module")
def live(bouncer: Bouncer) -> Iterator[dict[str, str]]:
    with contextlib.ExitStack() as stack:
        yield {"orders-pool-live": serve(bouncer.collector(), stack)}


async def hold(bouncer: Bouncer, workspace: Workspace, seconds: int) -> None:
    """An application's transaction through the pooler, as the cluster's application owner, lasting ``seconds``."""
    async with await psycopg.AsyncConnection.connect(
        host="127.0.0.1", port=bouncer.port, dbname="orders", user="orders_owner", password=workspace.passwords["app"],
        sslmode="verify-full", sslrootcert=str(bouncer.ca_file), connect_timeout=30, autocommit=True,
        prepare_threshold=None,
    ) as conn:  # fmt: skip
        await conn.execute("SELECT pg_sleep(%s)", (seconds,))


async def test_a_saturated_pool_fires_clients_waiting(
    bouncer: Bouncer, workspace: Workspace, live: dict[str, str], tmp_path: Path
) -> None:
    async with scraping(live, tmp_path) as prometheus:
        first = asyncio.create_task(hold(bouncer, workspace, HOLD_SECONDS))
        queued = [asyncio.create_task(hold(bouncer, workspace, 1)) for _ in range(2)]
        try:
            found = await until_firing(prometheus, "PoolerClientsWaiting", bouncer)
            (alert,) = found["PoolerClientsWaiting"]
            assert alert == {"namespace": "shop", "pooler": "orders-pool", "pod": "orders-pool-live",
                             "database": "orders", "user": "orders_owner"}  # fmt: skip
            assert "PoolerNoServerConnections" not in found
            assert not first.done(), "the first client still holds the pool's one server connection"
        finally:
            for task in (first, *queued):
                task.cancel()
            await asyncio.gather(first, *queued, return_exceptions=True)
