"""Fault → writes confirmed again, for a Durable 3-pod Cache on the local cluster (issue 31; the anchor is Sentinel's
own 2.3 s failover, quorum 2, down-after 1000 ms).

    flock /tmp/kanri-e2e.lock python bench/cache_faults.py [--runs 5] [--faults kill,stop,freeze,partition]

Starts the real control plane, a host of three local nodes (the e2e tier's pod network: hold the e2e lock) and the
Cache operator in this process, then one Durable Cache of three pods, one per node (the chaos e2e's spec:
down-after 1000 ms, ``maxReplicaLagSeconds`` 2). Two ledger clients write throughout, each recording the writes
``WAIT 1`` confirmed:

- ``pods``: the chaos e2e's ledger (tests/e2e/test_cache_chaos_e2e.py) — it finds the writable primary by asking
  every pod's ``INFO replication`` and writes straight to that pod's IP (what a Sentinel-aware client gets, minus
  asking Sentinel);
- ``-rw``: writes through the ``<name>-rw`` ClusterIP Service, which follows a failover once the operator relabels
  the pods.

Each run injects the fault on the primary (``kill``: its ``valkey`` container's server SIGKILLed; ``stop``,
``freeze``, ``partition``: the local cluster's chaos verb on its node, the operator running throughout), measures
from the start of the fault to the first write each client gets confirmed afterwards, and the write gap (the last
confirmed write before the fault to the first after it); recovers the node, waits until the cache has converged
(one writable primary, both replicas linked, every Sentinel knowing both), and checks that each client's confirmed
writes are all on the primary (0 lost) and that no two pods accepted writes at once. Prints every run, then the
median and the maximum per fault. Records go into docs/benchmarks.md with the command.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import functools
import itertools
import os
import secrets
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' cache workload and node helpers

import valkey.asyncio as valkey
from valkey.exceptions import ValkeyError

from kanri.cache.api import KIND, Cache
from kanri.local import ControlPlane
from kanri.local.imagemap import default_image_map
from kanri.local.node import NodeHost, NodeOptions
from kanri.runtime import Client, configure_logging, install_crd
from kanri.runtime.kinds import NAMESPACE, POD, SERVICE
from tests.e2e.test_cache_chaos_e2e import NAME, SPEC, Operator, Workload, converged, primary_pod, story
from tests.e2e.test_cache_e2e import Pods, ready
from tests.local_node_support import init_pid, running_nodes, with_test_network
from tests.support import NotYet, eventually

SLOW = 10.0
"""A move slower than this (seconds) prints the agents' and Sentinels' story, to see where the time went."""
RECOVER = {"stop": "start", "freeze": "thaw", "partition": "heal"}


@dataclass
class ServiceLedger:
    """Writes ``rw:<n>`` through one address (the ``-rw`` ClusterIP) with ``WAIT 1``; records the confirmed ones."""

    address: str
    password: str
    acked: list[int] = field(default_factory=list)
    acked_at: list[float] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        sequence, conn = 0, None
        while not self.stop.is_set():
            if conn is None:
                conn = valkey.Valkey(host=self.address, port=6379, password=self.password, socket_timeout=1.0,
                                     socket_connect_timeout=1.0, decode_responses=True)  # fmt: skip
            try:
                await conn.set(f"rw:{sequence}", sequence)
                sequence += 1
                if int(await conn.execute_command("WAIT", 1, 500)) >= 1:  # type: ignore[no-untyped-call]
                    self.acked.append(sequence - 1)
                    self.acked_at.append(time.monotonic())
            except (ValkeyError, OSError):  # READONLY on a demoted pod, a refused or cut connection
                await conn.aclose()
                conn = None
                await asyncio.sleep(0.05)
        if conn is not None:
            await conn.aclose()


def first_after(times: list[float], moment: float) -> float | None:
    index = bisect.bisect_right(times, moment)
    return times[index] if index < len(times) else None


async def confirmed_after(times: list[float], moment: float) -> float | None:
    return first_after(times, moment)


def longest_pause(times: list[float], began: float, until: float) -> float | None:
    """The longest time without a confirmed write from the last one before ``began`` until ``until`` (None: no write
    confirmed after ``began`` by then) — how long the fault kept this client from writing."""
    index = bisect.bisect_right(times, began)
    window = times[max(index - 1, 0) : bisect.bisect_right(times, until)]
    if index == 0 or len(window) < 2 or window[-1] <= began:
        return None
    # A pause still going on at ``until`` counts up to ``until``.
    return max(until - window[-1], *(later - earlier for earlier, later in itertools.pairwise(window)))


async def moved_from(workload: Workload, old_ip: str, began: float) -> float | None:
    """When the ledger first had a write confirmed by a pod other than ``old_ip`` after ``began`` (None: not yet)."""
    index = bisect.bisect_right(workload.acked_at, began)
    return next((at for at, ip in zip(workload.acked_at[index:], workload.acked_on[index:], strict=True)
                 if ip != old_ip), None)  # fmt: skip


ELECTION = ("+try-failover", "+elected-leader", "-failover-abort-not-elected", "+vote-for-leader", "+switch-master")


def sentinel_logs(root: Path) -> dict[Path, int]:
    """Every Sentinel container's log under ``root`` (the nodes' data) and its size now."""
    return {path: path.stat().st_size for path in root.rglob("pods/*/sentinel/*.log")}


def election(root: Path, since: dict[Path, int]) -> dict[str, int]:
    """How often each step of Sentinel's leader election appears in the Sentinels' logs after ``since``."""
    counts = dict.fromkeys(ELECTION, 0)
    for path in root.rglob("pods/*/sentinel/*.log"):
        with path.open("rb") as log:
            log.seek(since.get(path, 0))
            for line in log.read().decode(errors="replace").splitlines():
                for mark in ELECTION:
                    counts[mark] += f" {mark} " in f" {line} "
    return counts


async def lost(pods: Pods, primary: str, keys: list[str]) -> int:
    """How many of ``keys`` the primary at ``primary`` lacks."""
    conn = pods.connect(primary)
    try:
        present = 0
        for start in range(0, len(keys), 1000):
            present += int(await conn.exists(*keys[start : start + 1000]))
        return len(keys) - present
    finally:
        await conn.aclose()


LOSSES: dict[int, int] = {}
"""Per workload (``id``): the ``pods`` client's confirmed writes found lost so far (each loss reported once)."""


