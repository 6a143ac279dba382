"""Benchmark the runtime: the Greeting example operator against a plain client loop and against Kopf.

    .venv/bin/python bench/runtime_operator.py --objects 1000 [--json FILE]
    .venv/bin/python bench/runtime_operator.py --objects 10000 --resync-period 15 --repeat 1

Each contestant gets a fresh control plane (a temp data dir, removed at the end) holding N Greetings created before
the contestant starts, and runs as its own process so its CPU time and RSS are its own:

- **kanri**: ``bench/greeting_runner.py operator`` (the example's reconciler; leader election off; the client's
  token bucket replaced by ``Unlimited`` so the API server sets the pace).
- **plain**: ``bench/greeting_runner.py plain``: one LIST, then the same two writes per Greeting (apply the ConfigMap,
  merge-patch the status) with the same concurrency, no cache, no queue, no watch. The API server's limit.
- **kopf**: the same behaviour as a Kopf operator (``kopf run --standalone``), from a separate venv under
  ``.build/bench-venv`` that this script creates when missing (Kopf pinned in pyproject's ``bench`` extra).

Convergence (every Greeting Ready=True for its generation, every ConfigMap holding its message) is detected by
LISTing both kinds, never by per-object GETs; the time is that of the first LIST that saw it (an upper bound; the
poll interval is printed). Contestants run ``--repeat`` times (default 3, interleaved, each on a fresh control plane):
convergence numbers are medians, the rest (latency, memory, restart, resync) comes from the first run. Request
counts come from the API server's own ``apiserver_request_total`` (the benchmark's own LISTs subtracted), and for
kanri also from its ``rest_client_requests_total``.

Prints a Markdown section; record it in docs/benchmarks.md. ``--json FILE`` also writes the figures (per contestant
``kanri``, ``plain``, ``kopf``: ``seconds``, ``cpu_per_object_ms``, ``reconciles_per_object``, ``peak_rss_mib`` and
more) for comparing runs by script.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import pstats
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from kanri.local import ControlPlane
from kanri.local.ports import free_port
from kanri.runtime import ApiError, Client, ClientMetrics, Kind, Unlimited, crd_for
from kanri.runtime.kinds import CONFIG_MAP, CRD, NAMESPACE

# Run as a script, this file sees bench/ on sys.path, not the repository root that holds `examples`.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.greeting.operator import GREETING, Greeting

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "bench" / "greeting_runner.py"
BENCH_VENV = ROOT / ".build" / "bench-venv"
NAMESPACE_NAME = "bench"
CONTESTANTS = ("kanri", "plain", "kopf")
WRITE_VERBS = frozenset({"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"})
READ_VERBS = frozenset({"GET", "LIST", "WATCH", "WATCHLIST"})
Obj = dict[str, Any]

# The Kopf contestant: on creation and on every spec change of a Greeting, server-side apply its ConfigMap (the same
# request kanri makes) and set the same status through Kopf's own `patch`. Kopf has no API client of its own, so the
# apply goes through one aiohttp session built from the kubeconfig, as a Kopf user would do with any HTTP client.
KOPF_OPERATOR = """
import base64, datetime, os, ssl, tempfile

import aiohttp
import kopf
import yaml

GROUP, VERSION, PLURAL = "example.kanri.dev", "v1", "greetings"
STATE = {}


@kopf.on.startup()
async def start(**_):
    with open(os.environ["KUBECONFIG"]) as f:
        config = yaml.safe_load(f)
    context = next(c["context"] for c in config["contexts"] if c["name"] == config["current-context"])
    cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
    user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
    ca = base64.b64decode(cluster["certificate-authority-data"]).decode()
    tls = ssl.create_default_context(cadata=ca)
    directory = tempfile.mkdtemp()
    cert, key = os.path.join(directory, "client.crt"), os.path.join(directory, "client.key")
    for path, data in ((cert, user["client-certificate-data"]), (key, user["client-key-data"])):
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))
    tls.load_cert_chain(cert, key)
    STATE["server"] = cluster["server"].rstrip("/")
    STATE["session"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls))


@kopf.on.cleanup()
async def stop(**_):
    await STATE["session"].close()


