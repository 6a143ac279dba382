"""A Durable Cache under node faults, end to end (issue 31 "Done means"): three local nodes, one pod of ONE shared
cache on each, faults in sequence, a ledger client.

The ledger writes ``ledger:<n>`` (and ``clock = n``) to the writable primary and records every write ``WAIT 1``
confirmed; a watcher samples ``INFO replication`` of every pod that answers; a reader reads ``clock`` through
``<name>-ro``. Faults on the primary's node, each followed by its recovery before the next: node stopped (started
again), frozen (thawed), partitioned (healed) while the operator is stopped, and the primary's server killed three
times in a row. After each: 0 WAIT-confirmed writes lost, never two writable primaries, the time from the fault to
the first confirmed write printed (``-s``). With the operator stopped, a write through ``<name>-rw`` succeeds after
Sentinel's failover (the new primary's agent labelled its own pod, kanri.cache.agent.labels). Reads through ``-ro``
are never staler than the declared ``maxLagSeconds``: a read's staleness is how long before it a write newer than
what it returned was confirmed.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import os
import secrets
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import valkey.asyncio as valkey
from valkey.exceptions import ValkeyError

from kanri.cache.api import KIND, Cache
from kanri.cache.operator import controller
from kanri.local import Endpoint
from kanri.local.imagemap import default_image_map
from kanri.local.node import NodeHost, NodeOptions
from kanri.runtime import Client, Manager, ManagerOptions, install_crd
from kanri.runtime.kinds import POD, SERVICE
from tests.e2e.test_cache_e2e import Pods, ready, writable
from tests.local_node_support import init_pid, running_nodes, with_test_network
from tests.support import NotYet, eventually

pytestmark = [pytest.mark.timeout(420), pytest.mark.faults]
Obj = dict[str, Any]
NAME = "chaos"
MAX_LAG_SECONDS = 5
SPEC = {
    "dataPolicy": "Durable",
    "replicas": 3,
    "storage": {"size": "64Mi"},
    "downAfterMilliseconds": 1000,
    "durability": {"maxReplicaLagSeconds": 2},
    "readPolicy": {"serveFrom": "Replicas", "maxLagSeconds": MAX_LAG_SECONDS},
}


@pytest_asyncio.fixture(loop_scope="session")
async def host(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[NodeHost]:
    options = with_test_network(
        NodeOptions(
            data_dir=tmp_path / "nodes",
            name=f"test-cache-{secrets.token_hex(3)}",
            images=default_image_map(),
            restart_backoff_base=0.5,
            restart_backoff_max=2.0,
        )
    )
    async with running_nodes(control_plane.kubeconfig, options, count=3) as nodes:
        yield nodes


class Operator:
    """The Cache operator in this process, stopped and started again by the test."""

    def __init__(self, client: Client, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self.manager: Manager | None = None
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        options = ManagerOptions(name="cache-operator", namespace=self.namespace, leader_election=False,
                                 health_port=None)  # fmt: skip
        self.manager = Manager(self.client, options)
        self.manager.add(controller(self.manager))
        self.task = asyncio.create_task(self.manager.run(handle_signals=False))

    async def stop(self) -> None:
        if self.manager is not None and self.task is not None:
            self.manager.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.task, 20)
        self.manager = self.task = None


@contextlib.asynccontextmanager
async def cache_operator(control_plane: Endpoint, namespace: str) -> AsyncIterator[Operator]:
    """The Cache CRD installed and the controller running in this process, watching ``namespace``."""
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        await install_crd(client, Cache, field_manager="kanri-tests")
        running = Operator(client, namespace)
        running.start()
        try:
            yield running
        finally:
            await running.stop()


@pytest_asyncio.fixture(loop_scope="session")
async def operator(control_plane: Endpoint, namespace: str, host: NodeHost) -> AsyncIterator[Operator]:
    async with cache_operator(control_plane, namespace) as running:
        yield running


@dataclass
class Workload:
    """The ledger, the role watcher and the ``-ro`` reader, over one cache's pods."""

    pods: Pods
    ro: str
    acked: list[int] = field(default_factory=list)
    """Sequence numbers WAIT 1 confirmed, in order."""
    acked_at: list[float] = field(default_factory=list)
    acked_on: list[str] = field(default_factory=list)
    writable_counts: list[tuple[float, int]] = field(default_factory=list)
    staleness: list[float] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    seen: dict[str, Any] = field(default_factory=dict)
    """What :func:`converged` last saw (for a failure message)."""

    async def primary(self) -> str | None:
        """The pod IP of a primary that accepts writes (a cut-off one does not: min-replicas-to-write)."""
        ips = await self.pods.ips()
        for pod, info in (await self.pods.roles()).items():
            if info is not None and writable(info) and pod in ips:
                return ips[pod]
        return None

    async def write(self) -> None:
        sequence, conn, ip = 0, None, ""
        while not self.stop.is_set():
            if conn is None:
                ip = await self.primary() or ""
                conn = self.pods.connect(ip) if ip else None
                if conn is None:
                    await asyncio.sleep(0.05)
                continue
            try:
                await conn.mset({f"ledger:{sequence}": sequence, "clock": sequence})
                sequence += 1
                if int(await conn.execute_command("WAIT", 1, 500)) >= 1:  # type: ignore[no-untyped-call]
                    self.acked.append(sequence - 1)
                    self.acked_at.append(time.monotonic())
                    self.acked_on.append(ip)
            except (ValkeyError, OSError):
                await conn.aclose()
                conn = None
        if conn is not None:
            await conn.aclose()

    async def watch(self) -> None:
        while not self.stop.is_set():
            roles = await self.pods.roles()
            self.writable_counts.append((time.monotonic(), sum(1 for i in roles.values() if i and writable(i))))
            await asyncio.sleep(0.2)

    async def read(self) -> None:
        conn = self.pods.connect(self.ro)
        try:
            while not self.stop.is_set():
                try:
                    value = await conn.get("clock")
                except (ValkeyError, OSError):  # a replica re-syncing refuses reads (replica-serve-stale-data no)
                    await asyncio.sleep(0.05)
                    continue
                if value is not None:
                    self.staleness.append(self.stale_by(int(value), time.monotonic()))
                await asyncio.sleep(0.05)
        finally:
            await conn.aclose()

    def stale_by(self, value: int, read_at: float) -> float:
        """How long before ``read_at`` a write newer than ``value`` had been confirmed (0: none had)."""
        newer = bisect.bisect_right(self.acked, value)
        return max(0.0, read_at - self.acked_at[newer]) if newer < len(self.acked) else 0.0

    def first_ack_after(self, moment: float) -> float | None:
        index = bisect.bisect_right(self.acked_at, moment)
        return self.acked_at[index] if index < len(self.acked_at) else None

    def most_writable_since(self, moment: float) -> int:
        return max((count for at, count in self.writable_counts if at >= moment), default=0)

    async def missing(self) -> list[int]:
        """The confirmed writes the writable primary lacks."""
        ip = await self.primary()
        assert ip is not None
        conn = self.pods.connect(ip)
        lost: list[int] = []
        try:
            for start in range(0, len(self.acked), 1000):
                chunk = self.acked[start : start + 1000]
                async with conn.pipeline(transaction=False) as pipe:
                    for n in chunk:
                        pipe.exists(f"ledger:{n}")
                    found = await pipe.execute()
                lost += [n for n, present in zip(chunk, found, strict=True) if not present]
        finally:
            await conn.aclose()
        return lost