def reported_losses(workload: Workload) -> int:
    return LOSSES.get(id(workload), 0)


async def report_losses(workload: Workload, primary: str, began: float, nodes: Path) -> None:
    """Print which confirmed writes the primary lacks: when (from the fault) and by which pod each was confirmed,
    and the agents' and Sentinels' story from the container logs — what a fix needs to know."""
    conn = workload.pods.connect(primary)
    found: list[bool] = []
    try:
        for start in range(0, len(workload.acked), 1000):
            async with conn.pipeline(transaction=False) as pipe:
                for n in workload.acked[start : start + 1000]:
                    pipe.exists(f"ledger:{n}")
                found += [bool(x) for x in await pipe.execute()]
    finally:
        await conn.aclose()
    gone = [i for i, present in enumerate(found) if not present]
    LOSSES[id(workload)] = len(gone)
    wall = time.strftime("%H:%M:%S", time.gmtime(time.time() - (time.monotonic() - began)))
    print(f"LOST {len(gone)} confirmed writes; the fault began at {wall} UTC")
    for i in gone[:3] + gone[-3:]:
        at = workload.acked_at[i] - began
        print(f"  ledger:{workload.acked[i]} confirmed by {workload.acked_on[i]} at {at:+.3f} s from the fault")
    print(story(nodes, 0))


@dataclass
class Run:
    fault: str
    pod: str
    """The primary's pod when the fault began."""
    moved: float | None
    """From the start of the fault to the first write another pod confirmed (the ``pods`` client; None: never)."""
    pause: dict[str, float | None]
    """Per client (``pods``, ``-rw``): the longest time without a confirmed write, from the last one before the
    fault until the recovery began (None: no write confirmed after the fault by then)."""
    lost: dict[str, int]
    """Per client: confirmed writes missing on the primary after this run that were not missing before it."""
    confirmed: dict[str, int]
    most_writable: int
    writers: list[str] = field(default_factory=list)
    election: dict[str, int] = field(default_factory=dict)
    """Sentinel's election steps logged (all Sentinels) from the fault until the recovery."""
    """The pod IPs that confirmed the ``pods`` client's writes from the fault until the recovery, in order."""


