"""pgbench through a PostgresCluster's ``-rw`` Service vs straight to the primary pod, on three real nodes.

    flock /tmp/kanri-e2e.lock .venv/bin/python bench/real_service_proxy.py --rounds 2

The real-node twin of ``bench/service_proxy.py --cluster`` (same pgbench runs, same table; docs/benchmarks.md): its
own control plane, three real nodes (kubelet, containerd, runc, kube-proxy in nftables mode; docs/real-nodes.md)
with CoreDNS and the local-path provisioner, the operator in this process told the built ``kanri-postgres-15``
image, and a one-instance PostgresCluster (version 15) on a local-path volume. pgbench runs on the host as the
cluster's app user. The host has no kube-proxy of its own (it is not a node): ``-rw``'s ClusterIP is routed to a node
whose kube-proxy DNATs it, first the primary's own node (the pod is local to the kube-proxy that translates), then
another node (kube-proxy there DNATs and masquerades, and the packet crosses to the primary's node: what a client
on another node, or a load balancer in front of one, gets). Uses the machine's pod network: run under the e2e lock
after ``make images``.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import secrets
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' real-node helpers

from kanri.local import ControlPlane
from kanri.local.realnode.addons.localpath import STORAGE_CLASS
from kanri.local.realnode.network import route_services, unroute_services
from kanri.postgres.children.images import ENV as POSTGRES_IMAGES_ENV
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.names import app_secret, read_write_service
from kanri.runtime import Client
from kanri.runtime.kinds import NAMESPACE, POD, SECRET, SERVICE
from service_proxy import LOGIN, add_pgbench_arguments, measure
from tests.e2e.postgres_helpers import cluster, ready
from tests.integration.realnode_support import coredns_on, environment, local_path_on, three_real_nodes
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

MAJOR = 15
IMAGE = f"kanri-postgres-{MAJOR}"
NAME = "bench-pg"


async def accepts(host: str) -> bool | None:
    """Whether the app user can log in at ``host`` (kube-proxy programs a new route a moment after it changed)."""
    try:
        async with await psycopg.AsyncConnection.connect(
            host=host, port=5432, user=LOGIN["user"], password=LOGIN["password"], dbname=LOGIN["database"],
            connect_timeout=2,
        ):  # fmt: skip
            return True
    except psycopg.OperationalError:
        return None


async def run(args: argparse.Namespace) -> dict[str, dict[str, dict[str, list[float]]]]:
    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    # real nodes bind unix sockets deep inside their directories (at most 107 bytes): a short path
    with tempfile.TemporaryDirectory(prefix="krs-", dir="/var/tmp") as scratch:
        control_plane = ControlPlane(Path(scratch) / "controlplane")
        endpoint = control_plane.start(exit_with_parent=True)
        cidr = str(json.loads((endpoint.kubeconfig.parent / "config.json").read_text())["serviceCIDR"])
        try:
            with contextlib.ExitStack() as stack:
                nodes = stack.enter_context(three_real_nodes(endpoint, Path(scratch), "bs", IMAGE))
                stack.enter_context(coredns_on(nodes))
                stack.enter_context(local_path_on(nodes, Path(scratch), IMAGE))
                ref = nodes.nodes[0].image(IMAGE).ref
                stack.enter_context(environment(POSTGRES_IMAGES_ENV, json.dumps({"postgres": {str(MAJOR): ref}})))
                stack.callback(unroute_services, cidr)
                async with await Client.from_kubeconfig(str(endpoint.kubeconfig)) as client:
                    await install_postgres_crd(client)
                    namespace = f"bench-svc-{secrets.token_hex(3)}"
                    await client.create(NAMESPACE, {"metadata": {"name": namespace}})
                    instances = HttpInstanceClient()
                    operator = Operator(endpoint, namespace, instances=instances)
                    spec = cluster(NAME, namespace, 1, version=MAJOR,
                                   storage={"size": "2Gi", "storageClassName": STORAGE_CLASS})  # fmt: skip
                    await client.create(POSTGRES_CLUSTER, spec)
                    async with operator.running(refresh=10.0):
                        await eventually(lambda: ready(client, namespace, NAME, 1), timeout=args.timeout, interval=1)
                        status = (await client.get(POSTGRES_CLUSTER, NAME, namespace))["status"]
                        primary = await client.get(POD, f"{status['currentPrimary']}-0", namespace)
                        pod_ip, node = str(primary["status"]["podIP"]), str(primary["spec"]["nodeName"])
                        rw = await client.get(SERVICE, read_write_service(NAME), namespace)
                        cluster_ip = str(rw["spec"]["clusterIP"])
                        data = (await client.get(SECRET, app_secret(NAME), namespace))["data"]
                        LOGIN.update(user=base64.b64decode(data["username"]).decode(),
                                     password=base64.b64decode(data["password"]).decode(),
                                     database="app")  # fmt: skip
                        own = next(n for n in nodes.nodes if n.spec.name == node)
                        other = next(n for n in nodes.nodes if n.spec.name != node)
                        for label, via in (("the primary's node", own), ("another node", other)):
                            route_services(cidr, via.spec)
                            await eventually(lambda: accepts(cluster_ip), timeout=60, interval=0.5)
                            print(f"-rw routed through {label} ({via.spec.name})", file=sys.stderr, flush=True)
                            results[label] = await asyncio.to_thread(measure, pod_ip, cluster_ip, args)
                            args.init = False  # pgbench -i once
                    await instances.close()
        finally:
            control_plane.stop()
    return results


def report(results: dict[str, dict[str, dict[str, list[float]]]], args: argparse.Namespace) -> None:
    print(f"| workload (-c {args.clients} -j {args.threads} -T {args.seconds}, scale {args.scale}; median of "
          f"{args.rounds}) | -rw routed through | direct to the primary, tps | through `-rw` (kube-proxy), tps "
          "| ratio |")  # fmt: skip
    print("|---|---|---|---|---|")
    summary: dict[str, Any] = {"bench": "real_service_proxy", "rounds": args.rounds, "seconds": args.seconds}
    for label, per_workload in results.items():
        for workload, name in (("select", "pgbench -S"), ("tpcb", "TPC-B (default script)")):
            direct = statistics.median(per_workload[workload]["direct"])
            through = statistics.median(per_workload[workload]["clusterip"])
            print(f"| {name} | {label} | {direct:,.0f} | {through:,.0f} | {through / direct:.2f}x |")
            summary[f"{workload} via {label}"] = {"direct": direct, "rw": through, "ratio": round(through / direct, 3)}
    print(json.dumps(summary))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pgbench_arguments(parser)
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds the cluster may take to be Ready")
    args = parser.parse_args()
    args.init = True
    report(asyncio.run(run(args)), args)


if __name__ == "__main__":
    main()
