"""A real PgBouncer (Debian's 1.18, the binary the local cluster's ``kanri.dev/pgbouncer`` image runs) with the
operator's own pgbouncer.ini, auth file and a certificate from a cluster CA — only its directories, its port and its
PostgreSQL moved: it listens on a free 127.0.0.1 port and sends server connections to a 127.0.0.1 port nothing
listens on (no cluster: a pool gets no server connection). For the pooler agent's and alerts' integration tests."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from kanri.contract.pooler import POOLER_ROLE
from kanri.local.ports import free_port
from kanri.postgres.api.v1alpha1.postgres_pooler import PostgresPoolerSpec
from kanri.postgres.pooler import config
from kanri.postgres.pooler.agent.metrics import PoolerCollector, console_reader
from kanri.postgres.tls.certificates import build_ca, build_server

PGBOUNCER = Path("/usr/sbin/pgbouncer")
PASSWORD = 'pool"secret'


class Bouncer:
    """A running PgBouncer: its port, auth file and CA, and the means to open sessions on it and scrape it."""

    def __init__(self, directory: Path, port: int) -> None:
        self.directory, self.port = directory, port
        self.auth_file, self.ca_file = directory / config.AUTH_FILE, directory / "ca.crt"

    def collector(self) -> PoolerCollector:
        """The agent's collector, reading this PgBouncer's console as the pods' agent does."""
        return PoolerCollector(console_reader(self.port, self.auth_file, self.ca_file))

    def console(self) -> psycopg.Connection[tuple[object, ...]]:
        """A session on the admin console as the lookup role, as the agent opens one."""
        return psycopg.connect(host="127.0.0.1", port=self.port, dbname="pgbouncer", user=POOLER_ROLE,
                               password=PASSWORD, sslmode="verify-full", sslrootcert=str(self.ca_file),
                               connect_timeout=3, autocommit=True)  # fmt: skip

    async def client(self, database: str = "app", user: str = "app") -> psycopg.AsyncConnection[tuple[object, ...]]:
        """An application's client (it waits while PgBouncer has no server connection to log it in with)."""
        return await psycopg.AsyncConnection.connect(host="127.0.0.1", port=self.port, dbname=database, user=user,
                                                     password="x", sslmode="verify-full",
                                                     sslrootcert=str(self.ca_file), connect_timeout=60)  # fmt: skip

    def scrape(self) -> dict[str, float]:
        """One scrape of the agent's collector: the unlabelled samples by name."""
        return {sample.name: sample.value for family in self.collector().collect() for sample in family.samples
                if not sample.labels}  # fmt: skip

    def log(self) -> str:
        return (self.directory / "pgbouncer.log").read_text()[-3000:]


def write_files(directory: Path, port: int, parameters: dict[str, str], server_port: int | None = None) -> Path:
    """The operator's pgbouncer.ini (with ``parameters`` as spec.parameters), its auth file and certificates. With
    ``server_port``, PostgreSQL is there on 127.0.0.1, reached without TLS (a test instance serves none); without it,
    a port nothing listens on."""
    now = dt.datetime.now(dt.UTC)
    ca = build_ca("orders", "shop", now)
    server = build_server(ca, "orders-pool.shop pooler", ["orders-pool"], now)  # carries 127.0.0.1, as the operator's
    (directory / "ca.crt").write_bytes(ca.cert)
    (directory / "tls.crt").write_bytes(server.cert)
    (directory / "tls.key").write_bytes(server.key)
    (directory / config.AUTH_FILE).write_text(config.auth_file(PASSWORD))
    ini = config.render(PostgresPoolerSpec(cluster="orders", parameters=parameters), "shop")
    moved = {config.AUTH_DIR: str(directory), config.TLS_DIR: str(directory),
             f"listen_port = {config.PORT}": f"listen_port = {port}",
             "listen_addr = 0.0.0.0": "listen_addr = 127.0.0.1",
             "host=orders-rw.shop.svc port=5432": f"host=127.0.0.1 port={server_port or free_port()}"}  # fmt: skip
    if server_port is not None:
        moved["server_tls_sslmode = verify-full"] = "server_tls_sslmode = disable"
    for old, new in moved.items():
        assert old in ini, old
        ini = ini.replace(old, new)
    (directory / "pgbouncer.ini").write_text(ini)
    os.chmod(directory, 0o755)  # PgBouncer refuses to run as root: as nobody (below) it must read them
    for path in directory.iterdir():
        os.chmod(path, 0o644)
    return directory / "pgbouncer.ini"


@contextmanager
def running(directory: Path, parameters: dict[str, str], server_port: int | None = None) -> Iterator[Bouncer]:
    """PgBouncer started on the files of :func:`write_files`, stopped (and its directory removed) on exit."""
    port = free_port()
    ini = write_files(directory, port, parameters, server_port)
    as_user = ["-u", "nobody"] if os.geteuid() == 0 else []
    with (directory / "pgbouncer.log").open("wb") as log:
        process = subprocess.Popen([str(PGBOUNCER), *as_user, str(ini)], stdout=log, stderr=subprocess.STDOUT)
        try:
            yield Bouncer(directory, port)
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    shutil.rmtree(directory, ignore_errors=True)
