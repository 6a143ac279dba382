"""The cluster's CA renewed before it expires, without a failed query (issue 29 item 5): real PostgreSQL in
local-node pods (a primary and a streaming replica), the operator's real Manager told to make CAs that last 4 minutes
and to hold each phase of a rotation 20 s (``OperatorOptions.tls``).

A client connects anew every 100 ms through ``-rw`` with ``sslmode=verify-full``, trusting the published
``<cluster>-ca`` as it was 8 s earlier (a mounted Secret that a kubelet updates late). Through the whole rotation —
the new CA trusted beside the old one, the server certificate reissued by the new CA, the old CA dropped — no query
fails; PostgreSQL ends up serving a certificate of the new CA, the replica still streams over TLS, and the cluster
stays Ready.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import pytest_asyncio
from cryptography import x509

from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.tls.rotation import TlsSettings
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import EVENT, SECRET
from tests.e2e.postgres_helpers import cluster, cluster_ip, ready_with_row
from tests.e2e.test_postgres_tls_e2e import _served_serial
from tests.postgres_support import Operator
from tests.support import NotYet, eventually

Obj = dict[str, Any]
NAME = "rot"
LAG = 8.0
"""How late the client sees a change of the published CA (a kubelet's mounted Secret)."""
SETTINGS = TlsSettings(ca_lifetime=dt.timedelta(minutes=4), rotation_settle=dt.timedelta(seconds=20))

pytestmark = [pytest.mark.timeout(600)]


@pytest_asyncio.fixture(loop_scope="session")
async def rotating(control_plane: Endpoint, namespace: str) -> AsyncIterator[Operator]:
    instances = HttpInstanceClient()
    try:
        yield Operator(control_plane, namespace, instances=instances, tls=SETTINGS)
    finally:
        await instances.close()


def _data(secret: Obj, key: str) -> bytes:
    return base64.b64decode(secret["data"][key])


def _subjects(pem: bytes) -> list[x509.Certificate]:
    return x509.load_pem_x509_certificates(pem)


async def test_the_ca_is_rotated_before_it_expires_and_no_verify_full_query_fails(
    client: Client, node: LocalNode, rotating: Operator, namespace: str, tmp_path: Path
) -> None:
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 2))
    async with rotating.running(refresh=1.0):
        await ready_with_row(client, namespace, NAME, 2)
        first_ca = _data(await client.get(SECRET, f"{NAME}-ca", namespace), "ca.crt")
        assert len(_subjects(first_ca)) == 1
        address = await cluster_ip(client, namespace, f"{NAME}-rw")
        app = await client.get(SECRET, f"{NAME}-app", namespace)
        user, password = _data(app, "username").decode(), _data(app, "password").decode()
        history: list[tuple[float, bytes]] = [(time.monotonic(), first_ca)]  # the published CA, as it changed
        stop = asyncio.Event()
        queries, failures = 0, []

        async def follow() -> None:
            while not stop.is_set():
                current = _data(await client.get(SECRET, f"{NAME}-ca", namespace), "ca.crt")
                if current != history[-1][1]:
                    history.append((time.monotonic(), current))
                await asyncio.sleep(0.5)

        async def load() -> None:
            nonlocal queries
            ca_file = tmp_path / "ca.crt"
            while not stop.is_set():
                seen = [pem for at, pem in history if at <= time.monotonic() - LAG] or [history[0][1]]
                ca_file.write_bytes(seen[-1])
                try:
                    async with await psycopg.AsyncConnection.connect(
                        host=f"{NAME}-rw.{namespace}.svc", hostaddr=address, port=5432, user=user, password=password,
                        dbname="app", connect_timeout=5, autocommit=True, sslmode="verify-full",
                        sslrootcert=str(ca_file)) as conn:  # fmt: skip
                        await conn.execute("SELECT 1")
                    queries += 1
                except psycopg.Error as exc:
                    failures.append(f"{time.monotonic():.1f}: {exc}")
                await asyncio.sleep(0.1)

        tasks = [asyncio.create_task(follow()), asyncio.create_task(load())]

        async def rotated() -> tuple[bytes, int] | None:
            published = _data(await client.get(SECRET, f"{NAME}-ca", namespace), "ca.crt")
            if published == first_ca or len(_subjects(published)) != 1:
                return None
            server = _data(await client.get(SECRET, f"{NAME}-server", namespace), "tls.crt")
            cert = x509.load_pem_x509_certificate(server)
            try:
                cert.verify_directly_issued_by(_subjects(published)[0])
            except Exception:  # still the old CA's
                return None
            served = await _served_serial(address)
            return (published, cert.serial_number) if served == cert.serial_number else None

        try:
            published, serial = await eventually(rotated, timeout=300, interval=1)

            async def client_caught_up() -> bool:  # the lagging client, too, now trusts the new CA alone
                seen = [pem for at, pem in history if at <= time.monotonic() - LAG]
                return bool(seen) and seen[-1] == published and queries > 0

            await eventually(client_caught_up, timeout=LAG + 10, interval=0.5)
        except NotYet as exc:
            key = await client.get(SECRET, f"{NAME}-ca-key", namespace)
            raise AssertionError(f"no finished rotation: {exc}; rotation {key['metadata'].get('annotations')}; "
                                 f"{len(history)} published CAs seen") from None  # fmt: skip
        finally:
            stop.set()
            await asyncio.gather(*tasks)
        bundles = [len(_subjects(pem)) for _, pem in history]
        print(f"\n{queries} verify-full queries, {len(failures)} failed; published CA bundles seen (certificates "
              f"each): {bundles}; serving serial {serial}")  # fmt: skip
        assert 2 in bundles  # the overlap: old and new trusted together
        assert queries > 100
        assert failures == [], failures[:5]

        # the replica still streams (over TLS, verifying the primary with the bundle it was handed) and the cluster
        # stayed Ready; the rotation was told
        status = (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}
        ready = get_condition(status.get("conditions"), "Ready")
        assert ready is not None
        assert ready["status"] == "True", status
        assert [i for i in status.get("instances") or [] if i.get("ready")], status
        events, _ = await client.list(EVENT, namespace)
        reasons = {e.get("reason") for e in events if (e.get("involvedObject") or {}).get("name") == NAME}
        assert {"CARotationStarted", "CARotated"} <= reasons, reasons