async def one_run(client: Client, host: NodeHost, namespace: str, workload: Workload, rw: ServiceLedger,
                  fault: str) -> Run:  # fmt: skip
    pod, node = await primary_pod(workload, client, namespace)
    old_ip = (await workload.pods.ips())[pod]
    logs = sentinel_logs(host.options.data_dir)
    began = time.monotonic()
    if fault == "kill":
        pid = init_pid(host.node(node), namespace, pod, container="valkey")
        assert pid is not None, f"no valkey container running in {pod}"
        os.kill(pid, signal.SIGKILL)
    else:
        assert await host.chaos(fault, node)
    with contextlib.suppress(NotYet):  # a fault that never moves the primary is reported ("never"), not fatal
        await eventually(functools.partial(moved_from, workload, old_ip, began), timeout=90, interval=0.05)
    moved = await moved_from(workload, old_ip, began)
    with contextlib.suppress(NotYet):  # -rw follows once the new primary's agent has relabelled its pod
        await eventually(functools.partial(confirmed_after, rw.acked_at, moved or began), timeout=30, interval=0.05)
    recovering = time.monotonic()
    steps = election(host.options.data_dir, logs)
    if moved is None or moved - began > SLOW:
        wall = time.strftime("%H:%M:%S", time.gmtime(time.time() - (recovering - began)))
        print(f"SLOW {fault} of {pod} ({old_ip}) at {wall} UTC:\n{story(host.options.data_dir, 0)}", flush=True)
    if fault in RECOVER:
        assert await host.chaos(RECOVER[fault], node)
    try:
        await eventually(lambda: converged(workload), timeout=180, interval=0.5)
    except NotYet as exc:
        raise SystemExit(f"{fault}: the cache never converged after the recovery; last seen: {workload.seen}") from exc
    counts = {"pods": len(workload.acked), "-rw": len(rw.acked)}
    with contextlib.suppress(NotYet):
        await eventually(lambda: asyncio.sleep(0, len(rw.acked) > counts["-rw"] + 50 or None), timeout=60)
    await eventually(lambda: asyncio.sleep(0, len(workload.acked) > counts["pods"] + 50 or None), timeout=60)
    primary = await workload.primary()
    assert primary is not None
    missing = {"pods": await lost(workload.pods, primary, [f"ledger:{n}" for n in workload.acked]),
               "-rw": await lost(workload.pods, primary, [f"rw:{n}" for n in rw.acked])}  # fmt: skip
    confirmed = {"pods": len(workload.acked), "-rw": len(rw.acked)}
    if missing["pods"] > reported_losses(workload):
        await report_losses(workload, primary, began, host.options.data_dir)
    pause = {"pods": longest_pause(workload.acked_at, began, recovering),
             "-rw": longest_pause(rw.acked_at, began, recovering)}  # fmt: skip
    window = slice(bisect.bisect_right(workload.acked_at, began), bisect.bisect_right(workload.acked_at, recovering))
    writers = list(dict.fromkeys(workload.acked_on[window]))
    return Run(fault, pod, None if moved is None else moved - began, pause, missing, confirmed,
               workload.most_writable_since(began), writers, steps)  # fmt: skip


def describe(run: Run, number: int) -> str:
    def secs(value: float | None) -> str:
        return "never" if value is None else f"{value:.2f} s"

    parts = [f"{name}: longest pause {secs(run.pause[name])}, {run.lost[name]} of {run.confirmed[name]} confirmed "
             "lost" for name in ("pods", "-rw")]  # fmt: skip
    return (f"{run.fault} run {number} ({run.pod}): another pod confirmed a write after {secs(run.moved)}; "
            + "; ".join(parts) + f"; most writable primaries {run.most_writable}; "
            f"confirmed by {run.writers}; Sentinel log {run.election}")  # fmt: skip


def summary(runs: list[Run], fault: str) -> str:
    """One table line per fault: runs; median and max of the move to another pod and of each client's pause."""

    def stats(values: list[float | None]) -> str:
        known = [v for v in values if v is not None]
        never = len(values) - len(known)
        text = f"{statistics.median(known):6.2f} {max(known):6.2f}" if known else "     -      -"
        return text + (f" ({never} never)" if never else "")

    mine = [r for r in runs if r.fault == fault]
    return (f"{fault:<10} {len(mine):>4}  {stats([r.moved for r in mine])}  "
            f"{stats([r.pause['pods'] for r in mine])}  {stats([r.pause['-rw'] for r in mine])}  "
            f"{sum(sum(r.lost.values()) for r in mine):>4}  {max(r.most_writable for r in mine):>2}")  # fmt: skip


