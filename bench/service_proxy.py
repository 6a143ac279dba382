"""Benchmark the local cluster's Service path: pgbench through a ClusterIP (kube-proxy, nftables) vs straight to the
pod, both from the host, against one PostgreSQL 15 pod.

    flock /run/kanri-tests.lock .venv/bin/python bench/service_proxy.py              # 20 s per run, 1 round
    flock /run/kanri-tests.lock .venv/bin/python bench/service_proxy.py --rounds 2             # as recorded
    flock /run/kanri-tests.lock .venv/bin/python bench/service_proxy.py --cluster --rounds 2 --timeout 300

What runs is what ``kanri local up`` starts (:func:`_localcluster.local_cluster`): the real control plane and the
local node as a detached process, with the benchmark's own bridge, pod range and DNS address (``NETWORK``), so a
developer's cluster is left alone; the node runs the real kube-proxy, as by default. The pod is
``kanri.dev/postgres:15`` from the generated image map with its command replaced by a plain ``initdb`` + ``postgres``
(uid 26, data in the pod's own ``/tmp``, ``trust`` for the pod network; PostgreSQL's defaults otherwise), a
``tcpSocket`` readiness probe and a Service ``pg`` selecting it.

After ``pgbench -i -s 10``, each round runs, alternating the two targets so drift hits both alike:
``pgbench -S`` (select only) and the default TPC-B-like script, each ``-c 8 -j 2 -T <seconds>``, to the pod's
address and to the Service's ClusterIP. The number is pgbench's ``tps`` (without initial connection time); the
ratio is ClusterIP / direct (the issue's target: ≥ 0.9). Before measuring, the benchmark checks that kube-proxy
has the ClusterIP in its nftables map (so the ClusterIP path is the kernel's DNAT, not the userspace fallback).

With ``--cluster`` the target is instead what the issue measured: a one-instance PostgresCluster (version 15) of
the operator, deployed from ``deploy/`` as a pod (as ``bench/postgres_operator.py`` does), through its ``-rw``
Service vs straight to the primary pod, as the cluster's app user (``scram-sha-256``, password from ``<name>-app``)
on database ``app``; the instance's configuration is the operator's.

Prints a Markdown table and one JSON line; record them in docs/benchmarks.md with the command that produced them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _localcluster import Network, check_machine, local_cluster, sigterm_as_exit
from kanri.local import controlplane_binary, paths
from kanri.runtime import Client, Kind, get_condition

POD = Kind("v1", "Pod", "pods")
SERVICE = Kind("v1", "Service", "services")
NAMESPACE = "default"
NAME = "bench-pg"
PG_BIN = Path("/usr/lib/postgresql/15/bin")
TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)

Obj = dict[str, Any]

NETWORK: Network = {
    "bridge": "ksvcb0",
    "service_link": "ksvcb-svc",
    "netns_prefix": "ksvcb-",
    "pod_cidr": "10.248.0.0/16",
    "internal_ip": "10.248.0.1",
    "cluster_dns_ip": "10.96.254.53",
}
"""The node's network names and addresses, apart from a developer's ``kanri local up`` and the other benchmarks."""

SERVER = (
    "set -e; D=/tmp/pgdata; initdb -D $D -U postgres -A trust >/dev/null; "
    'echo "host all all 0.0.0.0/0 trust" >> $D/pg_hba.conf; '
    "exec postgres -D $D -c listen_addresses='*' -c unix_socket_directories=/tmp -c max_connections=50"
)


def postgres_pod() -> Obj:
    return {
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"app": NAME}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "postgres",
                    "image": "kanri.dev/postgres:15",
                    "command": ["/bin/sh", "-c", SERVER],
                    "ports": [{"containerPort": 5432, "name": "pg"}],
                    "securityContext": {"runAsUser": 26},
                    "readinessProbe": {"tcpSocket": {"port": 5432}, "periodSeconds": 1},
                }
            ],
        },
    }


def pg_service() -> Obj:
    return {
        "metadata": {"name": "pg", "namespace": NAMESPACE},
        "spec": {"selector": {"app": NAME}, "ports": [{"name": "pg", "port": 5432, "targetPort": "pg"}]},
    }


async def ready_pod_ip(client: Client, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pod = await client.get(POD, NAME, NAMESPACE)
        status = pod.get("status") or {}
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        if ready and status.get("podIP"):
            return str(status["podIP"])
        await asyncio.sleep(0.5)
    sys.exit(f"pod {NAME} not Ready within {timeout:.0f}s")


def programmed(cluster_ip: str) -> bool:
    """Whether kube-proxy's nftables map routes the ClusterIP (the DNAT path, not the userspace fallback)."""
    listing = subprocess.run(
        ["nft", "list", "map", "ip", "kube-proxy", "service-ips"], capture_output=True, text=True, check=False
    ).stdout
    return cluster_ip in listing


