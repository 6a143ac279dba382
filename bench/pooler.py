"""pgbench through a PostgresPooler (PgBouncer) against straight through ``-rw``, and the write pause a switchover
costs each (issue 29 item 6).

    python bench/pooler.py [--clients 20] [--seconds 20] [--switchovers 3] [--json FILE]

Starts the real control plane, one local node and the operator (in this process, with the pooler controller), a
PostgresCluster of two instances and a PostgresPooler of two PgBouncer pods (transaction mode, ``default_pool_size``
10). Every connection is TLS with ``sslmode=verify-full`` against the cluster's CA. pgbench (the host's, Debian 12)
runs select-only (``-S``) and TPC-B-like transactions, each once with connections held for the whole run and once
with a new connection per transaction (``-C``: where a pooler matters most), first straight through ``-rw``, then
through the pooler. Then ``--switchovers`` switchovers, each while one writer goes through the pooler and one through
``-rw`` (the e2e test's ``Writer``: one connection, reconnecting after an error): the longest pause between
acknowledged writes of each. The numbers go into docs/benchmarks.md with the command that produced them.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import re
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' node and e2e helpers

from kanri.local import ControlPlane
from kanri.local.imagemap import default_image_map
from kanri.local.node import NodeOptions
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.ha.failover import SWITCHOVER
from kanri.postgres.kinds import POSTGRES_CLUSTER, POSTGRES_POOLER
from kanri.runtime import Client
from kanri.runtime.kinds import NAMESPACE, SECRET
from tests.e2e.postgres_helpers import cluster, cluster_ip, credentials, ready
from tests.e2e.test_postgres_pooler_e2e import NAME, POOLER, Writer, pooler, pooler_ready
from tests.local_node_support import running_node, with_test_network
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

Obj = dict[str, Any]


async def pgbench(args: list[str], env: dict[str, str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        "pgbench", *args, env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )  # fmt: skip
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise RuntimeError(f"pgbench {' '.join(args)} failed:\n{text[-2000:]}")
    return text


def measures(output: str) -> dict[str, float]:
    tps = re.search(r"tps = ([0-9.]+) \((?:without initial connection time|excluding connections establishing)",
                    output) or re.search(r"tps = ([0-9.]+)", output)  # fmt: skip
    latency = re.search(r"latency average = ([0-9.]+) ms", output)
    failed = re.search(r"number of failed transactions: ([0-9]+)", output)
    return {"tps": float(tps.group(1)) if tps else 0.0, "latency_ms": float(latency.group(1)) if latency else 0.0,
            "failed": float(failed.group(1)) if failed else 0.0}  # fmt: skip


async def switchover(client: Client, namespace: str, through: Any, direct: Any) -> dict[str, float]:
    writers = [Writer("pooler", through), Writer("direct", direct)]
    tasks = [asyncio.create_task(w.run()) for w in writers]
    try:

        async def steady() -> bool:  # both writing before the switchover, so both see it
            moment = time.monotonic()
            return all(len(w.acked) >= 20 and moment - w.acked[-1][1] < 0.5 for w in writers)

        await eventually(steady, timeout=30, interval=0.2)
        before = (await client.get(POSTGRES_CLUSTER, NAME, namespace))["status"]["currentPrimary"]
        target = next(i for i in (f"{NAME}-1", f"{NAME}-2") if i != before)
        await client.patch(POSTGRES_CLUSTER, NAME, {"metadata": {"annotations": {SWITCHOVER: target}}}, namespace)

        async def switched() -> Obj | None:
            now = await ready(client, namespace, NAME, 2)
            return now if now is not None and now["status"].get("currentPrimary") == target else None

        await eventually(switched, timeout=180, interval=1)
        done = time.monotonic()

        async def writing_again() -> bool:
            return all(len([t for _, t in w.acked if t > done]) >= 20 for w in writers)

        await eventually(writing_again, timeout=60, interval=0.2)
    finally:
        for w in writers:
            w.stop.set()
        await asyncio.gather(*tasks)
    return {w.source: round(w.longest_gap(), 2) for w in writers}


async def main(clients: int, seconds: int, switchovers: int, output: Path | None) -> None:
    import psycopg

    results: dict[str, Any] = {"pgbench": [], "switchover": []}
    with tempfile.TemporaryDirectory(prefix="kanri-bench-pooler-", dir="/var/tmp") as scratch:
        control_plane = ControlPlane(Path(scratch) / "controlplane")
        endpoint = control_plane.start(exit_with_parent=True)
        try:
            async with await Client.from_kubeconfig(str(endpoint.kubeconfig)) as client:
                await install_postgres_crd(client)
                namespace = f"bench-pooler-{secrets.token_hex(3)}"
                await client.create(NAMESPACE, {"metadata": {"name": namespace}})
                options = with_test_network(NodeOptions(data_dir=Path(scratch) / "node",
                                                        name=f"bench-pool-{secrets.token_hex(2)}",
                                                        images=default_image_map()))  # fmt: skip
                async with running_node(endpoint.kubeconfig, options):
                    instances = HttpInstanceClient()
                    operator = Operator(endpoint, namespace, instances=instances, poolers=True)
                    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 2))
                    await client.create(POSTGRES_POOLER, pooler(namespace, parameters={"default_pool_size": "10"}))
                    async with operator.running(refresh=2.0):
                        await eventually(lambda: ready(client, namespace, NAME, 2), timeout=300, interval=1)

                        async def pooler_is_ready() -> Obj | None:
                            found = await pooler_ready(client, namespace)
                            return found if isinstance(found, dict) else None

                        await eventually(pooler_is_ready, timeout=180, interval=1)
                        user, password = await credentials(client, namespace, NAME)
                        ca_file = Path(scratch) / "ca.crt"
                        ca = await client.get(SECRET, f"{NAME}-ca", namespace)
                        ca_file.write_bytes(base64.b64decode(ca["data"]["ca.crt"]))
                        targets = {
                            "direct": (f"{NAME}-rw.{namespace}.svc", await cluster_ip(client, namespace, f"{NAME}-rw")),
                            "pooler": (f"{POOLER}.{namespace}.svc", await cluster_ip(client, namespace, POOLER)),
                        }
                        tls = {"PGSSLMODE": "verify-full", "PGSSLROOTCERT": str(ca_file), "PGPASSWORD": password,
                               "PGUSER": user, "PGDATABASE": "app", "PGCONNECT_TIMEOUT": "10"}  # fmt: skip

                        def env(where: str) -> dict[str, str]:
                            host, address = targets[where]
                            return tls | {"PGHOST": host, "PGHOSTADDR": address}

                        await pgbench(["-i", "-q", "-s", "2"], env("direct"))
                        for workload, extra in (("select-only", ["-S"]), ("tpcb-like", [])):
                            for connect in (False, True):
                                for where in ("direct", "pooler"):
                                    args = [*extra, "-n", "-c", str(clients), "-j", "2", "-T", str(seconds)]
                                    args += ["-C"] if connect else []
                                    found = measures(await pgbench(args, env(where)))
                                    row = {"workload": workload, "new_connection_per_transaction": connect,
                                           "through": where, **found}  # fmt: skip
                                    results["pgbench"].append(row)
                                    flag = "-C" if connect else "  "
                                    print(f"{workload:<12} {flag} {where:<7} {found['tps']:9.1f} tps  "
                                          f"{found['latency_ms']:7.2f} ms", flush=True)  # fmt: skip

                        verify: dict[str, Any] = {"sslmode": "verify-full", "sslrootcert": str(ca_file)}

                        def connector(where: str) -> Any:
                            host, address = targets[where]

                            async def connect() -> Any:
                                conn = await psycopg.AsyncConnection.connect(
                                    host=host, hostaddr=address, port=5432, user=user, password=password, dbname="app",
                                    connect_timeout=5, autocommit=True, **verify)  # fmt: skip
                                conn.prepare_threshold = None  # transaction mode: no server-side prepared statements
                                return conn

                            return connect

                        async with await connector("direct")() as conn:
                            await conn.execute("CREATE TABLE IF NOT EXISTS acked (source text, n int, "
                                               "PRIMARY KEY (source, n))")  # fmt: skip
                        for n in range(switchovers):
                            await conn_reset(connector("direct"))
                            gaps = await switchover(client, namespace, connector("pooler"), connector("direct"))
                            results["switchover"].append(gaps)
                            print(f"switchover {n + 1}: longest pause through the pooler {gaps['pooler']:.2f} s, "
                                  f"straight through -rw {gaps['direct']:.2f} s", flush=True)  # fmt: skip
                    await instances.close()
        finally:
            control_plane.stop()
    for where in ("pooler", "direct"):
        pauses: list[float] = [g[where] for g in results["switchover"]]
        if pauses:
            print(f"switchover pause {where}: median {statistics.median(pauses):.2f} s, max {max(pauses):.2f} s")
    if output is not None:
        await asyncio.to_thread(output.write_text, json.dumps(results, indent=1))


async def conn_reset(connect: Any) -> None:
    """An empty ledger table before each switchover (the writers number from 0 again)."""
    async with await connect() as conn:
        await conn.execute("TRUNCATE acked")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--switchovers", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.clients, arguments.seconds, arguments.switchovers, arguments.json))