async def publish(body, meta, spec, status, namespace, name, patch):
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{name}-greeting",
            "namespace": namespace,
            "ownerReferences": [{
                "apiVersion": body["apiVersion"], "kind": body["kind"], "name": name, "uid": meta["uid"],
                "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "data": {"message": spec["message"]},
    }
    url = f"{STATE['server']}/api/v1/namespaces/{namespace}/configmaps/{name}-greeting"
    async with STATE["session"].patch(
        url,
        params={"fieldManager": "greeting-operator", "force": "true"},
        json=configmap,
        headers={"Content-Type": "application/apply-patch+yaml"},
    ) as response:
        response.raise_for_status()
    old = next((c for c in (status.get("conditions") or []) if c.get("type") == "Ready"), None)
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    since = old["lastTransitionTime"] if old and old.get("status") == "True" else now
    patch.status["observedGeneration"] = meta["generation"]
    patch.status["conditions"] = [{
        "type": "Ready", "status": "True", "observedGeneration": meta["generation"], "lastTransitionTime": since,
        "reason": "Published", "message": "ConfigMap is up to date",
    }]


@kopf.on.create(GROUP, VERSION, PLURAL)
async def created(body, meta, spec, status, namespace, name, patch, **_):
    await publish(body, meta, spec, status, namespace, name, patch)


@kopf.on.update(GROUP, VERSION, PLURAL, field="spec")
async def updated(body, meta, spec, status, namespace, name, patch, **_):
    await publish(body, meta, spec, status, namespace, name, patch)
"""


# --- processes -------------------------------------------------------------------------------------------------------


def proc_status(pid: int, field_name: str) -> float:
    """A ``/proc/<pid>/status`` memory field (``VmRSS``, ``VmHWM``) in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field_name + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field_name} for {pid}")


def own_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def wait_cpu_idle(pid: int, *, below: float = 0.1, timeout: float = 120.0) -> None:
    """Wait until ``pid`` uses less than ``below`` of a core over a second (e.g. the control plane after a burst)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        before = cpu_seconds(pid)
        await asyncio.sleep(1.0)
        if cpu_seconds(pid) - before < below:
            return


@dataclass
class Spawned:
    process: asyncio.subprocess.Process
    started: float
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def check_alive(self) -> None:
        if self.process.returncode is not None:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])
            raise RuntimeError(f"contestant exited with {self.process.returncode}:\n{tail}")


@contextlib.asynccontextmanager
async def spawn(
    args: list[str], log: Path, env: dict[str, str], *, stdout_pipe: bool = False
) -> AsyncIterator[Spawned]:
    """Run a contestant; stop it on the way out (SIGTERM, SIGKILL after 10 s), whatever happens."""
    with log.open("ab") as sink:
        started = time.monotonic()
        process = await asyncio.create_subprocess_exec(
            *args,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE if stdout_pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE if stdout_pipe else sink,
            stderr=sink,
        )
    try:
        yield Spawned(process, started, log)
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


def kopf_requirement() -> str:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["bench"]
    return next(str(r) for r in extras if str(r).lower().startswith("kopf=="))


def ensure_bench_venv() -> Path:
    """``.build/bench-venv`` with the pinned Kopf (created or updated only when needed); returns its ``kopf``."""
    requirement = kopf_requirement()
    marker = BENCH_VENV / ".installed"
    kopf = BENCH_VENV / "bin" / "kopf"
    if kopf.exists() and marker.exists() and marker.read_text().strip() == requirement:
        return kopf
    if not (BENCH_VENV / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(BENCH_VENV)], check=True)
    pip = [str(BENCH_VENV / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, requirement], check=True)
    marker.write_text(requirement + "\n")
    return kopf


# --- the cluster -----------------------------------------------------------------------------------------------------


def greeting(index: int) -> Obj:
    return {
        "apiVersion": GREETING.api_version,
        "kind": GREETING.kind,
        "metadata": {"name": f"g-{index:05d}", "namespace": NAMESPACE_NAME},
        "spec": {"message": f"hello {index}"},
    }


async def bounded(items: Iterable[Any], work: Callable[[Any], Any], concurrency: int) -> None:
    """Run ``await work(item)`` for every item, ``concurrency`` at a time."""
    pending: Iterator[Any] = iter(items)

    async def worker() -> None:
        for item in pending:
            await work(item)

    async with asyncio.TaskGroup() as group:
        for _ in range(concurrency):
            group.create_task(worker())


async def prepare(client: Client, objects: int) -> float:
    """Install the CRD, make the namespace, create the Greetings; returns the seconds creation took."""
    await client.apply(CRD, crd_for(Greeting), field_manager="kanri-bench")
    async with asyncio.timeout(60):
        while True:
            crd = await client.get(CRD, Greeting.resource.crd_name)
            conditions = (crd.get("status") or {}).get("conditions") or []
            if any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                break
            await asyncio.sleep(0.1)
    await client.create(NAMESPACE, {"metadata": {"name": NAMESPACE_NAME}})
    # A Greeting created in the first moments after its CRD was established may still 404; retry those.
    for _ in range(50):
        try:
            await client.create(GREETING, greeting(0))
            break
        except ApiError as exc:
            if exc.status != 404:
                raise
            await asyncio.sleep(0.2)
    started = time.monotonic()
    await bounded(range(1, objects), lambda i: client.create(GREETING, greeting(i)), concurrency=32)
    return time.monotonic() - started


class AdminApi:
    """Raw HTTPS to the API server with the control plane's admin certificate: the convergence polls, page by page,
    and the server's own ``/metrics``. Counts the resource requests it makes, so they can be subtracted from the
    server's counts."""

    def __init__(self, server: str, pki: Path) -> None:
        self._server = server
        tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        tls.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=tls))
        self.requests = 0

    async def close(self) -> None:
        await self._session.close()

    async def pages(self, kind: Kind, page_size: int = 500) -> AsyncIterator[tuple[list[Obj], str]]:
        """One consistent LIST of ``kind`` in the benchmark namespace, a page at a time, with the list's version."""
        query = {"limit": str(page_size)}
        while True:
            self.requests += 1
            async with self._session.get(self._server + kind.path(NAMESPACE_NAME), params=query) as response:
                response.raise_for_status()
                page: Obj = json.loads(await response.read())
            yield page.get("items") or [], str(page["metadata"].get("resourceVersion", ""))
            token = page["metadata"].get("continue")
            if not token:
                return
            query["continue"] = token

    async def request_counts(self) -> dict[str, float]:
        """``apiserver_request_total`` for Greetings and ConfigMaps, split into reads and writes."""
        async with self._session.get(f"{self._server}/metrics") as response:
            text = await response.text()
        counts = {"read": 0.0, "write": 0.0}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name != "apiserver_request_total":
                    continue
                if sample.labels.get("resource") not in ("greetings", "configmaps"):
                    continue
                verb = sample.labels.get("verb", "")
                if verb in WRITE_VERBS:
                    counts["write"] += sample.value
                elif verb in READ_VERBS:
                    counts["read"] += sample.value
        return counts


