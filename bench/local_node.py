"""Benchmark the local node: how fast a 10-replica Deployment becomes Ready, and what each pod costs the node.

    .venv/bin/python bench/local_node.py                # 5 rounds of 10 replicas
    .venv/bin/python bench/local_node.py --rounds 3 --replicas 20 --keep   # keep the logs

What runs is what ``kanri local up`` starts: the real control plane (:class:`kanri.local.ControlPlane`) on a scratch
data dir, and the local node as a detached process (:class:`kanri.local.nodeprocess.NodeProcess`, i.e.
``python -m kanri.local.node``) with the generated image map — only its bridge, namespace prefix, pod range and DNS
address are the benchmark's own (``NETWORK``), so a developer's cluster on the same machine is left alone. The
benchmark waits until no other local node runs. Both processes are stopped at the end, even on error, and
``find_leftovers`` must then find nothing (no namespace, link, mount or container process).

Measured, per round (the Deployment is applied server-side, then deleted and its pods awaited gone):

- **apply → all pods Ready**, polling the pods every 0.1 s, with the breakdown apply → all created (the ReplicaSet
  controller's slow-start batches), → all scheduled (``PodScheduled``), → all ``Running``, → all ``Ready`` (the
  readiness probe, ``tcpSocket`` every second, has passed). The pods run ``kanri.dev/postgres:15`` with the command
  replaced by ``python3 -m http.server 8080`` as uid 26: the real launcher, namespaces and probe path, with a
  program that listens within a fraction of a second, so the node's own latency is what shows.
- **CPU of the node process** during the rollout (``utime + stime`` of ``/proc/<pid>/stat``), plus the CPU of the
  children it has reaped meanwhile (``cutime + cstime``: the ``ip`` commands that build each pod's network).

And, with the pods Ready (after ``--settle`` seconds) and again once they are gone: the node's **memory overhead per
pod** — the node process's ``VmRSS`` with 0 pods vs with N Ready pods, divided by N — apart from the **workload**
(RSS and PSS of the container processes themselves, which a real cluster would pay too), and the **kernel objects
per pod** (network namespaces, host-side veths on the bridge, mount and UTS namespaces of the container processes),
counted rather than sized.

Why: the local node is the development cluster's kubelet, scheduler and kube-proxy in one Python process next to
the control plane on a 2-core machine; a rollout must feel immediate and pods must be cheap enough to run a few
PostgreSQL clusters at once. Prints a Markdown table and one JSON line; record them in docs/benchmarks.md with the
command that produced them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _localcluster import (
    BenchNodeProcess,
    Cpu,
    Network,
    check_machine,
    cpu,
    local_cluster,
    proc_kib,
    rss_kib,
    sigterm_as_exit,
)
from kanri.local import controlplane_binary
from kanri.local.node.sessions import container_processes
from kanri.runtime import Client, Kind

DEPLOYMENT = Kind("apps/v1", "Deployment", "deployments")
POD = Kind("v1", "Pod", "pods")
NAMESPACE = "default"
NAME = "bench-http"
FIELD_MANAGER = "bench-local-node"
POLL = 0.1

Obj = dict[str, Any]


def deployment(replicas: int) -> Obj:
    labels = {"app": NAME}
    container: Obj = {
        "name": "http",
        "image": "kanri.dev/postgres:15",
        "command": ["/usr/bin/python3", "-m", "http.server", "8080"],
        "ports": [{"containerPort": 8080, "name": "http"}],
        "securityContext": {"runAsUser": 26},
        "readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1},
    }
    return {
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"terminationGracePeriodSeconds": 2, "containers": [container]},
            },
        },
    }


# --- /proc readings ------------------------------------------------------------------------------------------------


def pss_kib(pid: int) -> int:
    return proc_kib(pid, "smaps_rollup", "Pss")


def namespace_ids(pids: list[int], kind: str) -> set[str]:
    ids = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            ids.add(os.readlink(f"/proc/{pid}/ns/{kind}"))
    return ids


def bridge_veths(bridge: str) -> int:
    out = subprocess.run(
        ["ip", "-o", "link", "show", "master", bridge, "type", "veth"], capture_output=True, text=True, check=False
    ).stdout
    return len(out.splitlines())


NETWORK: Network = {
    "bridge": "kbench0",
    "service_link": "kbench-svc",
    "netns_prefix": "kbench-",
    "pod_cidr": "10.247.0.0/16",
    "internal_ip": "10.247.0.1",
    "cluster_dns_ip": "10.96.255.53",
}
"""The node's network names and addresses, apart from the defaults (see :data:`Network`) — so the benchmark's node
would not break a developer's ``kanri local up`` (or be broken by it) on the same machine. The node's code is the same;
only these names differ."""

# --- rounds --------------------------------------------------------------------------------------------------------


def condition_true(pod: Obj, kind: str) -> bool:
    return any(
        c.get("type") == kind and c.get("status") == "True" for c in (pod.get("status") or {}).get("conditions") or []
    )


STAGES = ("created", "scheduled", "running", "ready")


def stage(pod: Obj) -> int:
    """How far the pod got, as an index into STAGES."""
    if condition_true(pod, "Ready"):
        return 3
    if (pod.get("status") or {}).get("phase") == "Running":
        return 2
    return 1 if condition_true(pod, "PodScheduled") else 0


@dataclass
class Round:
    """Seconds from the apply until every pod (``all``) and the first pod (``first``) reached each of STAGES."""

    all: dict[str, float] = field(default_factory=dict)
    first: dict[str, float] = field(default_factory=dict)
    deleted: float = 0.0
    node_cpu: Cpu = field(default_factory=lambda: Cpu(0.0, 0.0))
    control_plane_cpu: float = 0.0
    load: float = 0.0


async def pods(client: Client) -> list[Obj]:
    items, _ = await client.list(POD, NAMESPACE, label_selector=f"app={NAME}")
    return items


async def rollout(client: Client, replicas: int, node_pid: int, cp_pid: int, timeout: float) -> Round:
    """Apply the Deployment and poll until ``replicas`` pods are Ready; a stage passed between two polls counts as
    passed at the later one."""
    result = Round(load=os.getloadavg()[0])
    seen: dict[str, dict[str, float]] = {}  # pod uid -> stage -> first seen
    node_before, cp_before = cpu(node_pid), cpu(cp_pid)
    started = time.monotonic()
    await client.apply(DEPLOYMENT, deployment(replicas), field_manager=FIELD_MANAGER)
    while True:
        now = time.monotonic() - started
        live = [p for p in await pods(client) if not p["metadata"].get("deletionTimestamp")]
        for pod in live:
            times = seen.setdefault(pod["metadata"]["uid"], {})
            for name in STAGES[: stage(pod) + 1]:
                times.setdefault(name, now)
        if len(live) == replicas and all(stage(p) == 3 for p in live):
            break
        if now > timeout:
            raise TimeoutError(f"pods not Ready within {timeout:.0f}s: {summarize(live)}")
        await asyncio.sleep(POLL)
    result.node_cpu = cpu(node_pid) - node_before
    result.control_plane_cpu = (cpu(cp_pid) - cp_before).own
    final = [seen[p["metadata"]["uid"]] for p in live]
    for name in STAGES:
        result.all[name] = max(times[name] for times in final)
        result.first[name] = min(times[name] for times in final)
    return result


def summarize(items: list[Obj]) -> str:
    phases: dict[str, int] = {}
    for p in items:
        phase = (p.get("status") or {}).get("phase", "?")
        ready = "ready" if condition_true(p, "Ready") else "unready"
        phases[f"{phase}/{ready}"] = phases.get(f"{phase}/{ready}", 0) + 1
    return ", ".join(f"{n} {k}" for k, n in sorted(phases.items())) or "no pods"


async def teardown(client: Client, timeout: float) -> float:
    """Delete the Deployment (background propagation) and wait until its pods are gone; the seconds it took."""
    started = time.monotonic()
    await client.delete(DEPLOYMENT, NAME, NAMESPACE, propagation_policy="Background")
    while await pods(client):
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"pods still there after {timeout:.0f}s: {summarize(await pods(client))}")
        await asyncio.sleep(POLL)
    return time.monotonic() - started


@dataclass
class Footprint:
    """The node with N Ready pods."""

    node_rss_kib: int
    container_pids: list[int]
    workload_rss_kib: int
    workload_pss_kib: int
    netns: int
    veths: int
    mount_ns: int
    uts_ns: int


def footprint(node_pid: int, node_dir: Path, bridge: str) -> Footprint:
    pids = container_processes(node_dir)
    return Footprint(
        node_rss_kib=rss_kib(node_pid),
        container_pids=pids,
        workload_rss_kib=sum(rss_kib(p) for p in pids),
        workload_pss_kib=sum(pss_kib(p) for p in pids),
        netns=len(namespace_ids(pids, "net")),
        veths=bridge_veths(bridge),
        mount_ns=len(namespace_ids(pids, "mnt")),
        uts_ns=len(namespace_ids(pids, "uts")),
    )


@dataclass
class Results:
    rounds: list[Round] = field(default_factory=list)
    rss_idle_kib: int = 0
    rss_after_kib: list[int] = field(default_factory=list)
    """Node RSS after each round's pods are gone."""
    full: list[Footprint] = field(default_factory=list)
    """Per round, with every pod Ready (after ``settle`` seconds)."""


