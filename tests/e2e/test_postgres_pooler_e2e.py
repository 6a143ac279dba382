"""A PostgresPooler end to end (issue 29 item 6): real PgBouncer (Debian's, ``kanri.dev/pgbouncer:1.18``) in front
of a real two-instance cluster, run by the operator.

* the app user connects through the pooler's Service with ``sslmode=verify-full`` against the cluster's CA (a wrong
  name is refused, so the name is checked), and PgBouncer's own connection to PostgreSQL is TLS too (``pg_stat_ssl``);
* the superuser cannot log in through the pooler (the lookup function answers no superuser);
* transaction mode: 24 concurrent clients are served by at most ``default_pool_size`` server connections per pod;
* each pod's agent serves PgBouncer's pools for Prometheus;
* a changed ``spec.parameters`` rolls the Deployment (a new config hash on the pod template) and the pooler is Ready
  again with the new setting;
* a switchover (``kanri.dev/switchover-to``) while one writer goes through the pooler and one straight through
  ``-rw``: every acknowledged write is there afterwards, and the longest pause between acknowledged writes of each
  is printed (the numbers docs/pooler.md quotes).
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from kanri.local.node import LocalNode
from kanri.postgres.ha.failover import SWITCHOVER
from kanri.postgres.kinds import POSTGRES_CLUSTER, POSTGRES_POOLER
from kanri.postgres.pooler.children import METRICS_PORT
from kanri.postgres.pooler.names import LABELS
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import DEPLOYMENT, POD, SECRET
from tests.e2e.postgres_helpers import cluster, cluster_ip, credentials, ready, ready_with_row
from tests.postgres_support import Operator
from tests.support import eventually

Obj = dict[str, Any]
pytestmark = [pytest.mark.timeout(600)]
NAME = "pool"
POOLER = "pool-bouncer"


def pooler(namespace: str, **spec: Any) -> Obj:
    return {"apiVersion": POSTGRES_POOLER.api_version, "kind": "PostgresPooler",
            "metadata": {"name": POOLER, "namespace": namespace},
            "spec": {"cluster": NAME, "instances": 2, **spec}}  # fmt: skip


async def pooler_ready(client: Client, namespace: str, config_hash: str | None = None) -> Obj | str:
    """The pooler once Ready (with a config hash other than ``config_hash``), else its status (for the message)."""
    found = await client.get(POSTGRES_POOLER, POOLER, namespace)
    status = found.get("status") or {}
    condition = get_condition(status.get("conditions"), "Ready") or {}
    if condition.get("status") == "True" and status.get("configHash") != config_hash:
        return found
    return f"not ready: {condition.get('reason')}: {condition.get('message')} ({status.get('readyInstances')} ready)"


async def _ready(client: Client, namespace: str, config_hash: str | None = None) -> Obj:
    async def check() -> Obj | None:
        found = await pooler_ready(client, namespace, config_hash)
        return found if isinstance(found, dict) else None

    try:
        return await eventually(check, timeout=180, interval=1)
    except TimeoutError:
        raise AssertionError(f"pooler: {await pooler_ready(client, namespace, config_hash)}") from None


class Writer:
    """Inserts numbered rows over one connection, reconnecting after an error, and records each acknowledgement."""

    def __init__(self, source: str, connect: Any) -> None:
        self.source, self.connect = source, connect
        self.acked: list[tuple[int, float]] = []
        self.errors = 0
        self.last_error = ""
        self.stop = asyncio.Event()

    async def run(self) -> None:
        n = 0
        conn: psycopg.AsyncConnection[Any] | None = None
        while not self.stop.is_set():
            try:
                if conn is None:
                    conn = await self.connect()
                await conn.execute("INSERT INTO acked (source, n) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                                   (self.source, n))  # fmt: skip
                self.acked.append((n, time.monotonic()))
                n += 1
            except psycopg.Error as exc:
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                if conn is not None:
                    await conn.close()
                conn = None
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.02)
        if conn is not None:
            await conn.close()

    def longest_gap(self) -> float:
        times = [t for _, t in self.acked]
        return max((b - a for a, b in itertools.pairwise(times)), default=0.0)


async def test_pooler_tls_auth_transaction_mode_config_roll_and_switchover(
    client: Client, node: LocalNode, namespace: str, control_plane: Any, tmp_path: Path
) -> None:
    operator = Operator(control_plane, namespace, poolers=True)
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 2))
    await client.create(POSTGRES_POOLER, pooler(namespace, parameters={"default_pool_size": "4"}))
    async with operator.running(refresh=2.0):
        await ready_with_row(client, namespace, NAME, 2)
        found = await _ready(client, namespace)
        assert found["status"]["service"] == POOLER

        ca_file = tmp_path / "ca.crt"
        ca = await client.get(SECRET, f"{NAME}-ca", namespace)
        ca_file.write_bytes(base64.b64decode(ca["data"]["ca.crt"]))
        address = await cluster_ip(client, namespace, POOLER)
        service = f"{POOLER}.{namespace}.svc"
        user, password = await credentials(client, namespace, NAME)
        verify: dict[str, Any] = {"sslmode": "verify-full", "sslrootcert": str(ca_file)}

        async def through_pooler(host: str = service, who: str = user, secret: str = password
                                 ) -> psycopg.AsyncConnection[Any]:  # fmt: skip
            # no server-side prepared statements in transaction mode (PgBouncer 1.18 cannot carry them across
            # server connections): psycopg prepares a query on its fifth run unless told not to
            conn = await psycopg.AsyncConnection.connect(host=host, hostaddr=address, port=5432, user=who,
                                                         password=secret, dbname="app", connect_timeout=5,
                                                         autocommit=True, **verify)  # fmt: skip
            conn.prepare_threshold = None
            return conn

        # TLS both ways: the client verified the pooler's name; PgBouncer's server connection is TLS too
        async def server_side_tls() -> bool | str:
            try:
                async with await through_pooler() as conn:
                    row = await (await conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                                                    )).fetchone()  # fmt: skip
                    return bool(row and row[0]) or f"pg_stat_ssl says {row}"
            except psycopg.Error as exc:
                return f"{type(exc).__name__}: {exc}"

        await until(server_side_tls, 60, "a TLS connection from PgBouncer to PostgreSQL")
        with pytest.raises(psycopg.OperationalError) as wrong:
            await through_pooler(host="elsewhere.example")
        assert "elsewhere.example" in str(wrong.value) or "does not match" in str(wrong.value), str(wrong.value)
        superuser = await client.get(SECRET, f"{NAME}-superuser", namespace)
        super_password = base64.b64decode(superuser["data"]["password"]).decode()
        with pytest.raises(psycopg.OperationalError) as refused:
            await through_pooler(who="postgres", secret=super_password)
        assert "no such user" in str(refused.value), str(refused.value)  # the lookup answers no superuser

        # transaction mode: many clients, few server connections (default_pool_size 4 per pod, 2 pods)
        clients = [await through_pooler() for _ in range(24)]
        try:
            pids: set[int] = set()
            for _ in range(3):
                answers = await asyncio.gather(*(c.execute("SELECT pg_backend_pid(), pg_sleep(0.2)") for c in clients))
                pids |= {int((await r.fetchone() or [0])[0]) for r in answers}
        finally:
            for c in clients:
                await c.close()
        print(f"pooler: 24 clients x 3 rounds served by {len(pids)} server connections")
        assert 0 < len(pids) <= 8, f"24 clients used {len(pids)} server connections, more than 2 pods x 4"

        # metrics: each pod's agent serves PgBouncer's pools (the app user's pool is there after the clients above)
        pods = (await client.list(POD, namespace, label_selector=LABELS.selector_text(POOLER)))[0]
        ips = [p["status"]["podIP"] for p in pods if (p.get("status") or {}).get("podIP")]

        async def served_metrics() -> bool | str:
            texts = []
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
                for ip in ips:
                    try:
                        async with http.get(f"http://{ip}:{METRICS_PORT}/metrics") as response:
                            texts.append(await response.text())
                    except aiohttp.ClientError as exc:
                        return f"{ip}: {type(exc).__name__}: {exc}"
            wanted = ("kanri_pgbouncer_up 1.0", 'kanri_pgbouncer_servers_idle{database="app",user="app"}')
            missing = [f"{ip}: {w}" for ip, text in zip(ips, texts, strict=True) for w in wanted if w not in text]
            return (bool(ips) and not missing) or f"pods {ips}; missing {missing}"

        await until(served_metrics, 60, "PgBouncer's metrics from every pod")

        # a parameter change rolls the pods (a new hash on the template) and is served
        old_hash = found["status"]["configHash"]
        await client.patch(POSTGRES_POOLER, POOLER, {"spec": {"parameters": {"default_pool_size": "6"}}}, namespace)
        rolled = await _ready(client, namespace, config_hash=old_hash)
        deployment = await client.get(DEPLOYMENT, POOLER, namespace)
        annotations = deployment["spec"]["template"]["metadata"]["annotations"]
        assert rolled["status"]["configHash"] in annotations.values()

        async def rolled_out() -> bool | str:
            status = (await client.get(DEPLOYMENT, POOLER, namespace)).get("status") or {}
            done = status.get("updatedReplicas") == 2 and status.get("readyReplicas") == 2 == status.get("replicas")
            return done or f"deployment status {status}"

        await until(rolled_out, 180, "the Deployment rolled out")

        async def connects() -> bool | str:  # the Service's routes follow the new pods within seconds
            for attempt in range(6):  # every route: a stale one to a deleted pod would time out
                try:
                    async with await through_pooler() as conn:
                        await conn.execute("SELECT 1")
                except psycopg.Error as exc:
                    return f"connection {attempt + 1} of 6: {type(exc).__name__}: {exc}"
            return True

        await until(connects, 60, "connections through the pooler after the roll")

        # a switchover while writing through the pooler and straight through -rw
        rw = await cluster_ip(client, namespace, f"{NAME}-rw")
        async with await through_pooler() as conn:
            await conn.execute("CREATE TABLE IF NOT EXISTS acked (source text, n int, PRIMARY KEY (source, n))")

        async def direct() -> psycopg.AsyncConnection[Any]:
            return await psycopg.AsyncConnection.connect(host=f"{NAME}-rw.{namespace}.svc", hostaddr=rw, port=5432,
                                                         user=user, password=password, dbname="app",
                                                         connect_timeout=5, autocommit=True, **verify)  # fmt: skip

        writers = [Writer("pooler", through_pooler), Writer("direct", direct)]
        tasks = [asyncio.create_task(w.run()) for w in writers]
        try:

            async def steady() -> bool | str:  # both writing before the switchover, so both see it
                moment = time.monotonic()
                recent = [len(w.acked) >= 20 and moment - w.acked[-1][1] < 0.5 for w in writers]
                return all(recent) or f"{[(w.source, len(w.acked), w.last_error) for w in writers]}"

            await until(steady, 30, "both writers acknowledged")
            before = (await client.get(POSTGRES_CLUSTER, NAME, namespace))["status"]["currentPrimary"]
            target = next(i for i in (f"{NAME}-1", f"{NAME}-2") if i != before)
            await client.patch(POSTGRES_CLUSTER, NAME, {"metadata": {"annotations": {SWITCHOVER: target}}}, namespace)

            async def switched() -> Obj | None:
                now = await ready(client, namespace, NAME, 2)
                return now if now is not None and now["status"].get("currentPrimary") == target else None

            await eventually(switched, timeout=180, interval=1)

            async def writing_again() -> bool | str:  # through the pooler too: its agent renewed stale connections
                moment = time.monotonic()
                recent = all(w.acked and moment - w.acked[-1][1] < 1 for w in writers)
                return recent or f"{[(w.source, len(w.acked), w.errors, w.last_error) for w in writers]}"

            await until(writing_again, 60, "both writers acknowledged again after the switchover")
            await asyncio.sleep(2)
        finally:
            for w in writers:
                w.stop.set()
            await asyncio.gather(*tasks)
        async with await direct() as conn:
            cursor = await conn.execute("SELECT source, n FROM acked")
            rows = await cursor.fetchall()
        stored = {(str(row[0]), int(row[1])) for row in rows}
        for w in writers:
            lost = [n for n, _ in w.acked if (w.source, n) not in stored]
            gap = w.longest_gap()
            print(f"switchover {before} -> {target}: {w.source}: {len(w.acked)} acknowledged writes, "
                  f"{w.errors} errors (last: {w.last_error}), longest pause {gap:.2f} s, lost {len(lost)}")  # fmt: skip
            assert not lost, f"{w.source}: acknowledged writes missing after the switchover: {lost[:20]}"
            assert w.acked, f"{w.source}: no write acknowledged"


async def until(check: Callable[[], Awaitable[bool | str]], timeout: float, what: str) -> None:
    """Poll ``check`` until it answers True; after ``timeout`` fail with its last answer (a string saying why not)."""
    last: bool | str = "not asked"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        last = await check()
        if last is True:
            return
        await asyncio.sleep(1)
    raise AssertionError(f"{what}: not after {timeout} s; last seen: {last}")