@dataclass
class Poller:
    """Watches for convergence by LISTing, and keeps the list's resourceVersion for the watches that follow.

    A LIST of 10,000 objects costs the API server about as much as 100 objects' worth of a contestant's work, so a
    poll reads page after page only while every Greeting on them is converged: until the end, most polls stop at
    the first page.
    """

    api: AdminApi
    objects: int
    intervals: list[float] = field(default_factory=list)
    resource_version: str = ""
    generations: dict[str, int] = field(default_factory=dict)

    async def converged_at(self, contestant: Spawned, timeout: float) -> tuple[float | None, int]:
        """Seconds from the contestant's start to the first LIST that saw every object converged (None on timeout),
        and how many Greetings the last poll saw converged before it stopped."""
        deadline = time.monotonic() + timeout
        ready: list[Obj] = []
        while time.monotonic() < deadline:
            polled = time.monotonic()
            ready = []
            async for page, version in self.api.pages(GREETING):
                self.resource_version = version
                if not all(is_ready(g) for g in page):
                    break
                ready.extend(page)
            seen = time.monotonic()
            if len(ready) == self.objects and await self._configmaps_match(ready):
                self.generations = {g["metadata"]["name"]: int(g["metadata"]["generation"]) for g in ready}
                return seen - contestant.started, len(ready)
            if contestant.process.returncode not in (None, 0):
                contestant.check_alive()
            # Often enough for a resolution of a second or better, rarely enough to tax the run little.
            interval = min(1.0, max(0.25, 3 * (time.monotonic() - polled)))
            self.intervals.append(interval)
            await asyncio.sleep(interval)
        return None, len(ready)

    async def _configmaps_match(self, greetings: list[Obj]) -> bool:
        data: dict[str, Any] = {}
        async for page, _ in self.api.pages(CONFIG_MAP):
            data.update((m["metadata"]["name"], m.get("data")) for m in page)
        return all(
            data.get(f"{g['metadata']['name']}-greeting") == {"message": g["spec"]["message"]} for g in greetings
        )


def is_ready(g: Obj) -> bool:
    status = g.get("status") or {}
    if status.get("observedGeneration") != g["metadata"]["generation"]:
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])


def client_requests(registry: CollectorRegistry) -> float:
    """Requests the benchmark's own client made (its LISTs and watches inflate the API server's read count)."""
    total = 0.0
    for metric in registry.collect():
        for sample in metric.samples:
            if sample.name == "rest_client_requests_total":
                total += sample.value
    return total


async def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A contestant's /metrics, as {(sample name, sorted labels): value}."""
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
        text = await response.text()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], metric: str, /, **labels: str) -> float:
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == metric and wanted <= set(ls))


def writes(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]) -> float:
    return sum(total(samples, "rest_client_requests_total", method=m) for m in ("POST", "PUT", "PATCH", "DELETE"))


