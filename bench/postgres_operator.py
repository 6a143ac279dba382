"""Benchmark the PostgresCluster operator on the local cluster: time to Ready, and what it costs once converged.

    .venv/bin/python bench/postgres_operator.py                  # 3 rounds of 1 and of 3 instances, then 20 clusters
    .venv/bin/python bench/postgres_operator.py --rounds 5 --clusters 10 --idle 120

What runs is what ``kanri up`` installs: the real control plane (:class:`kanri.local.ControlPlane`) and the local node
(``python -m kanri.local.node`` with the generated image map, so ``kanri.dev/postgres:15`` is the real instance manager
over this machine's PostgreSQL 15) on a scratch ``KANRI_HOME``; the CRD and ``deploy/operator/`` applied server-side
(:func:`kanri.cli.up.apply_all`), the operator running as a pod (``kanri run``, leader election on) like any real
install. Only the node's bridge, namespace prefix, pod range and DNS address are the benchmark's own (``NETWORK``), so
a developer's ``kanri local up`` is left alone; the benchmark waits until no other local node runs (they would share
``10.96.0.1:443`` and the two cores). The node and the control plane are stopped at the end, even on error, and
``find_leftovers`` must then find nothing.

Measured:

1. **Apply → Ready** (the cluster's ``Ready`` condition is ``True``) for a 1-instance and a 3-instance cluster
   (PostgreSQL 15, 1Gi claims, no backup, no resource requests, ``deletionPolicy: Delete``), ``--rounds`` each, with
   the breakdown apply → first pod created, → first pod ``Running``, → primary's pod Ready (its instance manager's
   ``/readyz``: PostgreSQL accepts connections), → every pod Ready, → ``Ready=True`` in status. Each cluster is then
   deleted and the benchmark waits until the cluster, its pods and its claims are gone (also timed). Every round uses a
   new name, so no round waits for the previous one's garbage collection.
2. **The operator at scale**: ``--clusters`` 1-instance clusters applied at once; the time until all are Ready; then the
   operator's ``VmRSS``, and over an ``--idle`` window once converged its CPU (``utime + stime`` of the container's
   process, found among the node's container processes by ``kanri.cli.main run`` in its cmdline), its reconciles
   (``controller_runtime_reconcile_total`` from ``http://<pod IP>:8081/metrics``) and its API requests by method
   (``rest_client_requests_total``, when ``kanri run`` exports it) — the steady-state cost of the 10 s instance
   refresh. As a cross-check, the API server's ``apiserver_request_total``
   writes over the same window are reported too (every client: the node's heartbeats and the Leases are in there).
   Converged reconciles should write nothing: the only operator writes expected are its Lease renewals (every 2 s).

The operator's process is looked up again at every sample: if its container restarted (the run counts restarts and
the operator log's lease failures), a CPU or counter difference across the restart is reported as unknown, never as
a number.

Why: ``kanri up`` promises a 3-instance cluster in well under a minute on a laptop, and a developer runs several
clusters at once on the local node; an operator that polls every instance every 10 s must stay cheap when nothing
changes. Prints a Markdown table and one JSON line; record them in docs/benchmarks.md with the command.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _localcluster import BenchNodeProcess, Network, check_machine, cpu, local_cluster, rss_kib, sigterm_as_exit
from kanri.cli.up import apply_all, documents
from kanri.local import controlplane_binary, paths
from kanri.local.node.sessions import container_processes
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import CLUSTER, PRIMARY, ROLE
from kanri.runtime import ApiError, Client, get_condition
from kanri.runtime.kinds import POD, PVC

Obj = dict[str, Any]
NAMESPACE = "default"
OPERATOR_NAMESPACE = "kanri-system"
OPERATOR_SELECTOR = "app.kubernetes.io/name=kanri-operator"
CLUSTER_NAME = "bench-pg"
FIELD_MANAGER = "bench-postgres-operator"
POLL = 0.25
WRITES = ("POST", "PUT", "PATCH", "DELETE")
LOG_EVENTS = ("leader lease request failed", "leader lease lost", "reconcile failed; retrying")

NETWORK: Network = {
    "bridge": "kpgbench0",
    "service_link": "kpgbench-svc",
    "netns_prefix": "kpgbench-",
    "pod_cidr": "10.248.0.0/16",
    "internal_ip": "10.248.0.1",
    "cluster_dns_ip": "10.96.255.54",
}
"""The node's network names and addresses, apart from the defaults (``kanri0``, ``kanri-*``, 10.244.0.0/16,
``10.96.0.10``) and from ``bench/local_node.py``'s: a node deletes its bridge and every namespace with its prefix
that it finds at start, as leftovers of an earlier run."""


def postgres_cluster(name: str, replicas: int) -> Obj:
    return {
        "apiVersion": POSTGRES_CLUSTER.api_version,
        "kind": POSTGRES_CLUSTER.kind,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"version": 15, "replicas": replicas, "storage": {"size": "1Gi"}, "deletionPolicy": "Delete"},
    }


# --- the machine and /proc -----------------------------------------------------------------------------------------


def operator_pid(node_dir: Path) -> int | None:
    """The operator's process: one of this node's container processes, running ``kanri.cli.main run``."""
    for pid in container_processes(node_dir):
        with contextlib.suppress(OSError):
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            if b"kanri.cli.main" in argv and b"run" in argv:
                return pid
    return None


@dataclass(frozen=True)
class Sample:
    """The operator's process at one moment."""

    pid: int
    cpu: float
    rss_kib: int


