"""Fault → first acknowledged write through ``-rw``, per fault kind, and switchover → first write (issue 12).

    python bench/failover.py [--runs 5] [--faults freeze,stop,partition,switchover] [--json FILE]

Starts the real control plane, a host of three local nodes and the operator (in this process, default settings),
one PostgresCluster of three instances (one per node, mode Async unless ``--sync``), and a ledger writing through
``-rw`` (the same client as the chaos tests: tests/e2e/ledger.py). Each run injects the fault on the primary's node,
measures the time until the new primary acknowledges a commit, recovers the node and waits until the old primary has
rejoined and the cluster is Ready again, then the next run. Prints every run, then the median and the maximum per kind.
The numbers go into docs/benchmarks.md with the command that produced them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' ledger and node helpers

from kanri.local import ControlPlane
from kanri.local.imagemap import default_image_map
from kanri.local.node import NodeHost, NodeOptions
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.ha.failover import SWITCHOVER
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import NAMESPACE
from tests.e2e.ledger import Ledger
from tests.e2e.postgres_helpers import cluster, cluster_ip, credentials, ready
from tests.e2e.test_postgres_failover_e2e import NAME, failed_over_from, one_per_node, primary_and_node, rejoined
from tests.local_node_support import running_nodes, with_test_network
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

RECOVER = {"freeze": "thaw", "stop": "start", "partition": "heal"}


async def one_run(client: Client, host: NodeHost, namespace: str, ledger: Ledger, fault: str) -> dict[str, Any]:
    old, node, old_ip = await primary_and_node(client, namespace)
    began = time.monotonic()
    if fault == "switchover":
        target = next(i for i in (f"{NAME}-1", f"{NAME}-2", f"{NAME}-3") if i != old)
        await client.patch(POSTGRES_CLUSTER, NAME, {"metadata": {"annotations": {SWITCHOVER: target}}}, namespace)
    else:
        await host.chaos(fault, node)
    record = await eventually(lambda: failed_over_from(client, namespace, old), timeout=120, interval=0.2)
    first = await eventually(
        lambda: asyncio.sleep(0, next((a for a in ledger.acks if a.at > began and a.server != old_ip), None)),
        timeout=60,
        interval=0.1,
    )
    result = {"fault": fault, "seconds": round(first.at - began, 2), "promote_seconds": record.get("durationSeconds"),
              "from": old, "to": record["to"]}  # fmt: skip
    if fault != "switchover":
        await host.chaos(RECOVER[fault], node)
        await eventually(lambda: rejoined(client, namespace, old), timeout=240, interval=1)
    else:
        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=240, interval=1)
    await asyncio.sleep(5)  # a steady state again before the next fault
    return result


async def main(runs: int, faults: list[str], sync: bool, output: Path | None) -> None:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kanri-bench-failover-", dir="/var/tmp") as scratch:
        control_plane = ControlPlane(Path(scratch) / "controlplane")
        endpoint = control_plane.start(exit_with_parent=True)
        try:
            async with await Client.from_kubeconfig(str(endpoint.kubeconfig)) as client:
                await install_postgres_crd(client)
                namespace = f"bench-failover-{secrets.token_hex(3)}"
                await client.create(NAMESPACE, {"metadata": {"name": namespace}})
                options = with_test_network(NodeOptions(data_dir=Path(scratch) / "nodes",
                                                        name=f"bench-ha-{secrets.token_hex(2)}",
                                                        images=default_image_map()))  # fmt: skip
                async with running_nodes(endpoint.kubeconfig, options, count=3) as host:
                    instances = HttpInstanceClient()
                    operator = Operator(endpoint, namespace, instances=instances)
                    replication = {"mode": "Sync", "syncStandbys": 1} if sync else {"mode": "Async"}
                    spec = cluster(NAME, namespace, 3, replication=replication, podTemplate=one_per_node())
                    await client.create(POSTGRES_CLUSTER, spec)
                    async with operator.running(refresh=10.0):
                        await eventually(lambda: ready(client, namespace, NAME, 3), timeout=300, interval=1)
                        user, password = await credentials(client, namespace, NAME)
                        ledger = Ledger(await cluster_ip(client, namespace, f"{NAME}-rw"), user, password)
                        await ledger.prepare()
                        writer = asyncio.create_task(ledger.run())
                        try:
                            for fault in faults:
                                for n in range(runs):
                                    result = await one_run(client, host, namespace, ledger, fault)
                                    results.append(result)
                                    print(f"{fault} run {n + 1}: {result['seconds']:.2f} s to the first write "
                                          f"(promotion {result['promote_seconds']} s after the failover started)",
                                          flush=True)  # fmt: skip
                        finally:
                            ledger.stop()
                            await writer
                    await instances.close()
        finally:
            control_plane.stop()
    print("\nfault        runs  median  max   (seconds from the fault to the first write acknowledged through -rw)")
    for fault in faults:
        seconds = [r["seconds"] for r in results if r["fault"] == fault]
        if seconds:
            print(f"{fault:<12} {len(seconds):>4}  {statistics.median(seconds):6.2f}  {max(seconds):5.2f}")
    if output is not None:
        await asyncio.to_thread(output.write_text, json.dumps(results, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--faults", default="freeze,stop,partition,switchover")
    parser.add_argument("--sync", action="store_true", help="mode Sync (one synchronous standby) instead of Async")
    parser.add_argument("--json", type=Path, default=None)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.runs, arguments.faults.split(","), arguments.sync, arguments.json))