async def wait_http(port: int, path: str, spawned: Spawned, timeout: float = 60.0) -> float:
    """Seconds from the contestant's start until ``path`` on ``port`` answers 200."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            spawned.check_alive()
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                    if response.status == 200:
                        return time.monotonic() - spawned.started
            await asyncio.sleep(0.02)
    raise TimeoutError(f"{path} on port {port} did not answer within {timeout:.0f} s")


async def wait_queue_idle(port: int, spawned: Spawned, timeout: float = 300.0) -> None:
    """Until the kanri operator's work queue is empty and no worker is busy, twice in a row."""
    quiet = 0
    deadline = time.monotonic() + timeout
    while quiet < 2:
        if time.monotonic() > deadline:
            raise TimeoutError("the work queue did not drain")
        spawned.check_alive()
        samples = await scrape(port)
        busy = total(samples, "workqueue_depth", name="greeting") + total(
            samples, "controller_runtime_active_workers", controller="greeting"
        )
        quiet = quiet + 1 if busy == 0 else 0
        await asyncio.sleep(0.3)


# --- measurements ----------------------------------------------------------------------------------------------------


@dataclass
class Measures:
    """One contestant's numbers (None: not measured for this contestant)."""

    name: str
    objects: int
    converge: float | None = None
    ready_at_timeout: int = 0
    startup: float | None = None
    api_writes: float | None = None
    api_reads: float | None = None
    client_writes: float | None = None
    client_reads: float | None = None
    reconciles: float | None = None
    cpu: float | None = None
    control_plane_cpu: float | None = None
    bench_cpu: float | None = None
    load: list[float] = field(default_factory=list)
    converge_runs: list[float | None] = field(default_factory=list)
    peak_rss: float | None = None
    rss_converged: float | None = None
    rss_empty: float | None = None
    rss_cached: float | None = None
    configmap_latency: list[float] = field(default_factory=list)
    status_latency: list[float] = field(default_factory=list)
    restart_writes: float | None = None
    resync_writes: float | None = None
    resync_reconciles: float | None = None
    poll_interval: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def rate(self) -> float | None:
        return self.objects / self.converge if self.converge else None


async def spec_change_latency(client: Client, poller: Poller, changes: int, rate: float) -> tuple[list[float], ...]:
    """Change ``changes`` Greetings' message one at a time, ``rate`` a second; for each, the seconds from sending the
    change to the watch event showing its ConfigMap updated, and to the one showing its status at the new
    generation."""
    names = sorted(poller.generations)
    step = max(1, len(names) // changes)
    chosen = names[::step][:changes]
    sent: dict[str, float] = {}
    configmap_seen: dict[str, float] = {}
    status_seen: dict[str, float] = {}
    message = {name: f"changed {name}" for name in chosen}
    all_seen = asyncio.Event()

    def seen(record: dict[str, float], name: str) -> None:
        record.setdefault(name, time.monotonic() - sent[name])
        if len(configmap_seen) == len(status_seen) == len(chosen):
            all_seen.set()

    async def watch_configmaps() -> None:
        async for event in client.watch(CONFIG_MAP, NAMESPACE_NAME, resource_version=poller.resource_version):
            obj = event["object"]
            owner = obj.get("metadata", {}).get("name", "").removesuffix("-greeting")
            if owner in sent and (obj.get("data") or {}).get("message") == message[owner]:
                seen(configmap_seen, owner)

    async def watch_greetings() -> None:
        async for event in client.watch(GREETING, NAMESPACE_NAME, resource_version=poller.resource_version):
            obj = event["object"]
            name = obj.get("metadata", {}).get("name", "")
            if name in sent and obj["metadata"]["generation"] == poller.generations[name] + 1 and is_ready(obj):
                seen(status_seen, name)

    async with asyncio.TaskGroup() as group:
        watchers = [group.create_task(watch_configmaps()), group.create_task(watch_greetings())]
        await asyncio.sleep(0.5)  # let both watches open
        started = time.monotonic()
        for i, name in enumerate(chosen):
            await asyncio.sleep(max(0.0, started + i / rate - time.monotonic()))
            sent[name] = time.monotonic()
            await client.patch(GREETING, name, {"spec": {"message": message[name]}}, NAMESPACE_NAME)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_seen.wait(), 60)
        for watcher in watchers:
            watcher.cancel()
    return list(configmap_seen.values()), list(status_seen.values())


@dataclass
class Setup:
    args: argparse.Namespace
    client: Client
    registry: CollectorRegistry
    api: AdminApi
    control_plane_pid: int
    kubeconfig: Path
    scratch: Path
    full: bool
    """False for the repeats: convergence only (no latency, restart, resync or empty-namespace runs)."""