async def measure(kubeconfig: Path, node: BenchNodeProcess, cp_pid: int, args: argparse.Namespace) -> Results:
    node_pid = node.running_pid()
    if node_pid is None:
        raise RuntimeError(f"the local node is not running\n{node.log_tail()}")
    bridge = node.options().bridge
    results = Results()
    async with await Client.from_kubeconfig(str(kubeconfig)) as client:
        await asyncio.sleep(args.settle)
        results.rss_idle_kib = rss_kib(node_pid)
        for number in range(1, args.rounds + 1):
            result = await rollout(client, args.replicas, node_pid, cp_pid, args.timeout)
            await asyncio.sleep(args.settle)
            results.full.append(footprint(node_pid, node.node_dir, bridge))
            result.deleted = await teardown(client, args.timeout)
            await asyncio.sleep(args.settle)
            results.rss_after_kib.append(rss_kib(node_pid))
            results.rounds.append(result)
            print(
                f"round {number}: all "
                + ", ".join(f"{name} {result.all[name]:.2f} s" for name in STAGES)
                + "; first "
                + ", ".join(f"{name} {result.first[name]:.2f} s" for name in STAGES)
                + f"; pods gone {result.deleted:.2f} s after delete (load {result.load:.2f})",
                file=sys.stderr,
                flush=True,
            )
    return results