class Operator:
    """The operator container's process, looked up again at every sample: the container may have restarted."""

    def __init__(self, node_dir: Path, pod_ip: str) -> None:
        self.node_dir = node_dir
        self.pod_ip = pod_ip

    def sample(self) -> Sample | None:
        """None while no operator process runs (between a crash and the restart)."""
        pid = operator_pid(self.node_dir)
        if pid is None:
            return None
        try:
            own = cpu(pid).own
        except OSError:
            return None
        rss = rss_kib(pid)
        return Sample(pid, own, rss) if rss else None  # 0: the process exited meanwhile

    def cpu_since(self, before: Sample | None) -> float | None:
        """CPU seconds since ``before``; None when the process is not the same (the counters started over)."""
        now = self.sample()
        if before is None or now is None or now.pid != before.pid:
            return None
        return now.cpu - before.cpu

    async def metrics(self) -> Metrics:
        return await scrape(self.pod_ip)

    def log_counts(self) -> dict[str, int]:
        """Lines of interest in every log of the operator's container (one file per run of it)."""
        counts = dict.fromkeys(LOG_EVENTS, 0)
        for log in sorted(self.node_dir.glob(f"pods/{OPERATOR_NAMESPACE}_kanri-operator-*/operator/*.log")):
            for line in log.read_text(errors="replace").splitlines():
                for event in LOG_EVENTS:
                    counts[event] += f'"event": "{event}"' in line
        return counts


# --- the operator's metrics ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Metrics:
    requests: dict[str, float]
    """``rest_client_requests_total`` summed by method."""
    reconciles: float
    """``controller_runtime_reconcile_total``, every result."""

    def __sub__(self, other: Metrics) -> Metrics:
        methods = set(self.requests) | set(other.requests)
        return Metrics(
            {m: self.requests.get(m, 0.0) - other.requests.get(m, 0.0) for m in sorted(methods)},
            self.reconciles - other.reconciles,
        )

    @property
    def writes(self) -> float:
        return sum(self.requests.get(m, 0.0) for m in WRITES)


_SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")


def parse_metrics(text: str) -> Metrics:
    requests: dict[str, float] = {}
    reconciles = 0.0
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name, labels, value = match.groups()
        if name == "rest_client_requests_total":
            method = re.search(r'method="(\w+)"', labels)
            key = method.group(1) if method else "?"
            requests[key] = requests.get(key, 0.0) + float(value)
        elif name == "controller_runtime_reconcile_total":
            reconciles += float(value)
    return Metrics(requests, reconciles)


async def scrape(pod_ip: str) -> Metrics:
    def get() -> str:
        with urllib.request.urlopen(f"http://{pod_ip}:8081/metrics", timeout=5) as response:
            return str(response.read().decode())

    return parse_metrics(await asyncio.to_thread(get))