async def write_through(pods: Pods, address: str, last: list[str]) -> bool | None:
    """True once a write through the Service ``address`` succeeds: a new connection each time (the service proxy
    picks an endpoint per connection; a partitioned old primary may still be one); ``last`` gets the error."""
    conn = pods.connect(address)
    try:
        await conn.set("rw-probe", "1")
        return True
    except (ValkeyError, OSError) as exc:
        last[:] = [f"{type(exc).__name__}: {exc}"]
        return None
    finally:
        await conn.aclose()


async def all_through(pods: Pods, address: str, count: int) -> float | None:
    """The time once ``count`` writes through ``address`` in a row succeed, each on a new connection (so no endpoint
    that refuses or drops them is left)."""
    for _ in range(count):
        if not await write_through(pods, address, []):
            return None
    return time.monotonic()


async def only_primary_labelled(workload: Workload, client: Client, namespace: str,
                                seen: list[dict[str, str | None]]) -> bool:  # fmt: skip
    """Exactly one pod carries the ``primary`` role label: the writable primary's."""
    ip = await workload.primary()
    listed, _ = await client.list(POD, namespace, label_selector=f"cache.kanri.dev/cache={NAME}")
    labels = {p["metadata"]["name"]: p["metadata"]["labels"].get("cache.kanri.dev/role") for p in listed}
    seen[:] = [labels]
    primary = [p["metadata"]["name"] for p in listed if (p.get("status") or {}).get("podIP") == ip]
    return len(primary) == 1 and [name for name, role in labels.items() if role == "primary"] == primary


