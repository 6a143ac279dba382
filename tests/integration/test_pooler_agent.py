"""The PgBouncer pods' agent (kanri.postgres.pooler.agent.metrics) against a real PgBouncer with the operator's own
configuration (tests/pgbouncer_support.py: no cluster, a free 127.0.0.1 port): it logs in to the admin console over
verified TLS as the lookup role and exports the client connections PgBouncer holds against its ``max_client_conn``,
the pair PoolerClientConnectionsNearLimit (deploy/monitoring/pooler-alerts.yaml) divides. At the limit PgBouncer
refuses ordinary clients but not admin console sessions (which it counts): the agent goes on reporting, so the alert
stays firing while clients are refused."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from contextlib import ExitStack

import psycopg
import pytest

from tests.pgbouncer_support import PGBOUNCER, Bouncer, running
from tests.support import eventually

MAX_CLIENTS = 5

pytestmark = [
    pytest.mark.skipif(not PGBOUNCER.exists(), reason=f"no {PGBOUNCER} (make system installs Debian's pgbouncer)"),
    pytest.mark.timeout(120),
    pytest.mark.asyncio(loop_scope="session"),
]


@pytest.fixture(scope="module")
def bouncer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bouncer]:
    with running(tmp_path_factory.mktemp("pgbouncer"), {"max_client_conn": str(MAX_CLIENTS)}) as started:
        yield started


async def scraped(bouncer: Bouncer, expected: Mapping[str, float]) -> dict[str, float]:
    """Scrapes until the named samples have the expected values (PgBouncer may still be starting); the last scrape
    and PgBouncer's log in the failure."""
    last: dict[str, float] = {}

    async def check() -> dict[str, float] | None:
        nonlocal last
        last = await asyncio.to_thread(bouncer.scrape)
        return last if {name: last.get(name) for name in expected} == expected else None

    try:
        return await eventually(check, timeout=20)
    except TimeoutError as exc:
        raise AssertionError(f"wanted {expected}, last scrape {last}; PgBouncer's log:\n{bouncer.log()}") from exc


async def test_the_agent_exports_the_client_connections_pgbouncer_holds_and_its_limit(bouncer: Bouncer) -> None:
    # the agent's own console session is one of them
    first = await scraped(bouncer, {"kanri_pgbouncer_up": 1, "kanri_pgbouncer_client_connections": 1})
    assert first["kanri_pgbouncer_max_client_connections"] == MAX_CLIENTS, "the spec's max_client_conn"
    with ExitStack() as held:
        for _ in range(2):
            held.enter_context(bouncer.console())
        await scraped(bouncer, {"kanri_pgbouncer_client_connections": 3, "kanri_pgbouncer_max_client_connections": 5})
    await scraped(bouncer, {"kanri_pgbouncer_client_connections": 1})


async def test_at_max_client_conn_clients_are_refused_and_the_agent_still_reports_the_count(bouncer: Bouncer) -> None:
    with ExitStack() as held:
        for _ in range(MAX_CLIENTS):
            held.enter_context(bouncer.console())
        # an application's client (any database but the console) is refused before it authenticates
        with pytest.raises(psycopg.OperationalError, match=r"no more connections allowed \(max_client_conn\)"):
            await (await bouncer.client()).close()
        # the console is not: the agent reads on, at or above the limit (its own session counted)
        reported = {"kanri_pgbouncer_up": 1, "kanri_pgbouncer_client_connections": MAX_CLIENTS + 1}
        found = await scraped(bouncer, reported)
        assert found["kanri_pgbouncer_client_connections"] / found["kanri_pgbouncer_max_client_connections"] > 0.9