async def apiserver_writes(kubeconfig: Path) -> dict[str, float]:
    """``apiserver_request_total`` of the write verbs, by ``VERB resource[/subresource]``, from every client."""

    def get() -> str:
        argv = ["kubectl", f"--kubeconfig={kubeconfig}", "get", "--raw", "/metrics"]
        return subprocess.run(argv, capture_output=True, text=True, check=True, timeout=30).stdout

    writes: dict[str, float] = {}
    for line in (await asyncio.to_thread(get)).splitlines():
        match = _SAMPLE.match(line)
        if match is None or match.group(1) != "apiserver_request_total":
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if labels.get("verb") not in ("POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"):
            continue
        resource = labels.get("resource", "?") + (f"/{labels['subresource']}" if labels.get("subresource") else "")
        key = f"{labels['verb']} {resource}"
        writes[key] = writes.get(key, 0.0) + float(match.group(3))
    return writes


def difference(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: v - before.get(k, 0.0) for k, v in sorted(after.items()) if v - before.get(k, 0.0)}


# --- rounds: apply → Ready, delete → gone --------------------------------------------------------------------------


def condition_true(obj: Obj, kind: str) -> bool:
    condition = get_condition((obj.get("status") or {}).get("conditions"), kind)
    return condition is not None and condition["status"] == "True"


async def cluster_pods(client: Client, name: str) -> list[Obj]:
    items, _ = await client.list(POD, NAMESPACE, label_selector=f"{CLUSTER}={name}")
    return items


@dataclass
class Round:
    replicas: int
    first_pod: float = 0.0
    first_running: float = 0.0
    primary_ready: float = 0.0
    pods_ready: float = 0.0
    ready: float = 0.0
    gone: float = 0.0
    operator_cpu: float | None = None
    operator_restarts: int = 0
    load: float = 0.0


async def operator_restarts(client: Client) -> int:
    pods, _ = await client.list(POD, OPERATOR_NAMESPACE, label_selector=OPERATOR_SELECTOR)
    return sum(
        int(s.get("restartCount", 0)) for p in pods for s in (p.get("status") or {}).get("containerStatuses") or []
    )


async def time_to_ready(client: Client, name: str, replicas: int, operator: Operator, timeout: float) -> Round:
    """Apply the cluster and poll it and its pods until ``Ready=True``; the times are seconds since the apply."""
    result = Round(replicas, load=os.getloadavg()[0])
    cpu_before, restarts_before = operator.sample(), await operator_restarts(client)
    started = time.monotonic()
    await client.apply(POSTGRES_CLUSTER, postgres_cluster(name, replicas), field_manager=FIELD_MANAGER)
    cluster: Obj = {}
    while True:
        now = time.monotonic() - started
        cluster = await client.get(POSTGRES_CLUSTER, name, NAMESPACE)
        pods = await cluster_pods(client, name)
        if pods and not result.first_pod:
            result.first_pod = now
        if not result.first_running and any((p.get("status") or {}).get("phase") == "Running" for p in pods):
            result.first_running = now
        primary = [p for p in pods if (p["metadata"].get("labels") or {}).get(ROLE) == PRIMARY]
        if not result.primary_ready and any(condition_true(p, "Ready") for p in primary):
            result.primary_ready = now
        if not result.pods_ready and len(pods) == replicas and all(condition_true(p, "Ready") for p in pods):
            result.pods_ready = now
        if condition_true(cluster, "Ready"):
            result.ready = now
            # A stage passed between two polls counts as passed at this one.
            for stage in ("first_pod", "first_running", "primary_ready", "pods_ready"):
                setattr(result, stage, getattr(result, stage) or now)
            break
        if now > timeout:
            raise TimeoutError(f"{name} not Ready within {timeout:.0f}s: {describe(cluster)}")
        await asyncio.sleep(POLL)
    result.operator_cpu = operator.cpu_since(cpu_before)
    result.operator_restarts = await operator_restarts(client) - restarts_before
    return result


def describe(cluster: Obj) -> str:
    status = cluster.get("status") or {}
    parts = [f"ready {status.get('readyReplicas', 0)}/{(cluster.get('spec') or {}).get('replicas', '?')}"]
    for kind in ("Ready", "Progressing", "Degraded"):
        condition = get_condition(status.get("conditions"), kind)
        if condition is not None:
            parts.append(
                f"{kind}={condition['status']} ({condition.get('reason', '')}: {condition.get('message', '')})"
            )
    return ", ".join(parts)


