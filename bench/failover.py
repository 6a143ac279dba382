"""Fault → first acknowledged write through ``-rw``, per fault kind, and switchover → first write (issue 12).

    python bench/failover.py [--runs 5] [--faults freeze,stop,partition,switchover] [--sync] [--real-nodes]
                             [--json FILE]

Starts the real control plane, three nodes and the operator (in this process, default settings), one
PostgresCluster of three instances (one per node, mode Async unless ``--sync``), and a ledger writing through ``-rw``
(the same client as the chaos tests: tests/e2e/ledger.py). Each run injects the fault on the primary's node, measures
the time until the new primary acknowledges a commit, recovers the node and waits until the old primary has rejoined
and the cluster is Ready again, then the next run. Prints every run, then the median and the maximum per kind. The
numbers go into docs/benchmarks.md with the command that produced them.

The nodes are the home-made node's (``kanri.local.node``: pods as host processes, the machine's kube-proxy) unless
``--real-nodes``: then three real nodes (kubelet, containerd, runc, kube-proxy; docs/real-nodes.md) run the built
``kanri-postgres-17`` image on local-path volumes, and the ledger on the host reaches ``-rw``'s ClusterIP through the
kube-proxy of a node other than the primary's (the route is moved before each run, as a load balancer would avoid a
node it is about to lose). Both use the machine's pod network: run under ``flock /tmp/kanri-e2e.lock``; real nodes
need ``make images``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, Protocol

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' ledger and node helpers

from kanri.local import ControlPlane, Endpoint
from kanri.local.imagemap import default_image_map
from kanri.local.node import NodeHost, NodeOptions
from kanri.local.realnode import RealCluster, RealNode
from kanri.local.realnode.addons.localpath import STORAGE_CLASS
from kanri.local.realnode.network import route_services, unroute_services
from kanri.postgres.children.images import ENV as POSTGRES_IMAGES_ENV
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.ha.failover import STARTING_GRACE, SWITCHOVER
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import ENDPOINT_SLICE, NAMESPACE, POD
from tests.e2e.ledger import Ledger
from tests.e2e.postgres_helpers import cluster, cluster_ip, credentials, ready
from tests.e2e.test_postgres_failover_e2e import NAME, failed_over_from, one_per_node, primary_and_node, rejoined
from tests.integration.realnode_support import coredns_on, environment, local_path_on, three_real_nodes
from tests.local_node_support import running_nodes, with_test_network
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

MAJOR = 15
"""The PostgreSQL major of the benchmarked cluster (the e2e tier's default; on real nodes its built image)."""

RECOVER = {"freeze": "thaw", "stop": "start", "partition": "heal"}


class Nodes(Protocol):
    """Where the cluster runs: the chaos verbs on a node by name, and what to do before each run."""

    async def inject(self, fault: str, node: str) -> None: ...

    async def recover(self, fault: str, node: str) -> None: ...

    async def before_run(self, primary_node: str) -> None: ...


class HomeMadeNodes:
    """The home-made node's host (``kanri.local.node``): chaos through the host; the machine's kube-proxy routes."""

    def __init__(self, host: NodeHost) -> None:
        self.host = host

    async def inject(self, fault: str, node: str) -> None:
        await self.host.chaos(fault, node)

    async def recover(self, fault: str, node: str) -> None:
        await self.host.chaos(RECOVER[fault], node)

    async def before_run(self, primary_node: str) -> None:
        return None


class RealNodes:
    """Three real nodes (:class:`kanri.local.realnode.RealCluster`): the chaos verbs of :class:`RealNode` (run in a
    thread: a stop or start blocks for seconds, and the ledger's timestamps must not wait on it); the host reaches
    the Services through a node other than the primary's."""

    def __init__(self, nodes: RealCluster, service_cidr: str) -> None:
        self.nodes = {node.spec.name: node for node in nodes.nodes}
        self.service_cidr = service_cidr

    async def inject(self, fault: str, node: str) -> None:
        verb = {"freeze": RealNode.freeze, "stop": RealNode.stop, "partition": RealNode.partition}[fault]
        await asyncio.to_thread(verb, self.nodes[node])

    async def recover(self, fault: str, node: str) -> None:
        verbs: dict[str, Callable[[RealNode], object]] = {"freeze": RealNode.thaw, "stop": RealNode.start,
                                                          "partition": RealNode.heal}  # fmt: skip
        verb = verbs[fault]
        await asyncio.to_thread(verb, self.nodes[node])

    async def before_run(self, primary_node: str) -> None:
        via = next(node for name, node in self.nodes.items() if name != primary_node)
        await asyncio.to_thread(route_services, self.service_cidr, via.spec)


async def one_run(client: Client, nodes: Nodes, namespace: str, ledger: Ledger, fault: str) -> dict[str, Any]:
    old, node, old_ip = await primary_and_node(client, namespace)
    await nodes.before_run(node)
    settled = time.monotonic()  # a moved route breaks the ledger's connection: acknowledged writes again first
    await eventually(lambda: asyncio.sleep(0, sum(a.at > settled for a in ledger.acks) >= 20 or None), timeout=60)
    began = time.monotonic()
    if fault == "switchover":
        target = next(i for i in (f"{NAME}-1", f"{NAME}-2", f"{NAME}-3") if i != old)
        await client.patch(POSTGRES_CLUSTER, NAME, {"metadata": {"annotations": {SWITCHOVER: target}}}, namespace)
    else:
        await nodes.inject(fault, node)
    timeline = await eventually(lambda: failover_timeline(client, namespace, old, began), timeout=120, interval=0.1)
    record = timeline.pop("record")
    first = await eventually(
        lambda: asyncio.sleep(0, next((a for a in ledger.acks if a.at > began and a.server != old_ip), None)),
        timeout=60,
        interval=0.1,
    )
    result = {"fault": fault, "seconds": round(first.at - began, 2), "promote_seconds": record.get("durationSeconds"),
              "from": old, "to": record["to"], **timeline}  # fmt: skip
    if fault != "switchover":
        await nodes.recover(fault, node)
        await eventually(lambda: rejoined(client, namespace, old), timeout=240, interval=1)
    else:
        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=240, interval=1)
    await asyncio.sleep(5)  # a steady state again before the next fault
    return result