# --- reporting -----------------------------------------------------------------------------------------------------


def spread(values: list[float], unit: str = "s", digits: int = 2) -> str:
    inner = ", ".join(f"{v:.{digits}f}" for v in values)
    return f"median {statistics.median(values):.{digits}f} {unit}, max {max(values):.{digits}f} {unit} ({inner})"


def mib(kib: float) -> str:
    return f"{kib / 1024:.1f} MiB"


def report(results: Results, replicas: int, startup: dict[str, float]) -> None:
    rounds, n = results.rounds, replicas
    first, last = results.full[0], results.full[-1]
    per_pod_first = (first.node_rss_kib - results.rss_idle_kib) / n
    # Steady state: N pods in the last round against 0 pods just before it (after an earlier round's pods left).
    before_last = results.rss_after_kib[-2] if len(results.rss_after_kib) > 1 else results.rss_idle_kib
    per_pod_steady = (last.node_rss_kib - before_last) / n
    cpu_own = [r.node_cpu.own for r in rounds]
    cpu_children = [r.node_cpu.children for r in rounds]
    rows = [
        ("control plane: first start to ready (new data dir)", f"{startup['control_plane']:.1f} s"),
        ("local node: start to ready (`python -m kanri.local.node`)", f"{startup['node']:.1f} s"),
        (f"apply → all {n} pods Ready ({len(rounds)} rounds)", spread([r.all["ready"] for r in rounds])),
        ("  apply → all created (ReplicaSet controller)", spread([r.all["created"] for r in rounds])),
        ("  apply → all scheduled (`PodScheduled`)", spread([r.all["scheduled"] for r in rounds])),
        ("  apply → all `Running` (processes started)", spread([r.all["running"] for r in rounds])),
        ("apply → first pod created", spread([r.first["created"] for r in rounds])),
        ("apply → first pod scheduled", spread([r.first["scheduled"] for r in rounds])),
        ("apply → first pod `Running`", spread([r.first["running"] for r in rounds])),
        ("apply → first pod Ready", spread([r.first["ready"] for r in rounds])),
        ("delete Deployment → all pods gone (grace 2 s)", spread([r.deleted for r in rounds])),
        ("node CPU during a rollout (utime+stime)", spread(cpu_own)),
        ("  per pod", spread([c / n for c in cpu_own], "s", 3)),
        ("  reaped children's CPU meanwhile (`ip` commands)", spread(cpu_children)),
        ("control-plane CPU during a rollout", spread([r.control_plane_cpu for r in rounds])),
        ("1-min load average as each round started", ", ".join(f"{r.load:.2f}" for r in rounds)),
        ("node RSS, 0 pods (fresh, idle)", mib(results.rss_idle_kib)),
        (f"node RSS, {n} Ready pods (first round)", mib(first.node_rss_kib)),
        ("node RSS, 0 pods after each round", ", ".join(mib(k) for k in results.rss_after_kib)),
        (f"node RSS, {n} Ready pods (each round)", ", ".join(mib(f.node_rss_kib) for f in results.full)),
        ("node RSS overhead per pod, first round (vs fresh)", mib(per_pod_first)),
        ("node RSS overhead per pod, last round (vs 0 pods before it)", mib(per_pod_steady)),
        (f"workload: container processes with {n} pods", f"{len(last.container_pids)}"),
        (
            f"workload: their RSS / PSS, total for {n} pods",
            f"{mib(last.workload_rss_kib)} / {mib(last.workload_pss_kib)}",
        ),
        ("workload: RSS / PSS per pod", f"{mib(last.workload_rss_kib / n)} / {mib(last.workload_pss_kib / n)}"),
        (
            f"kernel objects with {n} pods: netns / host veths on the bridge / mount ns / UTS ns",
            f"{last.netns} / {last.veths} / {last.mount_ns} / {last.uts_ns}",
        ),
    ]
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    summary = {
        "replicas": n,
        "rounds": [
            {
                "all": {k: round(v, 3) for k, v in r.all.items()},
                "first": {k: round(v, 3) for k, v in r.first.items()},
                "deleted": round(r.deleted, 3),
                "node_cpu": round(r.node_cpu.own, 3),
                "node_children_cpu": round(r.node_cpu.children, 3),
                "control_plane_cpu": round(r.control_plane_cpu, 3),
                "load": round(r.load, 2),
            }
            for r in rounds
        ],
        "ready_median": round(statistics.median(r.all["ready"] for r in rounds), 3),
        "ready_max": round(max(r.all["ready"] for r in rounds), 3),
        "node_rss_idle_kib": results.rss_idle_kib,
        "node_rss_full_kib": [f.node_rss_kib for f in results.full],
        "node_rss_after_kib": results.rss_after_kib,
        "node_rss_per_pod_first_kib": round(per_pod_first),
        "node_rss_per_pod_steady_kib": round(per_pod_steady),
        "workload_rss_kib": last.workload_rss_kib,
        "workload_pss_kib": last.workload_pss_kib,
        "container_processes": len(last.container_pids),
        "netns": last.netns,
        "veths": last.veths,
        "mount_ns": last.mount_ns,
        "uts_ns": last.uts_ns,
        **{f"{k}_start": round(v, 2) for k, v in startup.items()},
    }
    print(json.dumps(summary))


# --- main ----------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5, help="rollouts to time")
    parser.add_argument("--replicas", type=int, default=10, help="replicas of the Deployment")
    parser.add_argument("--settle", type=float, default=3.0, help="seconds to idle before each RSS reading")
    parser.add_argument("--wait", type=float, default=600.0, help="seconds to wait for another local node to stop")
    parser.add_argument("--keep", action="store_true", help="keep the scratch dir (logs) and print its path")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a rollout or teardown may take")
    args = parser.parse_args()

    check_machine(NETWORK, args.wait)

    binary = controlplane_binary()
    scratch = Path(tempfile.mkdtemp(prefix="kanri-bench-node-"))
    try:
        with sigterm_as_exit(), local_cluster(scratch / "cluster", binary, NETWORK, args.wait) as cluster:
            results = asyncio.run(measure(cluster.kubeconfig, cluster.node, cluster.control_plane_pid, args))
    finally:
        if args.keep:
            print(f"kept {scratch} (node.log, controlplane.log)", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    cluster.require_clean()
    report(results, args.replicas, cluster.startup)


if __name__ == "__main__":
    main()