async def delete_and_wait(client: Client, name: str, timeout: float) -> float:
    """Delete the cluster (``deletionPolicy: Delete``) and wait until it, its pods and its claims are gone."""
    started = time.monotonic()
    await client.delete(POSTGRES_CLUSTER, name, NAMESPACE)
    while True:
        try:
            await client.get(POSTGRES_CLUSTER, name, NAMESPACE)
            left = ["the PostgresCluster"]
        except ApiError as exc:
            if not exc.not_found:
                raise
            left = []
        pods = await cluster_pods(client, name)
        claims, _ = await client.list(PVC, NAMESPACE, label_selector=f"{CLUSTER}={name}")
        left += [f"{len(pods)} pods"] if pods else []
        left += [f"{len(claims)} claims"] if claims else []
        if not left:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{name}: still there after {timeout:.0f}s: {', '.join(left)}")
        await asyncio.sleep(POLL)


# --- many clusters -------------------------------------------------------------------------------------------------


@dataclass
class Scale:
    clusters: int
    ready_at: dict[str, float] = field(default_factory=dict)
    not_ready: dict[str, str] = field(default_factory=dict)
    converge_seconds: float = 0.0
    converge_cpu: float | None = None
    converge_metrics: Metrics | None = None
    rss_ready_kib: int | None = None
    idle_seconds: float = 0.0
    idle_cpu: float | None = None
    idle_metrics: Metrics | None = None
    idle_apiserver_writes: dict[str, float] = field(default_factory=dict)
    """Writes the API server served during the idle window, from every client, by verb and resource."""
    idle_control_plane_cpu: float = 0.0
    idle_node_cpu: float = 0.0
    rss_idle_end_kib: int | None = None
    restarts: int = 0
    load: float = 0.0


async def metrics_since(
    operator: Operator, before: tuple[Sample | None, Metrics]
) -> tuple[float | None, Metrics | None]:
    """CPU and metrics since ``before``, both None if the operator's process is not the same one."""
    cpu = operator.cpu_since(before[0])
    return (cpu, await operator.metrics() - before[1]) if cpu is not None else (None, None)


async def converge_many(
    client: Client, kubeconfig: Path, count: int, operator: Operator, pids: dict[str, int], args: argparse.Namespace
) -> Scale:
    """Apply ``count`` 1-instance clusters at once, wait until all are Ready, then watch the operator idle."""
    scale = Scale(count, load=os.getloadavg()[0])
    names = [f"{CLUSTER_NAME}-many-{n:02d}" for n in range(1, count + 1)]
    restarts_before = await operator_restarts(client)
    before = (operator.sample(), await operator.metrics())
    started = time.monotonic()
    await asyncio.gather(
        *(client.apply(POSTGRES_CLUSTER, postgres_cluster(n, 1), field_manager=FIELD_MANAGER) for n in names)
    )
    while len(scale.ready_at) < count:
        now = time.monotonic() - started
        clusters, _ = await client.list(POSTGRES_CLUSTER, NAMESPACE)
        for cluster in clusters:
            name = cluster["metadata"]["name"]
            if name in names and name not in scale.ready_at and condition_true(cluster, "Ready"):
                scale.ready_at[name] = now
        if now > args.timeout_many:
            scale.not_ready = {
                c["metadata"]["name"]: describe(c) for c in clusters if c["metadata"]["name"] not in scale.ready_at
            }
            for name, line in scale.not_ready.items():
                print(f"not Ready after {now:.0f} s: {name}: {line}", file=sys.stderr, flush=True)
            break
        await asyncio.sleep(1.0)
    scale.converge_seconds = time.monotonic() - started
    scale.converge_cpu, scale.converge_metrics = await metrics_since(operator, before)
    ready_sample = operator.sample()
    scale.rss_ready_kib = ready_sample.rss_kib if ready_sample else None
    print(
        f"{len(scale.ready_at)}/{count} clusters Ready after {scale.converge_seconds:.1f} s; "
        f"settling {args.settle:.0f} s, then {args.idle:.0f} s idle",
        file=sys.stderr,
        flush=True,
    )

    await asyncio.sleep(args.settle)
    before = (operator.sample(), await operator.metrics())
    others_before = {k: cpu(p).own for k, p in pids.items()}
    writes_before = await apiserver_writes(kubeconfig)
    started = time.monotonic()
    await asyncio.sleep(args.idle)
    scale.idle_cpu, scale.idle_metrics = await metrics_since(operator, before)
    scale.idle_apiserver_writes = difference(await apiserver_writes(kubeconfig), writes_before)
    scale.idle_seconds = time.monotonic() - started
    scale.idle_control_plane_cpu = cpu(pids["control_plane"]).own - others_before["control_plane"]
    scale.idle_node_cpu = cpu(pids["node"]).own - others_before["node"]
    end_sample = operator.sample()
    scale.rss_idle_end_kib = end_sample.rss_kib if end_sample else None
    scale.restarts = await operator_restarts(client) - restarts_before
    still, _ = await client.list(POSTGRES_CLUSTER, NAMESPACE)
    unready = [c["metadata"]["name"] for c in still if not condition_true(c, "Ready")]
    if unready:
        print(f"not Ready at the end of the idle window: {', '.join(unready)}", file=sys.stderr, flush=True)
        scale.not_ready.update({n: "not Ready at the end of the idle window" for n in unready})
    return scale


