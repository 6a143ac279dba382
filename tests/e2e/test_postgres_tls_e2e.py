"""TLS by default (issue 16 item 1), end to end: a two-instance cluster's PostgreSQL speaks TLS only over TCP.

* ``psql sslmode=verify-full`` through ``<cluster>-rw.<ns>.svc`` with the CA published in ``<cluster>-ca`` works (the
  test connects to the Service's ClusterIP with ``hostaddr`` so libpq checks the certificate against that name), and
  a wrong name is refused — so verify-full really checks the name;
* a plaintext TCP connection (``sslmode=disable``) is refused by pg_hba;
* the replica's WAL sender connection is TLS (``pg_stat_ssl`` on the primary);
* a certificate due for renewal (the test writes one with a third of its lifetime left into the managed Secret) is
  reissued by the operator and served by PostgreSQL after a reload — the postmaster is not restarted and a query
  loop over new verify-full connections sees no failure meanwhile.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import os
import re
import sys
from pathlib import Path
from typing import Any

import psycopg
from cryptography import x509

from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.tls import certificates as tls
from kanri.runtime import Client
from kanri.runtime.kinds import SECRET
from tests.e2e.postgres_helpers import cluster, cluster_ip, ready_with_row
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
NAME = "tls"


def _data(secret: Obj, key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


async def _password(client: Client, namespace: str, secret: str) -> tuple[str, str]:
    found = await client.get(SECRET, secret, namespace)
    return _data(found, "username").decode(), _data(found, "password").decode()


async def _connect(host: str, address: str, user: str, password: str, **options: Any) -> psycopg.AsyncConnection[Any]:
    return await psycopg.AsyncConnection.connect(host=host, hostaddr=address, port=5432, user=user, password=password,
                                                 dbname="app", connect_timeout=5, autocommit=True,
                                                 **options)  # fmt: skip


async def _served_serial(address: str) -> int | None:
    """The serial of the certificate PostgreSQL presents at ``address`` (openssl's STARTTLS for postgres)."""
    proc = await asyncio.create_subprocess_exec(
        "openssl", "s_client", "-starttls", "postgres", "-connect", f"{address}:5432",
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = await proc.communicate()
    match = re.search(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", out, re.S)
    return x509.load_pem_x509_certificate(match.group(0)).serial_number if match else None


async def test_tls_verify_full_plaintext_refused_replication_and_renewal(
    client: Client, node: LocalNode, operator: Operator, namespace: str, tmp_path: Path, control_plane: Endpoint
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 2))
    async with operator.running(refresh=2.0):
        await ready_with_row(client, namespace, NAME, 2)
        ca_file = tmp_path / "ca.crt"
        ca_file.write_bytes(_data(await client.get(SECRET, f"{NAME}-ca", namespace), "ca.crt"))
        address = await cluster_ip(client, namespace, f"{NAME}-rw")
        service = f"{NAME}-rw.{namespace}.svc"
        user, password = await _password(client, namespace, f"{NAME}-app")
        verify: dict[str, Any] = {"sslmode": "verify-full", "sslrootcert": str(ca_file)}

        # the command `kanri up` prints, with the real psql (the password in the environment, never in argv)
        conninfo = f"host={service} hostaddr={address} port=5432 dbname=app user={user} sslmode=verify-full " \
                   f"sslrootcert={ca_file}"  # fmt: skip
        proc = await asyncio.create_subprocess_exec(
            "psql", conninfo, "-Atc", "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
            env={**os.environ, "PGPASSWORD": password}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        assert out.decode().strip() == "t"
        await _kanri_psql(control_plane.kubeconfig, namespace)  # the same in one command (issue 29 item 7)

        wrong = await _refusal(lambda: _connect("elsewhere.example", address, user, password, **verify))
        assert "elsewhere.example" in wrong or "does not match" in wrong, wrong
        plain = await _refusal(lambda: _connect(service, address, user, password, sslmode="disable"))
        assert "pg_hba.conf rejects connection" in plain, plain
        assert "no encryption" in plain, plain

        superuser, super_password = await _password(client, namespace, f"{NAME}-superuser")

        async def senders_over_tls() -> list[bool] | None:
            async with await _connect(service, address, superuser, super_password, **verify) as conn:
                cursor = await conn.execute(
                    "SELECT s.ssl FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid)"
                    " WHERE r.application_name LIKE %s",
                    (f"{NAME}-%",),
                )
                found = [bool(row[0]) for row in await cursor.fetchall()]
                return found if found == [True] else None

        await eventually(senders_over_tls, timeout=30, interval=1)

        async with await _connect(service, address, superuser, super_password, **verify) as conn:
            started = (await (await conn.execute("SELECT pg_postmaster_start_time()")).fetchone() or [None])[0]
        await _renewal(client, namespace, address, lambda: _connect(service, address, user, password, **verify))
        async with await _connect(service, address, superuser, super_password, **verify) as conn:
            after = (await (await conn.execute("SELECT pg_postmaster_start_time()")).fetchone() or [None])[0]
        assert after == started, "the renewal restarted PostgreSQL"


async def _kanri_psql(kubeconfig: Path, namespace: str) -> None:
    """``kanri psql NAME -- ARGS`` (issue 29 item 7): the app user, then ``--superuser``, over TLS verified against the
    cluster's CA through the port-forward it manages; its exit code is psql's (1 when a command failed)."""
    kanri = str(Path(sys.executable).parent / "kanri")
    command = [kanri, "psql", NAME, "-n", namespace, "--kubeconfig", str(kubeconfig)]
    query = "SELECT current_user, ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
    for options, user, fail, code in (([], "app", [], 0), (["--superuser"], "postgres", ["-c", "SELECT 1/0"], 1)):
        proc = await asyncio.create_subprocess_exec(
            *command, *options, "--", "-Atc", query, *fail,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), 60)
        assert (proc.returncode, out.decode().strip()) == (code, f"{user}|t"), err.decode()
        assert ("division by zero" in err.decode()) == bool(fail), err.decode()


async def _refusal(connect: Any) -> str:
    try:
        conn = await connect()
    except psycopg.OperationalError as exc:
        return str(exc)
    await conn.close()
    raise AssertionError("the connection was accepted")


async def _renewal(client: Client, namespace: str, address: str, connect: Any) -> None:
    """Write a certificate due for renewal into the managed Secret; the operator reissues it and PostgreSQL serves
    the new one — while a query loop over new verify-full connections never fails."""
    key_secret = await client.get(SECRET, f"{NAME}-ca-key", namespace)
    ca = tls.Issued(_data(key_secret, "ca.crt"), _data(key_secret, "ca.key"))
    server = await client.get(SECRET, f"{NAME}-server", namespace)
    names = list(x509.load_pem_x509_certificate(_data(server, "tls.crt")).extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName))  # fmt: skip
    now = dt.datetime.now(dt.UTC)
    due = tls.build_server(ca, f"{NAME}-rw", names, now - dt.timedelta(days=300), dt.timedelta(days=365))
    due_serial = x509.load_pem_x509_certificate(due.cert).serial_number
    server["data"]["tls.crt"] = base64.b64encode(due.cert).decode()
    server["data"]["tls.key"] = base64.b64encode(due.key).decode()

    queries, failures = 0, []
    stop = asyncio.Event()

    async def load() -> None:
        nonlocal queries
        while not stop.is_set():
            try:
                async with await connect() as conn:
                    await conn.execute("SELECT 1")
                queries += 1
            except psycopg.Error as exc:
                failures.append(str(exc))
            await asyncio.sleep(0.05)

    loader = asyncio.create_task(load())
    try:
        await client.replace(SECRET, server)

        async def renewed() -> int | None:
            current = await client.get(SECRET, f"{NAME}-server", namespace)
            serial = x509.load_pem_x509_certificate(_data(current, "tls.crt")).serial_number
            if serial == due_serial:
                return None
            served = await _served_serial(address)
            return serial if served == serial else None

        await eventually(renewed, timeout=60, interval=0.5)
        status = (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}
        expires = dt.datetime.fromisoformat(status["tls"]["serverCertificateExpires"].replace("Z", "+00:00"))
        assert expires > now + dt.timedelta(days=300), status["tls"]  # the reissued one, not the due one
    finally:
        stop.set()
        await loader
    assert queries > 0
    assert failures == [], failures[:3]