class Timeline:
    """When the operator's side of a failover happened, seen from the API every 0.1 s (seconds after the fault):
    ``started`` (``status.failover`` appeared), ``done`` (``status.lastFailover`` names the new primary) and
    ``routed`` (``-rw``'s EndpointSlices list the new primary's address alone) — what is left to the first write is
    kube-proxy's and the client's."""

    def __init__(self) -> None:
        self.seen: dict[str, float] = {}

    def mark(self, what: str, began: float) -> None:
        self.seen.setdefault(what, round(time.monotonic() - began, 2))


TIMELINES: dict[float, Timeline] = {}


async def failover_timeline(client: Client, namespace: str, old: str, began: float) -> dict[str, Any] | None:
    """The run's :class:`Timeline` and the ``lastFailover`` record once ``-rw`` routes to the new primary alone."""
    timeline = TIMELINES.setdefault(began, Timeline())
    status = (await client.get(POSTGRES_CLUSTER, NAME, namespace)).get("status") or {}
    if status.get("failover"):
        timeline.mark("started", began)
    record = await failed_over_from(client, namespace, old)
    if record is None:
        return None
    timeline.mark("done", began)
    new_ip = (await client.get(POD, f"{record['to']}-0", namespace)).get("status", {}).get("podIP")
    slices, _ = await client.list(ENDPOINT_SLICE, namespace, label_selector=f"kubernetes.io/service-name={NAME}-rw")
    ready_ips = sorted(address for s in slices for e in s.get("endpoints") or []
                       if (e.get("conditions") or {}).get("ready", True) for address in e["addresses"])  # fmt: skip
    if ready_ips != [new_ip]:
        return None
    timeline.mark("routed", began)
    return {**TIMELINES.pop(began).seen, "record": record}


@contextlib.asynccontextmanager
async def home_made_nodes(endpoint: Endpoint, scratch: Path) -> AsyncIterator[tuple[Nodes, dict[str, Any]]]:
    """Three home-made nodes; the cluster's spec needs nothing more."""
    options = with_test_network(NodeOptions(data_dir=scratch / "nodes", name=f"bench-ha-{secrets.token_hex(2)}",
                                            images=default_image_map()))  # fmt: skip
    async with running_nodes(endpoint.kubeconfig, options, count=3) as host:
        yield HomeMadeNodes(host), {}