LOGIN = {"user": "postgres", "password": "", "database": "postgres"}
"""Who pgbench logs in as: the plain pod's trusted superuser, or (``--cluster``) the cluster's app user."""


def pgbench(host: str, *args: str) -> str:
    env = {"PATH": "/usr/bin:/bin", "PGPASSWORD": LOGIN["password"]}
    result = subprocess.run(
        [str(PG_BIN / "pgbench"), "-h", host, "-p", "5432", "-U", LOGIN["user"], *args, LOGIN["database"]],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if result.returncode != 0:
        sys.exit(f"pgbench {' '.join(args)} against {host} failed:\n{result.stderr[-2000:]}")
    return result.stdout


def tps(output: str) -> float:
    match = TPS.search(output)
    if match is None:
        sys.exit(f"no tps in pgbench output:\n{output[-2000:]}")
    return float(match.group(1))


async def prepare(kubeconfig: Path, timeout: float) -> tuple[str, str]:
    """The pod and Service created; their addresses once the pod is Ready and kube-proxy routes the ClusterIP."""
    async with await Client.from_kubeconfig(str(kubeconfig)) as client:
        await client.create(POD, postgres_pod())
        service = await client.create(SERVICE, pg_service())
        pod_ip = await ready_pod_ip(client, timeout)
    cluster_ip = str(service["spec"]["clusterIP"])
    deadline = time.monotonic() + timeout
    while not programmed(cluster_ip):
        if time.monotonic() > deadline:
            sys.exit(f"kube-proxy did not program {cluster_ip}: is the node on the userspace fallback? (node.log)")
        await asyncio.sleep(0.5)
    return pod_ip, cluster_ip


async def prepare_cluster(kubeconfig: Path, timeout: float) -> tuple[str, str]:
    """The operator and a one-instance PostgresCluster; the primary's address and the ``-rw`` ClusterIP once the
    cluster is Ready and kube-proxy routes that address. Sets :data:`LOGIN` to the app user."""
    import base64

    from kanri.cli.up import apply_all, documents
    from kanri.postgres.kinds import POSTGRES_CLUSTER
    from kanri.postgres.labels import CLUSTER, PRIMARY, ROLE
    from kanri.postgres.names import app_secret, read_write_service

    secret_kind = Kind("v1", "Secret", "secrets")
    root = paths.source_root()
    async with await Client.from_kubeconfig(str(kubeconfig)) as client:
        await apply_all(client, documents(root / "deploy" / "crds"))
        await apply_all(client, documents(root / "deploy" / "operator"))
        spec = {"version": 15, "replicas": 1, "storage": {"size": "2Gi"}, "deletionPolicy": "Delete"}
        cluster = {"apiVersion": POSTGRES_CLUSTER.api_version, "kind": POSTGRES_CLUSTER.kind,
                   "metadata": {"name": NAME, "namespace": NAMESPACE}, "spec": spec}  # fmt: skip
        deadline = time.monotonic() + timeout
        while True:  # the CRD may not be served yet right after it was applied
            try:
                await client.create(POSTGRES_CLUSTER, cluster)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(1)
        while True:
            current = await client.get(POSTGRES_CLUSTER, NAME, NAMESPACE)
            ready = get_condition((current.get("status") or {}).get("conditions"), "Ready")
            if ready is not None and ready["status"] == "True":
                break
            if time.monotonic() > deadline:
                sys.exit(f"PostgresCluster {NAME} not Ready within {timeout:.0f}s: {current.get('status')}")
            await asyncio.sleep(1)
        pods, _ = await client.list(POD, NAMESPACE, label_selector=f"{CLUSTER}={NAME},{ROLE}={PRIMARY}")
        pod_ip = str(pods[0]["status"]["podIP"])
        service = await client.get(SERVICE, read_write_service(NAME), NAMESPACE)
        data = (await client.get(secret_kind, app_secret(NAME), NAMESPACE))["data"]
    LOGIN.update(
        user=base64.b64decode(data["username"]).decode(),
        password=base64.b64decode(data["password"]).decode(),
        database="app",
    )
    cluster_ip = str(service["spec"]["clusterIP"])
    while not programmed(cluster_ip):
        if time.monotonic() > deadline:
            sys.exit(f"kube-proxy did not program {cluster_ip}: is the node on the userspace fallback? (node.log)")
        await asyncio.sleep(0.5)
    return pod_ip, cluster_ip


def measure(pod_ip: str, cluster_ip: str, args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    if getattr(args, "init", True):  # bench/real_service_proxy.py measures twice on one database
        started = time.monotonic()
        pgbench(pod_ip, "-i", "-s", str(args.scale), "-q")
        print(f"pgbench -i -s {args.scale}: {time.monotonic() - started:.1f}s", file=sys.stderr)
    common = ["-c", str(args.clients), "-j", str(args.threads), "-T", str(args.seconds)]
    results: dict[str, dict[str, list[float]]] = {w: {"direct": [], "clusterip": []} for w in ("select", "tpcb")}
    for round_ in range(args.rounds):
        for workload, extra in (("select", ["-S"]), ("tpcb", [])):
            order = [("direct", pod_ip), ("clusterip", cluster_ip)]
            for target, host in order if round_ % 2 == 0 else reversed(order):
                value = tps(pgbench(host, *extra, *common))
                results[workload][target].append(value)
                print(f"round {round_ + 1} {workload} {target}: {value:.0f} tps", file=sys.stderr, flush=True)
    return results


def report(results: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> None:
    print(f"| workload (-c {args.clients} -j {args.threads} -T {args.seconds}, scale {args.scale}) "
          "| direct to the pod, tps | through the ClusterIP (kube-proxy), tps | ratio |")  # fmt: skip
    print("|---|---|---|---|")
    summary: dict[str, Any] = {"bench": "service_proxy", "target": "cluster -rw" if args.cluster else "plain pod",
                               "rounds": args.rounds, "seconds": args.seconds}  # fmt: skip
    for workload, label in (("select", "pgbench -S"), ("tpcb", "TPC-B (default script)")):
        direct = statistics.median(results[workload]["direct"])
        through = statistics.median(results[workload]["clusterip"])
        print(f"| {label} | {direct:,.0f} | {through:,.0f} | {through / direct:.2f}x |")
        summary[workload] = {"direct": direct, "clusterip": through, "ratio": round(through / direct, 3)}
    print(json.dumps(summary))


def add_pgbench_arguments(parser: argparse.ArgumentParser) -> None:
    """The pgbench knobs :func:`measure` reads (also bench/real_service_proxy.py's)."""
    parser.add_argument("--seconds", type=int, default=20, help="pgbench -T of each run")
    parser.add_argument("--rounds", type=int, default=1, help="runs of each workload and target")
    parser.add_argument("--scale", type=int, default=10, help="pgbench -i -s")
    parser.add_argument("--clients", type=int, default=8, help="pgbench -c")
    parser.add_argument("--threads", type=int, default=2, help="pgbench -j")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pgbench_arguments(parser)
    parser.add_argument("--wait", type=float, default=600.0, help="seconds to wait for another local node to stop")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds the pod may take to be Ready")
    parser.add_argument("--cluster", action="store_true", help="a PostgresCluster's -rw Service instead of a plain pod")
    parser.add_argument("--keep", action="store_true", help="keep the scratch dir (logs) and print its path")
    args = parser.parse_args()

    check_machine(NETWORK, args.wait)
    binary = controlplane_binary()
    scratch = Path(tempfile.mkdtemp(prefix="kanri-bench-svc-"))
    try:
        with sigterm_as_exit(), local_cluster(scratch / "cluster", binary, NETWORK, args.wait) as cluster:
            setup = prepare_cluster if args.cluster else prepare
            pod_ip, cluster_ip = asyncio.run(setup(cluster.kubeconfig, args.timeout))
            results = measure(pod_ip, cluster_ip, args)
    finally:
        if args.keep:
            print(f"kept {scratch} (node.log, controlplane.log, node/kube-proxy.log)", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    cluster.require_clean()
    report(results, args)


if __name__ == "__main__":
    main()