async def measure_convergence(setup: Setup, result: Measures, spawned: Spawned) -> Poller:
    """Time to converge, requests per object, CPU: the part every contestant shares."""
    poller = Poller(setup.api, setup.args.objects)
    api_before = await setup.api.request_counts()
    own_before = client_requests(setup.registry) + setup.api.requests
    cp_before = cpu_seconds(setup.control_plane_pid)
    bench_before = own_cpu_seconds()
    result.load = [os.getloadavg()[0]]
    result.converge, result.ready_at_timeout = await poller.converged_at(spawned, setup.args.timeout)
    result.poll_interval = poller.intervals[-1] if poller.intervals else 0.0
    result.control_plane_cpu = cpu_seconds(setup.control_plane_pid) - cp_before
    result.bench_cpu = own_cpu_seconds() - bench_before
    if spawned.process.returncode is None:
        result.cpu = cpu_seconds(spawned.pid)
    if result.converge is None:
        seen = result.ready_at_timeout
        result.notes.append(f"did not converge within {setup.args.timeout:.0f} s (the last poll saw {seen} ready)")
        return poller
    # Requests still triggered by the last writes (the events they cause) belong to convergence too.
    await wait_cpu_idle(spawned.pid, below=0.05, timeout=60)
    api_after = await setup.api.request_counts()
    own = client_requests(setup.registry) + setup.api.requests - own_before
    n = setup.args.objects
    result.api_writes = (api_after["write"] - api_before["write"]) / n
    result.api_reads = (api_after["read"] - api_before["read"] - own) / n
    return poller


async def latency_and_memory(setup: Setup, result: Measures, spawned: Spawned, poller: Poller) -> None:
    result.peak_rss = proc_status(spawned.pid, "VmHWM")
    result.rss_converged = proc_status(spawned.pid, "VmRSS")
    if result.converge is None:
        return
    await wait_cpu_idle(setup.control_plane_pid, timeout=60)
    result.configmap_latency, result.status_latency = await spec_change_latency(
        setup.client, poller, setup.args.changes, setup.args.change_rate
    )


def python_env() -> dict[str, str]:
    return dict(os.environ)


def runner_args(setup: Setup, mode: str, *extra: str, profile: str | None = None) -> list[str]:
    args = setup.args
    python = [sys.executable, "-m", "cProfile", "-o", profile] if profile else [sys.executable]
    return [*python, str(RUNNER), mode, "--kubeconfig", str(setup.kubeconfig), "--namespace", NAMESPACE_NAME,
            "--workers", str(args.workers), *extra]  # fmt: skip


async def rss_with_no_objects(args: list[str], log: Path, port: int, path: str, env: dict[str, str]) -> float:
    """RSS of a contestant watching an empty namespace, once it is up (and a second later)."""
    async with spawn(args, log, env) as spawned:
        await wait_http(port, path, spawned)
        await asyncio.sleep(2)
        return proc_status(spawned.pid, "VmRSS")


async def run_kanri(setup: Setup) -> Measures:
    result = Measures("kanri", setup.args.objects)
    log = setup.scratch / "kanri.log"
    port = free_port()
    env = python_env()
    first = runner_args(setup, "operator", "--health-port", str(port), profile=setup.args.profile)
    async with spawn(first, log, env) as spawned:
        startup = asyncio.create_task(wait_http(port, "/healthz", spawned))
        poller = await measure_convergence(setup, result, spawned)
        result.startup = await startup
        if result.converge is not None:
            await wait_queue_idle(port, spawned)
            samples = await scrape(port)
            n = setup.args.objects
            result.client_writes = writes(samples) / n
            result.client_reads = total(samples, "rest_client_requests_total", method="GET") / n
            result.reconciles = total(samples, "controller_runtime_reconcile_total", controller="greeting") / n
        if setup.full:
            await latency_and_memory(setup, result, spawned, poller)
    if setup.args.profile:
        print_profile(setup.args.profile)
        result.notes.append("run under cProfile: its times are inflated")
    if result.converge is None or not setup.full:
        return result

    # A restart over N converged objects, with a short resync: how many writes do the initial list and one full
    # resync cost? (Both must be 0: a converged object is never written.)
    port = free_port()
    period = str(setup.args.resync_period)
    async with spawn(runner_args(setup, "operator", "--health-port", str(port), "--resync-period", period), log,
                     env) as spawned:  # fmt: skip
        await wait_http(port, "/readyz", spawned)
        await wait_queue_idle(port, spawned)
        samples = await scrape(port)
        result.restart_writes = writes(samples)
        reconciles = total(samples, "controller_runtime_reconcile_total", controller="greeting")
        deadline = time.monotonic() + 3 * setup.args.resync_period + setup.args.objects / 100
        while True:
            await asyncio.sleep(0.5)
            samples = await scrape(port)
            done = total(samples, "controller_runtime_reconcile_total", controller="greeting") - reconciles
            if done >= setup.args.objects or time.monotonic() > deadline:
                break
        await wait_queue_idle(port, spawned)
        samples = await scrape(port)
        result.resync_reconciles = (
            total(samples, "controller_runtime_reconcile_total", controller="greeting") - reconciles
        )
        result.resync_writes = writes(samples) - result.restart_writes
        await asyncio.sleep(1)
        result.rss_cached = proc_status(spawned.pid, "VmRSS")

    # The same operator on an empty namespace: what the N objects themselves cost in memory.
    port = free_port()
    empty = runner_args(setup, "operator", "--health-port", str(port))
    empty[empty.index(NAMESPACE_NAME)] = "empty"
    result.rss_empty = await rss_with_no_objects(empty, log, port, "/readyz", env)
    return result