# --- the whole run -------------------------------------------------------------------------------------------------


@dataclass
class Results:
    install_seconds: float = 0.0
    operator_rss_empty_kib: int | None = None
    operator_rss_after_rounds_kib: int | None = None
    rounds: list[Round] = field(default_factory=list)
    scale: Scale | None = None
    operator_restarts: int = 0
    operator_log: dict[str, int] = field(default_factory=dict)


async def wait_for_operator(client: Client, timeout: float) -> Obj:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pods, _ = await client.list(POD, OPERATOR_NAMESPACE, label_selector=OPERATOR_SELECTOR)
        ready = [p for p in pods if condition_true(p, "Ready") and (p.get("status") or {}).get("podIP")]
        if ready:
            return ready[0]
        await asyncio.sleep(POLL)
    raise TimeoutError(f"the operator pod is not Ready within {timeout:.0f}s")


def rss_now(operator: Operator) -> int | None:
    sample = operator.sample()
    return sample.rss_kib if sample else None


async def measure(kubeconfig: Path, node: BenchNodeProcess, cp_pid: int, args: argparse.Namespace) -> Results:
    node_pid = node.running_pid()
    if node_pid is None:
        raise RuntimeError(f"the local node is not running\n{node.log_tail()}")
    root = paths.source_root()
    results = Results()
    async with await Client.from_kubeconfig(str(kubeconfig)) as client:
        started = time.monotonic()
        await apply_all(client, documents(root / "deploy" / "crds"))
        await apply_all(client, documents(root / "deploy" / "operator"))
        pod = await wait_for_operator(client, args.timeout)
        results.install_seconds = time.monotonic() - started
        operator = Operator(node.node_dir, pod["status"]["podIP"])
        print(
            f"operator Ready after {results.install_seconds:.1f} s: {operator.sample()}, {operator.pod_ip}",
            file=sys.stderr,
        )
        await asyncio.sleep(args.settle)
        results.operator_rss_empty_kib = rss_now(operator)
        try:
            number = 0
            for replicas in (1, 3):
                for _ in range(args.rounds):
                    number += 1
                    name = f"{CLUSTER_NAME}-{replicas}x-{number}"
                    result = await time_to_ready(client, name, replicas, operator, args.timeout)
                    result.gone = await delete_and_wait(client, name, args.timeout)
                    results.rounds.append(result)
                    print(
                        f"{name}: first pod {result.first_pod:.1f} s, running {result.first_running:.1f} s, "
                        f"primary ready {result.primary_ready:.1f} s, all pods ready {result.pods_ready:.1f} s, "
                        f"Ready=True {result.ready:.1f} s; gone {result.gone:.1f} s after delete "
                        f"(load {result.load:.2f}, operator restarts {result.operator_restarts})",
                        file=sys.stderr,
                        flush=True,
                    )
            await asyncio.sleep(args.settle)
            results.operator_rss_after_rounds_kib = rss_now(operator)
            if args.clusters:
                pids = {"control_plane": cp_pid, "node": node_pid}
                results.scale = await converge_many(client, kubeconfig, args.clusters, operator, pids, args)
        finally:
            results.operator_restarts = await operator_restarts(client)
            results.operator_log = operator.log_counts()
            print(f"operator restarts: {results.operator_restarts}, log: {results.operator_log}", file=sys.stderr)
    return results


