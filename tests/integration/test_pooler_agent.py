"""The PgBouncer pods' agent (kanri.postgres.pooler.agent.metrics) against a real PgBouncer (Debian's 1.18, the
binary the local cluster's ``kanri.dev/pgbouncer`` image runs) with the operator's own pgbouncer.ini, auth file and
a certificate from a cluster CA — only the directories and the port moved to the test's: it logs in to the admin
console over verified TLS as the lookup role and exports the client connections PgBouncer holds against its
``max_client_conn``, the pair PoolerClientConnectionsNearLimit (deploy/monitoring/pooler-alerts.yaml) divides. At
the limit PgBouncer refuses ordinary clients but not admin console sessions (which it counts): the agent goes on
reporting, so the alert stays firing while clients are refused. No cluster: PgBouncer on a free 127.0.0.1 port,
files in the test's temporary directory."""

from __future__ import annotations

import asyncio
import datetime as dt
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from pathlib import Path

import psycopg
import pytest

from kanri.contract.pooler import POOLER_ROLE
from kanri.local.ports import free_port
from kanri.postgres.api.v1alpha1.postgres_pooler import PostgresPoolerSpec
from kanri.postgres.pooler import config
from kanri.postgres.pooler.agent.metrics import PoolerCollector, console_reader
from kanri.postgres.tls.certificates import build_ca, build_server
from tests.support import eventually

PGBOUNCER = Path("/usr/sbin/pgbouncer")
MAX_CLIENTS = 5
PASSWORD = 'pool"secret'

pytestmark = [
    pytest.mark.skipif(not PGBOUNCER.exists(), reason=f"no {PGBOUNCER} (make system installs Debian's pgbouncer)"),
    pytest.mark.timeout(120),
    pytest.mark.asyncio(loop_scope="session"),
]


class Bouncer:
    """A running PgBouncer: its port, auth file and CA, and the means to open console sessions on it."""

    def __init__(self, directory: Path, port: int, process: subprocess.Popen[bytes]) -> None:
        self.directory, self.port, self.process = directory, port, process
        self.auth_file, self.ca_file = directory / config.AUTH_FILE, directory / "ca.crt"

    def console(self) -> psycopg.Connection[tuple[object, ...]]:
        """A session on the admin console as the lookup role, as the agent opens one."""
        return psycopg.connect(host="127.0.0.1", port=self.port, dbname="pgbouncer", user=POOLER_ROLE,
                               password=PASSWORD, sslmode="verify-full", sslrootcert=str(self.ca_file),
                               connect_timeout=3, autocommit=True)  # fmt: skip

    def scrape(self) -> dict[str, float]:
        """One scrape of the agent's collector: the unlabelled samples by name."""
        families = PoolerCollector(console_reader(self.port, self.auth_file, self.ca_file)).collect()
        return {sample.name: sample.value for family in families for sample in family.samples if not sample.labels}


def _files(directory: Path, port: int) -> Path:
    """The operator's pgbouncer.ini (max_client_conn from spec.parameters), its auth file and certificates."""
    now = dt.datetime.now(dt.UTC)
    ca = build_ca("orders", "shop", now)
    server = build_server(ca, "orders-pool.shop pooler", ["orders-pool"], now)  # carries 127.0.0.1, as the operator's
    (directory / "ca.crt").write_bytes(ca.cert)
    (directory / "tls.crt").write_bytes(server.cert)
    (directory / "tls.key").write_bytes(server.key)
    (directory / config.AUTH_FILE).write_text(config.auth_file(PASSWORD))
    spec = PostgresPoolerSpec(cluster="orders", parameters={"max_client_conn": str(MAX_CLIENTS)})
    ini = config.render(spec, "shop")
    moved = {config.AUTH_DIR: str(directory), config.TLS_DIR: str(directory),
             f"listen_port = {config.PORT}": f"listen_port = {port}",
             "listen_addr = 0.0.0.0": "listen_addr = 127.0.0.1"}  # fmt: skip
    for old, new in moved.items():
        assert old in ini, old
        ini = ini.replace(old, new)
    (directory / "pgbouncer.ini").write_text(ini)
    os.chmod(directory, 0o755)  # PgBouncer refuses to run as root: as nobody (below) it must read them
    for path in directory.iterdir():
        os.chmod(path, 0o644)
    return directory / "pgbouncer.ini"


@pytest.fixture(scope="module")
def bouncer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bouncer]:
    directory = tmp_path_factory.mktemp("pgbouncer")
    port = free_port()
    ini = _files(directory, port)
    as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
    log = (directory / "pgbouncer.log").open("wb")
    process = subprocess.Popen([str(PGBOUNCER), *as_user, str(ini)], stdout=log, stderr=subprocess.STDOUT)
    try:
        yield Bouncer(directory, port, process)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


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
        log = (bouncer.directory / "pgbouncer.log").read_text()[-2000:]
        raise AssertionError(f"wanted {expected}, last scrape {last}; PgBouncer's log:\n{log}") from exc


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
            psycopg.connect(host="127.0.0.1", port=bouncer.port, dbname="app", user="app", password="x",
                            sslmode="verify-full", sslrootcert=str(bouncer.ca_file),
                            connect_timeout=3).close()  # fmt: skip
        # the console is not: the agent reads on, at or above the limit (its own session counted)
        reported = {"kanri_pgbouncer_up": 1, "kanri_pgbouncer_client_connections": MAX_CLIENTS + 1}
        found = await scraped(bouncer, reported)
        assert found["kanri_pgbouncer_client_connections"] / found["kanri_pgbouncer_max_client_connections"] > 0.9