STORY = ("role decision", "stepping down", "catching up", "+switch-master", "+selected-slave", "+promoted-slave",
         "+failover-end", "+slave-reconf-sent", "+odown", "Full resync", "Partial resynchronization",
         "MASTER <-> REPLICA")  # fmt: skip


def story(root: Path, since: float) -> str:
    """The agents' decisions and Sentinel's failover steps from the container logs under ``root`` (for a failure)."""
    lines = []
    for path in sorted(root.rglob("pods/*/*/*.log")):
        if path.stat().st_mtime < since:
            continue
        for line in path.read_text(errors="replace").splitlines():
            if any(mark in line for mark in STORY):
                lines.append(f"{path.parent.parent.name.split('_')[1]}/{path.parent.name}: {line[:300]}")
    return "\n".join(lines[-150:])


async def primary_pod(workload: Workload, client: Client, namespace: str) -> tuple[str, str]:
    """The writable primary's pod and its node."""

    async def find() -> str | None:
        ip = await workload.primary()
        return next((pod for pod, pod_ip in (await workload.pods.ips()).items() if pod_ip == ip), None)

    pod = await eventually(find, timeout=30)
    return pod, str((await client.get(POD, pod, namespace))["spec"]["nodeName"])


async def sentinels_name(pods: Pods) -> list[tuple[str, str]]:
    """Each Sentinel's primary (pod name) and flags, as ``SENTINEL MASTER`` reports them."""
    ips = await pods.ips()
    named: list[tuple[str, str]] = []
    for ip in ips.values():
        sentinel = valkey.Valkey(host=ip, port=26379, password=pods.password, socket_timeout=1.0,
                                 socket_connect_timeout=1.0, decode_responses=True)  # fmt: skip
        try:
            answer = await sentinel.execute_command("SENTINEL", "MASTER", pods.name)  # type: ignore[no-untyped-call]
        except (ValkeyError, OSError) as exc:
            named.append(("?", type(exc).__name__))
            continue
        finally:
            await sentinel.aclose()
        fields = dict(zip(answer[::2], answer[1::2], strict=True)) if isinstance(answer, list) else dict(answer)
        named.append((str(fields["ip"]).split(".")[0], str(fields["flags"])))
    return named


async def converged(workload: Workload) -> bool:
    """One writable primary, every other pod its replica with the link up, every Sentinel knowing both replicas."""
    roles = await workload.pods.roles()
    workload.seen = {pod: None if i is None else (i.get("role"), i.get("master_host"), i.get("master_link_status"),
                                                  i.get("master_repl_offset")) for pod, i in roles.items()}  # fmt: skip
    if len(roles) != 3 or any(info is None for info in roles.values()):
        return False
    primaries = [info for info in roles.values() if info is not None and writable(info)]
    linked = [info for info in roles.values() if info is not None and info.get("master_link_status") == "up"]
    if len(primaries) != 1 or len(linked) != 2:
        return False
    workload.seen["sentinels know both replicas"] = await workload.pods.sentinels_know_replicas(2)
    if not workload.seen["sentinels know both replicas"]:
        return False
    primary = next(pod for pod, info in roles.items() if info is not None and writable(info))
    workload.seen["sentinels name"] = named = await sentinels_name(workload.pods)
    # a fault injected while a Sentinel still finishes a failover can leave it stuck for failover-timeout (3 min)
    return named == [(primary, "master")] * len(roles)


Fault = Callable[[str, str], Awaitable[None]]