# --- reporting -----------------------------------------------------------------------------------------------------

RESTARTED = "— (the operator's process restarted meanwhile)"


def spread(values: Sequence[float | None], unit: str = "s", digits: int = 1) -> str:
    known = [v for v in values if v is not None]
    if not known:
        return RESTARTED if values else "—"
    inner = ", ".join("—" if v is None else f"{v:.{digits}f}" for v in values)
    return f"median {statistics.median(known):.{digits}f} {unit}, max {max(known):.{digits}f} {unit} ({inner})"


def mib(kib: float | None) -> str:
    return RESTARTED if kib is None else f"{kib / 1024:.0f} MiB"


def per_minute(metrics: Metrics | None, seconds: float) -> str:
    if metrics is None:
        return RESTARTED
    if not metrics.requests:
        return "not exported (`kanri run` gives its Client no ClientMetrics)"
    parts = [f"{m} {n * 60.0 / seconds:.1f}" for m, n in metrics.requests.items() if n]
    return ", ".join(parts) or "none"


def scale_rows(scale: Scale) -> list[tuple[str, str]]:
    n, ready = scale.clusters, sorted(scale.ready_at.values())
    minutes = scale.idle_seconds / 60
    not_ready = f" (not: {', '.join(scale.not_ready)})" if scale.not_ready else ""
    converge, idle = scale.converge_metrics, scale.idle_metrics
    rows = [
        (f"**{n} clusters of 1 instance applied at once → all Ready**", f"{scale.converge_seconds:.1f} s"),
        ("  clusters Ready", f"{len(ready)}/{n}{not_ready}"),
        ("  each cluster's apply → Ready", spread(ready)),
        ("  1-min load average as they were applied", f"{scale.load:.2f}"),
        ("  operator CPU until all Ready", spread([scale.converge_cpu])),
        ("  operator API requests until all Ready, by method", per_minute(converge, 60.0)),
        ("  reconciles until all Ready", RESTARTED if converge is None else f"{converge.reconciles:.0f}"),
        (f"operator RSS, {n} clusters Ready", mib(scale.rss_ready_kib)),
        (f"operator RSS after {scale.idle_seconds:.0f} s more idle", mib(scale.rss_idle_end_kib)),
    ]
    if scale.idle_cpu is None or idle is None:
        rows.append((f"operator CPU, converged, idle ({scale.idle_seconds:.0f} s window)", RESTARTED))
    else:
        share = 100 * scale.idle_cpu / scale.idle_seconds
        rows += [
            (
                f"**operator CPU, converged, idle ({scale.idle_seconds:.0f} s window)**",
                f"{scale.idle_cpu / minutes:.2f} s per minute ({share:.1f}% of a core)",
            ),
            ("  operator API requests per minute, by method", per_minute(idle, scale.idle_seconds)),
            (
                "  of which writes (POST/PUT/PATCH/DELETE) per minute",
                f"{idle.writes / minutes:.1f}" if idle.requests else "—",
            ),
            ("  reconciles per minute", f"{idle.reconciles / minutes:.1f}"),
        ]
    rows += [
        (
            "  writes the API server served meanwhile (every client), per minute",
            ", ".join(f"{k} {v / minutes:.1f}" for k, v in scale.idle_apiserver_writes.items()) or "none",
        ),
        ("  control-plane CPU meanwhile, per minute", f"{scale.idle_control_plane_cpu / minutes:.2f} s"),
        ("  local-node CPU meanwhile, per minute", f"{scale.idle_node_cpu / minutes:.2f} s"),
        ("  operator restarts during this part", f"{scale.restarts}"),
    ]
    return rows