@contextlib.asynccontextmanager
async def cache_cluster(prefix: str) -> AsyncIterator[tuple[Client, NodeHost, str]]:
    """A fresh control plane, three local nodes on the e2e tier's pod network and the Cache operator (in this
    process) watching a new namespace; everything stopped and removed at exit."""
    with tempfile.TemporaryDirectory(prefix=f"kanri-bench-{prefix}-", dir="/var/tmp") as scratch:
        control_plane = ControlPlane(Path(scratch) / "controlplane")
        endpoint = control_plane.start(exit_with_parent=True)
        try:
            async with await Client.from_kubeconfig(str(endpoint.kubeconfig)) as client:
                await install_crd(client, Cache, field_manager="kanri-bench")
                namespace = f"bench-{prefix}-{secrets.token_hex(3)}"
                await client.create(NAMESPACE, {"metadata": {"name": namespace}})
                options = with_test_network(NodeOptions(data_dir=Path(scratch) / "nodes",
                                                        name=f"bench-{prefix}-{secrets.token_hex(2)}",
                                                        images=default_image_map(), restart_backoff_base=0.5,
                                                        restart_backoff_max=2.0))  # fmt: skip
                async with running_nodes(endpoint.kubeconfig, options, count=3) as host:
                    operator = Operator(client, namespace)
                    operator.start()
                    try:
                        yield client, host, namespace
                    finally:
                        await operator.stop()
        finally:
            control_plane.stop()


async def create_cache(client: Client, namespace: str, spec: dict[str, Any]) -> Pods:
    """The Cache ``bench`` created and Ready, one pod per node; its pods (password loaded)."""
    await client.create(KIND, {"metadata": {"name": NAME, "namespace": namespace}, "spec": spec})
    await eventually(lambda: ready(client, namespace, NAME), timeout=240, interval=1)
    pods = Pods(client, namespace, NAME)
    await pods.load_password()
    listed, _ = await client.list(POD, namespace, label_selector=f"cache.kanri.dev/cache={NAME}")
    assert len({p["spec"]["nodeName"] for p in listed}) == 3, "one pod per node"
    return pods


def run_until_terminated(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main``; SIGTERM or SIGINT cancel it, so the cluster's clean-up runs (nodes, network, control plane)."""

    async def guarded() -> None:
        task = asyncio.ensure_future(main)
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, task.cancel)
        await task

    configure_logging("warning", json=False)  # the operator's and nodes' debug lines would drown the numbers
    asyncio.run(guarded())


async def main(runs: int, faults: list[str]) -> None:
    results: list[Run] = []
    async with cache_cluster("cache") as (client, host, namespace):
        await measure(client, host, namespace, runs, faults, results)
    print("\nfault      runs  moved: med    max  pods pause: med  max  -rw pause: med  max  lost  most-writable")
    for fault in faults:
        print(summary(results, fault))


async def measure(client: Client, host: NodeHost, namespace: str, runs: int, faults: list[str],
                  results: list[Run]) -> None:  # fmt: skip
    pods = await create_cache(client, namespace, SPEC)
    rw_ip = str((await client.get(SERVICE, f"{NAME}-rw", namespace))["spec"]["clusterIP"])
    workload = Workload(pods, ro="")
    rw = ServiceLedger(rw_ip, pods.password)
    try:
        await eventually(lambda: converged(workload), timeout=120, interval=1)
    except NotYet as exc:
        raise SystemExit(f"the new cache never converged; last seen: {workload.seen}") from exc
    tasks = [asyncio.create_task(t) for t in (workload.write(), workload.watch(), rw.run())]
    try:
        await eventually(lambda: asyncio.sleep(0, (len(rw.acked) > 100 and len(workload.acked) > 100) or None),
                         timeout=60)  # fmt: skip
        lost_before: dict[str, int] = {}
        for fault in faults:
            for number in range(1, runs + 1):
                run = await one_run(client, host, namespace, workload, rw, fault)
                so_far = dict(run.lost)  # missing among every write confirmed since the start
                run.lost = {name: count - lost_before.get(name, 0) for name, count in so_far.items()}
                lost_before = so_far
                results.append(run)
                print(describe(run, number), flush=True)
                await asyncio.sleep(2)  # steady writes on the converged cache before the next fault
    finally:
        workload.stop.set()
        rw.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--faults", default="kill,stop,freeze,partition")
    arguments = parser.parse_args()
    run_until_terminated(main(arguments.runs, arguments.faults.split(",")))