async def run_plain(setup: Setup) -> Measures:
    result = Measures("plain", setup.args.objects)
    log = setup.scratch / "plain.log"
    async with spawn(runner_args(setup, "plain"), log, python_env(), stdout_pipe=True) as spawned:
        await measure_convergence(setup, result, spawned)
        assert spawned.process.stdout is not None
        assert spawned.process.stdin is not None
        async with asyncio.timeout(60):
            await spawned.process.stdout.readline()  # "done": the loop finished; /proc still readable
        result.cpu = cpu_seconds(spawned.pid)
        result.peak_rss = proc_status(spawned.pid, "VmHWM")
        spawned.process.stdin.close()
    return result


async def run_kopf(setup: Setup) -> Measures:
    result = Measures("kopf", setup.args.objects)
    kopf = ensure_bench_venv()
    operator = setup.scratch / "kopf_greeting.py"
    operator.write_text(KOPF_OPERATOR)
    log = setup.scratch / "kopf.log"
    env = {**os.environ, "KUBECONFIG": str(setup.kubeconfig)}
    env.pop("PYTHONPATH", None)

    def kopf_args(port: int, namespace: str = NAMESPACE_NAME) -> list[str]:
        return [str(kopf), "run", "--standalone", "--quiet", "--namespace", namespace,
                "--liveness", f"http://127.0.0.1:{port}/healthz", str(operator)]  # fmt: skip

    port = free_port()
    async with spawn(kopf_args(port), log, env) as spawned:
        startup = asyncio.create_task(wait_http(port, "/healthz", spawned))
        poller = await measure_convergence(setup, result, spawned)
        result.startup = await startup
        if setup.full:
            await latency_and_memory(setup, result, spawned, poller)
    if setup.full:
        port = free_port()
        result.rss_empty = await rss_with_no_objects(kopf_args(port, "empty"), log, port, "/healthz", env)
    return result


def merge(runs: list[Measures]) -> Measures:
    """The first (full) run's numbers, with the convergence numbers every run measured replaced by their medians."""
    first = runs[0]
    first.converge_runs = [r.converge for r in runs]
    first.load = [x for r in runs for x in r.load]
    for attr in ("converge", "cpu", "control_plane_cpu", "bench_cpu", "api_writes", "api_reads"):
        values = [v for r in runs if (v := getattr(r, attr)) is not None]
        setattr(first, attr, statistics.median(values) if len(values) == len(runs) else None)
    return first


def print_profile(path: str) -> None:
    stats = pstats.Stats(path, stream=sys.stderr)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(40)


RUNNERS = {"kanri": run_kanri, "plain": run_plain, "kopf": run_kopf}


async def contest(
    name: str, args: argparse.Namespace, data_dir: Path, endpoint_pid: int, server: str, full: bool
) -> Measures:
    registry = CollectorRegistry()
    kubeconfig = data_dir / "admin.kubeconfig"
    client = await Client.from_kubeconfig(str(kubeconfig), rate_limiter=Unlimited(), metrics=ClientMetrics(registry))
    async with client:
        created = await prepare(client, args.objects)
        print(f"  {name}: created {args.objects} Greetings in {created:.1f} s", file=sys.stderr)
        await wait_cpu_idle(endpoint_pid)  # let the API server, etcd and the garbage collector digest them
        api = AdminApi(server, data_dir / "pki")
        try:
            setup = Setup(args, client, registry, api, endpoint_pid, kubeconfig, data_dir.parent, full)
            return await RUNNERS[name](setup)
        finally:
            await api.close()