async def run_fault(workload: Workload, client: Client, namespace: str, label: str, inject: Fault, recover: Fault,
                    results: list[str], logs: Path) -> None:  # fmt: skip
    """Inject a fault on the primary, wait for a confirmed write after it, recover, wait until converged; check."""
    pod, node = await primary_pod(workload, client, namespace)
    before = len(workload.acked)
    await inject(pod, node)
    fault_at = time.monotonic()  # once in place: a write confirmed while the fault was being applied does not count
    first = await eventually(lambda: asyncio.sleep(0, workload.first_ack_after(fault_at)), timeout=60)
    await recover(pod, node)
    try:
        await eventually(lambda: converged(workload), timeout=120, interval=0.5)
    except NotYet as exc:
        raise AssertionError(f"{label}: not converged: {workload.seen}\n{story(logs, 0)}") from exc
    await eventually(lambda: asyncio.sleep(0, len(workload.acked) > before + 50 or None), timeout=30)
    lost, most = await workload.missing(), workload.most_writable_since(fault_at)
    results.append(
        f"{label} ({pod} on {node}): writes confirmed again {first - fault_at:.2f} s after the fault; "
        f"{len(lost)} of {len(workload.acked)} confirmed writes lost; at most {most} writable primaries"
    )
    print(results[-1])
    if lost:
        where = [workload.acked_on[workload.acked.index(n)] for n in lost]
        print(f"lost {lost} confirmed on {where}; last confirmed {workload.acked[-1]}\n{story(logs, 0)}")
    assert not lost, results[-1]
    assert most <= 1, results[-1]


async def test_a_durable_cache_keeps_every_confirmed_write_through_node_faults(
    operator: Operator, host: NodeHost, namespace: str, tmp_path: Path
) -> None:
    client = operator.client
    await client.create(KIND, {"metadata": {"name": NAME, "namespace": namespace}, "spec": SPEC})
    await eventually(lambda: ready(client, namespace, NAME), timeout=180, interval=1)
    pods = Pods(client, namespace, NAME)
    await pods.load_password()
    listed, _ = await client.list(POD, namespace, label_selector=f"cache.kanri.dev/cache={NAME}")
    assert len({p["spec"]["nodeName"] for p in listed}) == 3, "one pod per node (the scheduler spreads them)"
    ro = str((await client.get(SERVICE, f"{NAME}-ro", namespace))["spec"]["clusterIP"])
    rw = str((await client.get(SERVICE, f"{NAME}-rw", namespace))["spec"]["clusterIP"])
    workload = Workload(pods, ro)
    await eventually(lambda: converged(workload), timeout=60, interval=1)
    tasks = [asyncio.create_task(t) for t in (workload.write(), workload.watch(), workload.read())]
    results: list[str] = []

    def verb(name: str) -> Fault:
        async def act(_pod: str, node: str) -> None:
            assert await host.chaos(name, node)

        return act

    async def kill(pod: str, node: str) -> None:
        pid = init_pid(host.node(node), namespace, pod, container="valkey")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

    async def nothing(_pod: str, _node: str) -> None:
        return None

    partitioned_at: list[float] = []

    async def partition_without_operator(pod: str, node: str) -> None:
        await operator.stop()
        await verb("partition")(pod, node)
        partitioned_at.append(time.monotonic())

    async def heal_and_restart_operator(pod: str, node: str) -> None:
        # still without the operator: -rw follows the failover because the new primary's agent labelled its pod
        last: list[str] = []
        try:
            await eventually(lambda: write_through(pods, rw, last), timeout=30, interval=0.2)
        except NotYet as exc:
            listed, _ = await client.list(POD, namespace, label_selector=f"cache.kanri.dev/cache={NAME}")
            labels = {p["metadata"]["name"]: p["metadata"]["labels"].get("cache.kanri.dev/role") for p in listed}
            raise AssertionError(f"no write through -rw with the operator down: {last}; role labels {labels}") from exc
        direct = workload.first_ack_after(partitioned_at[-1])
        assert direct is not None
        first_rw = time.monotonic() - direct
        # the cut-off old primary cannot unlabel itself: the new primary's agent takes the label from it, so -rw
        # stops sending connections there long before the node is marked NotReady (20 s)
        labelled: list[dict[str, str | None]] = []
        try:
            await eventually(lambda: only_primary_labelled(workload, client, namespace, labelled), timeout=15)
        except NotYet as exc:
            raise AssertionError(f"with the operator down, role labels stay {labelled}") from exc
        alone = await eventually(lambda: all_through(pods, rw, 10), timeout=15, interval=0.2)
        assert operator.task is None, "the operator stayed down"
        results.append(f"operator down: a write through -rw succeeded {first_rw:.2f} s after the first confirmed "
                       f"write to the new primary; 10 of 10 new -rw connections wrote {alone - direct:.2f} s after "
                       f"it")  # fmt: skip
        print(results[-1])
        await verb("heal")(pod, node)
        operator.start()

    try:
        await eventually(lambda: asyncio.sleep(0, len(workload.acked) > 100 or None), timeout=30)
        partitioned = ("node partitioned, operator stopped", partition_without_operator, heal_and_restart_operator)
        faults = [*[(f"server killed ({n}/3)", kill, nothing) for n in (1, 2, 3)],
                  ("node stopped", verb("stop"), verb("start")), ("node frozen", verb("freeze"), verb("thaw")),
                  partitioned]  # fmt: skip
        for label, inject, recover in faults:
            await run_fault(workload, client, namespace, label, inject, recover, results, tmp_path)
        await eventually(lambda: ready(client, namespace, NAME), timeout=60, interval=1)
    finally:
        workload.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    stalest = max(workload.staleness, default=0.0)
    print(f"reads through -ro: {len(workload.staleness)}, stalest {stalest:.2f} s (maxLagSeconds {MAX_LAG_SECONDS})")
    assert len(workload.staleness) > 100, "the -ro reader read"
    assert stalest <= MAX_LAG_SECONDS, f"a read through -ro was {stalest:.2f} s stale"