def report(results: Results, startup: dict[str, float]) -> None:
    rows: list[tuple[str, str]] = [
        ("control plane: first start to ready (new data dir)", f"{startup['control_plane']:.1f} s"),
        ("local node: start to ready", f"{startup['node']:.1f} s"),
        ("CRD + operator applied → operator pod Ready", f"{results.install_seconds:.1f} s"),
        ("operator RSS, no clusters", mib(results.operator_rss_empty_kib)),
    ]
    for replicas in (1, 3):
        rounds = [r for r in results.rounds if r.replicas == replicas]
        if not rounds:
            continue
        label = f"{replicas} instance{'s' if replicas > 1 else ''}"
        rows += [
            (f"**{label}: apply → Ready=True** ({len(rounds)} rounds)", spread([r.ready for r in rounds])),
            ("  apply → first pod created", spread([r.first_pod for r in rounds])),
            ("  apply → first pod Running", spread([r.first_running for r in rounds])),
            ("  apply → primary's pod Ready (PostgreSQL up)", spread([r.primary_ready for r in rounds])),
            ("  apply → every pod Ready", spread([r.pods_ready for r in rounds])),
            (f"  delete ({label}) → cluster, pods and claims gone", spread([r.gone for r in rounds])),
            ("  operator CPU, apply → Ready", spread([r.operator_cpu for r in rounds], "s", 2)),
            ("  operator restarts during each round", ", ".join(str(r.operator_restarts) for r in rounds)),
            ("  1-min load average as each round started", ", ".join(f"{r.load:.2f}" for r in rounds)),
        ]
    rows.append(("operator RSS after the rounds (no clusters)", mib(results.operator_rss_after_rounds_kib)))
    if results.scale is not None:
        rows += scale_rows(results.scale)
    log = ", ".join(f"{event!r} {n}" for event, n in results.operator_log.items())
    rows.append(("operator container restarts, whole run / its log", f"{results.operator_restarts} / {log}"))
    print("| measure | value |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")

    summary: dict[str, Any] = {
        **{f"{k}_start": round(v, 2) for k, v in startup.items()},
        "install": round(results.install_seconds, 2),
        "operator_rss_empty_kib": results.operator_rss_empty_kib,
        "operator_rss_after_rounds_kib": results.operator_rss_after_rounds_kib,
        "operator_restarts": results.operator_restarts,
        "operator_log": results.operator_log,
        "rounds": [
            {k: round(v, 3) if isinstance(v, float) else v for k, v in dataclasses.asdict(r).items()}
            for r in results.rounds
        ],
    }
    for replicas in (1, 3):
        ready = [r.ready for r in results.rounds if r.replicas == replicas]
        if ready:
            summary[f"ready_{replicas}_median"] = round(statistics.median(ready), 2)
            summary[f"ready_{replicas}_max"] = round(max(ready), 2)
    if results.scale is not None:
        summary["scale"] = {
            k: round(v, 3) if isinstance(v, float) else v for k, v in dataclasses.asdict(results.scale).items()
        }
    print(json.dumps(summary))


# --- main ----------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each size (1 and 3 instances)")
    parser.add_argument("--clusters", type=int, default=20, help="1-instance clusters for the scale part (0: skip)")
    parser.add_argument("--idle", type=float, default=60.0, help="seconds of the converged idle window")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds to wait before RSS/idle readings")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds one cluster may take to Ready / to go")
    parser.add_argument("--timeout-many", type=float, default=300.0, help="seconds the scale part may take to Ready")
    parser.add_argument("--wait", type=float, default=900.0, help="seconds to wait for another local node to stop")
    parser.add_argument("--keep", metavar="DIR", help="use DIR as KANRI_HOME and keep it (logs) instead of a temp dir")
    args = parser.parse_args()

    check_machine(NETWORK, args.wait)

    binary = controlplane_binary()
    scratch_dir: contextlib.AbstractContextManager[str] = (
        contextlib.nullcontext(str(Path(args.keep).resolve()))
        if args.keep
        else tempfile.TemporaryDirectory(prefix="kanri-bench-pg-")
    )
    with sigterm_as_exit(), scratch_dir as scratch:
        # Everything of this run lives under the scratch KANRI_HOME, apart from any developer's clusters.
        os.environ["KANRI_HOME"] = scratch
        with local_cluster(paths.cluster_dir(CLUSTER_NAME), binary, NETWORK, args.wait) as cluster:
            results = asyncio.run(measure(cluster.kubeconfig, cluster.node, cluster.control_plane_pid, args))
    cluster.require_clean()
    report(results, cluster.startup)


if __name__ == "__main__":
    main()