def run_contestant(name: str, args: argparse.Namespace, *, full: bool) -> Measures:
    """One contestant on a fresh control plane, stopped and deleted afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"kanri-bench-{name}-") as scratch:
        cp = ControlPlane(Path(scratch) / "controlplane")
        endpoint = cp.start(exit_with_parent=True)
        try:
            print(f"{name}: control plane up", file=sys.stderr)
            result = asyncio.run(contest(name, args, cp.data_dir, endpoint.pid, endpoint.server, full))
            print(f"  {name}: {result}", file=sys.stderr)
            if args.keep_logs:
                for log in Path(scratch).glob("*.log"):
                    target = Path(args.keep_logs) / f"{args.objects}-{log.name}"
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(log.read_bytes())
            return result
        finally:
            cp.stop()


# --- report ----------------------------------------------------------------------------------------------------------


def fmt(value: float | None, pattern: str = "{:.1f}") -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else pattern.format(value)


def percentile(values: list[float], q: int) -> float | None:
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def latency(values: list[float], expected: int) -> str:
    if not values:
        return "—"
    missing = f" ({expected - len(values)} not seen)" if len(values) < expected else ""
    return f"{fmt(percentile(values, 50), '{:.3f}')} / {fmt(percentile(values, 95), '{:.3f}')} s{missing}"


def report(results: list[Measures], args: argparse.Namespace) -> str:
    by = {r.name: r for r in results}
    cols = [by[c] for c in CONTESTANTS if c in by]
    n = args.objects

    def converged(r: Measures) -> str:
        runs = ", ".join(fmt(x, "{:.1f}") if x else "—" for x in r.converge_runs)
        median = fmt(r.converge, "{:.1f} s") if r.converge else f"> {args.timeout:.0f} s"
        return f"{median} ({runs})" if len(r.converge_runs) > 1 else median

    def row(label: str, cell: Callable[[Measures], str]) -> str:
        return f"| {label} | " + " | ".join(cell(r) for r in cols) + " |"

    heads = {"kanri": "kanri (Greeting example)", "plain": "plain client loop", "kopf": f"Kopf {kopf_version()}"}
    lines = [
        "| measure | " + " | ".join(heads[r.name] for r in cols) + " |",
        "|---|" + "---|" * len(cols),
        row(f"time to converge {n} Greetings, process start → all ready (median of the runs)", converged),
        row("objects/s (median run)", lambda r: fmt(r.rate, "{:.0f}")),
        row("process start → /healthz", lambda r: fmt(r.startup, "{:.2f} s")),
        row("writes per object (API server count)", lambda r: fmt(r.api_writes, "{:.2f}")),
        row("reads per object (API server count, poller's LISTs excluded)", lambda r: fmt(r.api_reads, "{:.3f}")),
        row("writes / reads per object (`rest_client_requests_total`)",
            lambda r: f"{r.client_writes:.2f} / {r.client_reads:.3f}"
            if r.client_writes is not None and r.client_reads is not None else "—"),
        row("reconciles per object", lambda r: fmt(r.reconciles, "{:.2f}")),
        row("contestant CPU until converged (median)", lambda r: fmt(r.cpu, "{:.1f} s")),
        row("contestant CPU per object (median)", lambda r: fmt(r.cpu and r.cpu / n * 1000, "{:.2f} ms")),
        row("control-plane CPU until converged (median)", lambda r: fmt(r.control_plane_cpu, "{:.1f} s")),
        row("the benchmark's own CPU meanwhile (its convergence LISTs)", lambda r: fmt(r.bench_cpu, "{:.1f} s")),
        row("1-min load average as each run started (the machine is shared; 2 = both cores busy)",
            lambda r: ", ".join(f"{x:.1f}" for x in r.load)),
        row("peak RSS", lambda r: fmt(r.peak_rss, "{:.0f} MiB")),
        row(f"RSS with {n} objects cached, idle after restart", lambda r: fmt(r.rss_cached, "{:.0f} MiB")),
        row("RSS after convergence", lambda r: fmt(r.rss_converged, "{:.0f} MiB")),
        row("RSS watching an empty namespace", lambda r: fmt(r.rss_empty, "{:.0f} MiB")),
        row(f"spec change → ConfigMap updated, p50 / p95 ({args.changes} changes at {args.change_rate:g}/s)",
            lambda r: latency(r.configmap_latency, args.changes) if r.name != "plain" else "—"),
        row("spec change → status at new generation, p50 / p95",
            lambda r: latency(r.status_latency, args.changes) if r.name != "plain" else "—"),
        row(f"writes on restart over {n} converged objects", lambda r: fmt(r.restart_writes, "{:.0f}")),
        row(f"writes per full resync after convergence (resync every {args.resync_period:g} s)",
            lambda r: f"{r.resync_writes:.0f} ({r.resync_reconciles:.0f} reconciles)"
            if r.resync_writes is not None and r.resync_reconciles is not None else "—"),
        row("resolution: poll interval before convergence was seen", lambda r: fmt(r.poll_interval, "{:.2f} s")),
    ]  # fmt: skip
    kanri, plain, kopf = by.get("kanri"), by.get("plain"), by.get("kopf")
    # Issue 17's targets: throughput at least 0.95x the plain loop's, CPU per object at most 0.4x Kopf's.
    if kanri and plain and kanri.rate and plain.rate:
        ratio = kanri.rate / plain.rate
        verdict = "met" if ratio >= 0.95 else "MISSED"
        lines.append(f"\nkanri / plain throughput: **{ratio:.2f}x** (target ≥ 0.95x: {verdict})")
    if kanri and kopf and kanri.rate and kopf.rate:
        lines.append(f"\nkanri / Kopf throughput: **{kanri.rate / kopf.rate:.2f}x**")
    if kanri and kopf and kanri.cpu and kopf.cpu:
        ratio = kanri.cpu / kopf.cpu
        verdict = "met" if ratio <= 0.4 else "MISSED"
        lines.append(f"\nkanri / Kopf CPU per object: **{ratio:.2f}x** (target ≤ 0.4x: {verdict})")
    for r in cols:
        lines.extend(f"\n{r.name}: {note}" for note in r.notes)
    return "\n".join(lines)


def kopf_version() -> str:
    return kopf_requirement().split("==", 1)[1]


def machine() -> str:
    model = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.machine(),
    )  # fmt: skip
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{os.cpu_count()} cores ({model}), {memory:.0f} GiB, Python {platform.python_version()}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--objects", type=int, default=1000, help="Greetings to converge (default 1000)")
    parser.add_argument("--workers", type=int, default=16, help="kanri's concurrent reconciles = the plain loop's")
    parser.add_argument("--only", default=",".join(CONTESTANTS), help="comma-separated: kanri,plain,kopf")
    parser.add_argument("--changes", type=int, default=50, help="spec changes for the latency measurement")
    parser.add_argument("--change-rate", type=float, default=10.0, help="spec changes per second")
    parser.add_argument("--resync-period", type=float, default=5.0, help="kanri's resync period in the resync run")
    parser.add_argument("--repeat", type=int, default=3, help="convergence runs per contestant; medians reported")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a contestant may take to converge")
    parser.add_argument("--profile", help="run kanri's operator under cProfile into this file (slows it down)")
    parser.add_argument("--keep-logs", help="copy the contestants' logs into this directory")
    parser.add_argument("--json", help="also write the run's figures to this file as JSON (see figures())")
    args = parser.parse_args()
    chosen = [c.strip() for c in args.only.split(",") if c.strip()]
    if unknown := set(chosen) - set(CONTESTANTS):
        parser.error(f"unknown contestants: {', '.join(sorted(unknown))}")
    if "kopf" in chosen:
        ensure_bench_venv()

    # Rounds interleave the contestants, so that a burst of other work on the shared machine does not land on one.
    runs: dict[str, list[Measures]] = {name: [] for name in chosen}
    for round_ in range(args.repeat):
        for name in chosen:
            runs[name].append(run_contestant(name, args, full=round_ == 0))
    results = [merge(runs[name]) for name in chosen]
    command = " ".join(["python", "bench/runtime_operator.py", *sys.argv[1:]])
    print(f"### {args.objects} objects, {args.workers} workers, {args.repeat} run(s) per contestant\n")
    print(f"`{command}` — {datetime.now(UTC):%Y-%m-%d}, {machine()}\n")
    print(report(results, args))
    if args.json:
        document = {"command": command, "date": f"{datetime.now(UTC):%Y-%m-%d}", "machine": machine(),
                    "objects": args.objects, "workers": args.workers, "repeat": args.repeat,
                    "contestants": {r.name: figures(r) for r in results}}  # fmt: skip
        Path(args.json).write_text(json.dumps(document, indent=2) + "\n")


def figures(r: Measures) -> dict[str, Any]:
    """One contestant's numbers for ``--json``: ``seconds`` is process start → all converged (median of the runs);
    None where a figure was not measured for this contestant."""

    def per_object(value: float | None, scale: float = 1.0) -> float | None:
        return None if value is None else round(value / r.objects * scale, 4)

    return {
        "seconds": r.converge,
        "converge_runs": r.converge_runs,
        "objects_per_second": r.rate,
        "startup_seconds": r.startup,
        "cpu_seconds": r.cpu,
        "cpu_per_object_ms": per_object(r.cpu, 1000.0),
        "control_plane_cpu_seconds": r.control_plane_cpu,
        "reconciles_per_object": r.reconciles,
        "writes_per_object": r.api_writes,
        "reads_per_object": r.api_reads,
        "peak_rss_mib": r.peak_rss,
        "rss_converged_mib": r.rss_converged,
        "rss_cached_mib": r.rss_cached,
        "rss_empty_namespace_mib": r.rss_empty,
        "cache_kib_per_object": None
        if r.rss_cached is None or r.rss_empty is None
        else round((r.rss_cached - r.rss_empty) * 1024 / r.objects, 2),
        "restart_writes": r.restart_writes,
        "resync_writes": r.resync_writes,
        "configmap_latency_p50_p95": [percentile(r.configmap_latency, 50), percentile(r.configmap_latency, 95)],
        "status_latency_p50_p95": [percentile(r.status_latency, 50), percentile(r.status_latency, 95)],
        "load_average_1min": r.load,
        "notes": r.notes,
    }


if __name__ == "__main__":
    main()