async def test_a_regenerable_cache_fails_over_from_a_stopped_node_without_wiping_a_replica_and_reports_it(
    operator: Operator, host: NodeHost, namespace: str, tmp_path: Path
) -> None:
    """Regenerable (no persistence, emptyDir): the primary's node stops and starts again. Sentinel promotes a replica;
    the old pod, whose server comes back without persistence, follows the new primary and is never a source: no
    surviving replica's key count ever drops (the anchors' wipe), no WAIT-confirmed write is lost, never two writable
    primaries, and the failover is in status naming the pod it left."""
    client, name = operator.client, "scratch"
    spec = {"dataPolicy": "Regenerable", "replicas": 3, "downAfterMilliseconds": 1000,
            "readPolicy": {"serveFrom": "Replicas", "maxLagSeconds": MAX_LAG_SECONDS}}  # fmt: skip
    await client.create(KIND, {"metadata": {"name": name, "namespace": namespace}, "spec": spec})
    await eventually(lambda: ready(client, namespace, name), timeout=180, interval=1)
    pods = Pods(client, namespace, name)
    await pods.load_password()
    workload = Workload(pods, str((await client.get(SERVICE, f"{name}-ro", namespace))["spec"]["clusterIP"]))
    try:
        await eventually(lambda: converged(workload), timeout=60, interval=1)
    except NotYet as exc:
        raise AssertionError(f"not converged before the fault: {workload.seen}") from exc
    old, _ = await primary_pod(workload, client, namespace)
    first: dict[str, int] = {}
    lowest: dict[str, int] = {}

    async def watch_replicas() -> None:  # keys only grow: a count below the first one seen is a wipe
        while not workload.stop.is_set():
            for pod, info in (await pods.roles()).items():
                if pod != old and info is not None and "keys" in info:
                    first.setdefault(pod, info["keys"])
                    lowest[pod] = min(lowest.get(pod, info["keys"]), info["keys"])
            await asyncio.sleep(0.1)

    tasks = [asyncio.create_task(t) for t in (workload.write(), workload.watch(), workload.read())]
    results: list[str] = []
    try:
        await eventually(lambda: asyncio.sleep(0, len(workload.acked) > 200 or None), timeout=30)
        tasks.append(asyncio.create_task(watch_replicas()))
        await eventually(lambda: asyncio.sleep(0, len(lowest) == 2 or None), timeout=30)

        async def stop(_pod: str, node: str) -> None:
            assert await host.chaos("stop", node)

        async def start(_pod: str, node: str) -> None:
            assert await host.chaos("start", node)

        await run_fault(workload, client, namespace, "node stopped (Regenerable)", stop, start, results, tmp_path)
    finally:
        workload.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    print(f"Regenerable: key counts on the other pods, first seen {first}, lowest during the fault {lowest}")
    assert len(lowest) == 2, f"both other pods watched: {lowest}"
    assert all(lowest[pod] >= first[pod] > 0 for pod in lowest), f"a replica was wiped: {first} -> {lowest}"

    async def recorded() -> Obj | None:
        status = (await client.get(KIND, name, namespace)).get("status") or {}
        failovers = [f for f in status.get("failovers") or [] if f.get("fromPod") == old]
        return failovers[-1] if failovers else None

    record = await eventually(recorded, timeout=60, interval=1)
    print(f"Regenerable failover record: {record}")
    assert record["toPod"] != old
