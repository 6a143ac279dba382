"""The write outage of a rolling update: the primary restarted in place vs a switchover first (issues 12 and 14).

    python bench/rolling_update.py [--runs 3] [--strategies InPlace,Switchover] [--change resources|minor] [--json F]

Starts the real control plane, one local node and the operator (in this process), one PostgresCluster of two
instances, and a ledger writing through ``-rw`` (tests/e2e/ledger.py). Each run sets ``spec.primaryUpdateStrategy``
and a change of the pod template — ``--change resources``: a new ``spec.resources``; ``--change minor``: a minor
update, ``spec.imageName`` from ``kanri.dev/postgres:17.10`` to ``:17.11`` and back on alternate runs (a version-17
cluster) — waits until both instances run the new template and the cluster is Ready, and reports the longest gap
between two acknowledged commits during the update (the outage as a client sees it, its reconnect included). Prints
every run, then the median and the maximum per strategy.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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
from kanri.local.node import NodeOptions
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import NAMESPACE, STATEFUL_SET
from tests.e2e.ledger import Ledger
from tests.e2e.postgres_helpers import cluster, cluster_ip, credentials, ready
from tests.local_node_support import running_node, with_test_network
from tests.postgres_support import Operator, install_postgres_crd
from tests.support import eventually

NAME = "roll"
MINOR_IMAGES = ("kanri.dev/postgres:17.11", "kanri.dev/postgres:17.10")
"""A minor update's run n goes to MINOR_IMAGES[n % 2] (the cluster starts on 17.10)."""


def change_of(kind: str, step: int) -> dict[str, Any]:
    """The pod-template change of run ``step`` (1, 2, ...): always a different one from the last."""
    if kind == "minor":
        return {"imageName": MINOR_IMAGES[(step - 1) % 2]}
    return {"resources": {"requests": {"cpu": f"{100 + step}m"}}}


async def has_the_change(client: Client, namespace: str, instance: str, change: dict[str, Any]) -> bool:
    container = (await client.get(STATEFUL_SET, instance, namespace))["spec"]["template"]["spec"]["containers"][0]
    if "imageName" in change:
        return bool(container["image"] == change["imageName"])
    cpu = ((container.get("resources") or {}).get("requests") or {}).get("cpu")
    return bool(cpu == change["resources"]["requests"]["cpu"])


async def one_run(
    client: Client, namespace: str, ledger: Ledger, strategy: str, change: dict[str, Any]
) -> dict[str, Any]:
    began = time.monotonic()
    patch = {"spec": {"primaryUpdateStrategy": strategy, **change}}
    await client.patch(POSTGRES_CLUSTER, NAME, patch, namespace)

    async def rolled() -> bool:
        for instance in (f"{NAME}-1", f"{NAME}-2"):
            if not await has_the_change(client, namespace, instance, change):
                return False
        return await ready(client, namespace, NAME, 2) is not None

    await eventually(rolled, timeout=300, interval=0.5)
    count = len(ledger.acks)
    await eventually(lambda: asyncio.sleep(0, len(ledger.acks) > count + 20 or None), timeout=60)
    acks = [a for a in ledger.acks if a.at >= began]
    gap = max((b.at - a.at for a, b in itertools.pairwise(acks)), default=0.0)
    status = (await client.get(POSTGRES_CLUSTER, NAME, namespace))["status"]
    return {"strategy": strategy, "change": change, "seconds": round(gap, 2), "primary": status.get("currentPrimary")}


async def main(runs: int, strategies: list[str], kind: str, output: Path | None) -> None:
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kanri-bench-rolling-", dir="/var/tmp") as scratch:
        control_plane = ControlPlane(Path(scratch) / "controlplane")
        endpoint = control_plane.start(exit_with_parent=True)
        try:
            async with await Client.from_kubeconfig(str(endpoint.kubeconfig)) as client:
                await install_postgres_crd(client)
                namespace = f"bench-rolling-{secrets.token_hex(3)}"
                await client.create(NAMESPACE, {"metadata": {"name": namespace}})
                options = with_test_network(NodeOptions(data_dir=Path(scratch) / "node",
                                                        name=f"bench-roll-{secrets.token_hex(2)}",
                                                        images=default_image_map()))  # fmt: skip
                async with running_node(endpoint.kubeconfig, options):
                    instances = HttpInstanceClient()
                    operator = Operator(endpoint, namespace, instances=instances)
                    extra = {"version": 17, "imageName": MINOR_IMAGES[1]} if kind == "minor" else {}
                    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 2, **extra))
                    async with operator.running(refresh=10.0):
                        await eventually(lambda: ready(client, namespace, NAME, 2), timeout=300, interval=1)
                        user, password = await credentials(client, namespace, NAME)
                        ledger = Ledger(await cluster_ip(client, namespace, f"{NAME}-rw"), user, password)
                        await ledger.prepare()
                        writer = asyncio.create_task(ledger.run())
                        try:
                            step = 0
                            for strategy in strategies:
                                for n in range(runs):
                                    step += 1
                                    change = change_of(kind, step)
                                    result = await one_run(client, namespace, ledger, strategy, change)
                                    results.append(result)
                                    print(f"{strategy} run {n + 1} ({change}): longest write gap "
                                          f"{result['seconds']:.2f} s", flush=True)  # fmt: skip
                        finally:
                            ledger.stop()
                            await writer
                    await instances.close()
        finally:
            control_plane.stop()
    print("\nstrategy     runs  median  max   (longest gap between acknowledged commits through -rw, seconds)")
    for strategy in strategies:
        seconds = [r["seconds"] for r in results if r["strategy"] == strategy]
        if seconds:
            print(f"{strategy:<12} {len(seconds):>4}  {statistics.median(seconds):6.2f}  {max(seconds):5.2f}")
    if output is not None:
        await asyncio.to_thread(output.write_text, json.dumps(results, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--strategies", default="InPlace,Switchover")
    parser.add_argument("--change", choices=("resources", "minor"), default="resources")
    parser.add_argument("--json", type=Path, default=None)
    arguments = parser.parse_args()
    asyncio.run(main(arguments.runs, arguments.strategies.split(","), arguments.change, arguments.json))