@contextlib.asynccontextmanager
async def real_nodes(endpoint: Endpoint, scratch: Path) -> AsyncIterator[tuple[Nodes, dict[str, Any]]]:
    """Three real nodes with CoreDNS and the local-path provisioner, the operator told the built image; the
    cluster's volumes from local-path."""
    image = f"kanri-postgres-{MAJOR}"
    cidr = str(json.loads((endpoint.kubeconfig.parent / "config.json").read_text())["serviceCIDR"])
    with contextlib.ExitStack() as stack:
        nodes = stack.enter_context(three_real_nodes(endpoint, scratch, "bf", image))
        stack.enter_context(coredns_on(nodes))
        stack.enter_context(local_path_on(nodes, scratch, image))
        ref = nodes.nodes[0].image(image).ref
        stack.enter_context(environment(POSTGRES_IMAGES_ENV, json.dumps({"postgres": {str(MAJOR): ref}})))
        stack.callback(unroute_services, cidr)
        yield RealNodes(nodes, cidr), {"storage": {"size": "1Gi", "storageClassName": STORAGE_CLASS}}


async def main(runs: int, faults: list[str], sync: bool, real: bool, output: Path | None) -> None:
    results: list[dict[str, Any]] = []
    # real nodes bind unix sockets deep inside their directories (at most 107 bytes): a short path
    with tempfile.TemporaryDirectory(prefix="kbf-" if real else "kanri-bench-failover-", dir="/var/tmp") as scratch:
        control_plane = ControlPlane(Path(scratch) / "controlplane")
        endpoint = control_plane.start(exit_with_parent=True)
        try:
            async with await Client.from_kubeconfig(str(endpoint.kubeconfig)) as client:
                await install_postgres_crd(client)
                namespace = f"bench-failover-{secrets.token_hex(3)}"
                await client.create(NAMESPACE, {"metadata": {"name": namespace}})
                placed = real_nodes if real else home_made_nodes
                async with placed(endpoint, Path(scratch)) as (nodes, extra):
                    instances = HttpInstanceClient()
                    operator = Operator(endpoint, namespace, instances=instances)
                    replication = {"mode": "Sync", "syncStandbys": 1} if sync else {"mode": "Async"}
                    spec = cluster(NAME, namespace, 3, version=MAJOR, replication=replication,
                                   podTemplate=one_per_node(), **extra)  # fmt: skip
                    await client.create(POSTGRES_CLUSTER, spec)
                    async with operator.running(refresh=10.0):
                        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=300, interval=1)
                        # a steady state: a primary whose container started less than STARTING_GRACE ago counts as
                        # restarting when silent (a longer window), which the first run would otherwise measure
                        await asyncio.sleep(STARTING_GRACE)
                        _, primary_node, _ = await primary_and_node(client, namespace)
                        await nodes.before_run(primary_node)
                        user, password = await credentials(client, namespace, NAME)
                        ledger = Ledger(await cluster_ip(client, namespace, f"{NAME}-rw"), user, password)
                        await eventually(lambda: prepared(ledger), timeout=60, interval=1)
                        writer = asyncio.create_task(ledger.run())
                        try:
                            for fault in faults:
                                for n in range(runs):
                                    result = await one_run(client, nodes, namespace, ledger, fault)
                                    results.append(result)
                                    print(f"{fault} run {n + 1}: {result['seconds']:.2f} s to the first write "
                                          f"(failover started {result.get('started')} s, done {result['done']} s, "
                                          f"-rw routed {result['routed']} s after the fault; promotion "
                                          f"{result['promote_seconds']} s)", flush=True)  # fmt: skip
                        finally:
                            ledger.stop()
                            await writer
                    await instances.close()
        finally:
            control_plane.stop()
    where = "real nodes" if real else "home-made nodes"
    print(f"\n{where}, mode {'Sync' if sync else 'Async'}")
    print("fault        runs  median  max   (seconds from the fault to the first write acknowledged through -rw)")
    for fault in faults:
        seconds = [r["seconds"] for r in results if r["fault"] == fault]
        if seconds:
            print(f"{fault:<12} {len(seconds):>4}  {statistics.median(seconds):6.2f}  {max(seconds):5.2f}")
    if output is not None:
        await asyncio.to_thread(output.write_text, json.dumps(results, indent=1))


async def prepared(ledger: Ledger) -> bool | None:
    """The ledger's table made (kube-proxy programs ``-rw`` a moment after Ready: until then, refused)."""
    try:
        await ledger.prepare()
    except psycopg.OperationalError:
        return None
    return True


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--faults", default="freeze,stop,partition,switchover")
    parser.add_argument("--sync", action="store_true", help="mode Sync (one synchronous standby) instead of Async")
    parser.add_argument("--real-nodes", action="store_true", help="three real nodes (docs/real-nodes.md)")
    parser.add_argument("--json", type=Path, default=None)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.runs, arguments.faults.split(","), arguments.sync, arguments.real_nodes,
                     arguments.json))  # fmt: skip
