"""The Cache operator end to end on a local node: real pods running the agent, valkey-server and Sentinel.

- Durable: Ready with one primary and two replicas; a ledger writing through the primary with ``WAIT 1`` records
  every acknowledged-and-replicated write; the primary's pod is killed (deleted, no grace); Sentinel fails over
  without the operator; 0 such writes lost, never two primaries seen, the failover recorded in status.
- Regenerable: the primary's server stops and its container restarts empty in the same pod (same address); no
  replica ever loses a key (the anchors' data-wiping bug), a replica is promoted, the restarted pod follows it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
import valkey.asyncio as valkey
from valkey.exceptions import ValkeyError

from kanri.cache.api import KIND, Cache
from kanri.cache.operator import controller
from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.runtime import Client, Manager, ManagerOptions, get_condition, install_crd
from kanri.runtime.kinds import EVENT, POD, PVC, SECRET, STATEFUL_SET
from tests.support import eventually

pytestmark = [pytest.mark.timeout(300), pytest.mark.faults]
Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def operator(control_plane: Endpoint, namespace: str, node: LocalNode) -> AsyncIterator[Client]:
    """The Cache CRD installed and the operator running in this process, watching the test's namespace."""
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        await install_crd(client, Cache, field_manager="kanri-tests")
        manager = Manager(client, ManagerOptions(name="cache-operator", namespace=namespace, leader_election=False,
                                                 health_port=None))  # fmt: skip
        manager.add(controller(manager))
        task = asyncio.create_task(manager.run(handle_signals=False))
        try:
            yield client
        finally:
            manager.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 20)


async def ready(client: Client, namespace: str, name: str) -> Obj | None:
    found = await client.get(KIND, name, namespace)
    status = found.get("status") or {}
    condition = get_condition(status.get("conditions"), "Ready")
    return found if condition is not None and condition["status"] == "True" else None


class Pods:
    """The cache's pods by IP, spoken to with the cache's password (read from its Secret, never printed)."""

    def __init__(self, client: Client, namespace: str, name: str) -> None:
        self.client, self.namespace, self.name = client, namespace, name
        self.password = ""

    async def load_password(self) -> None:
        secret = await self.client.get(SECRET, f"{self.name}-password", self.namespace)
        self.password = base64.b64decode(secret["data"]["password"]).decode()

    async def ips(self) -> dict[str, str]:
        pods, _ = await self.client.list(POD, self.namespace, label_selector=f"cache.kanri.dev/cache={self.name}")
        return {p["metadata"]["name"]: p["status"]["podIP"] for p in pods
                if (p.get("status") or {}).get("podIP") and not p["metadata"].get("deletionTimestamp")}  # fmt: skip

    def connect(self, ip: str) -> valkey.Valkey:
        return valkey.Valkey(host=ip, port=6379, password=self.password, socket_timeout=1.0,
                             socket_connect_timeout=1.0, decode_responses=True)  # fmt: skip

    async def info(self, ip: str) -> dict[str, Any] | None:
        conn = self.connect(ip)
        try:
            replication = await conn.info("replication")
            keyspace = await conn.info("keyspace")
        except (ValkeyError, OSError):
            return None
        finally:
            await conn.aclose()
        keys = sum(int(db.get("keys", 0)) for db in keyspace.values() if isinstance(db, dict))
        return {**replication, "keys": keys}

    async def roles(self) -> dict[str, dict[str, Any] | None]:
        ips = await self.ips()
        answers = await asyncio.gather(*(self.info(ip) for ip in ips.values()))
        return dict(zip(ips, answers, strict=True))

    async def sentinels_know_replicas(self, replicas: int) -> bool:
        """Every Sentinel knows every replica (it learns them from the primary's INFO, every 10 s): before that, a
        failover would find no replica to promote."""
        for ip in (await self.ips()).values():
            sentinel = valkey.Valkey(host=ip, port=26379, password=self.password, socket_timeout=1.0,
                                     socket_connect_timeout=1.0, decode_responses=True)  # fmt: skip
            try:
                known = await sentinel.execute_command("SENTINEL", "REPLICAS", self.name)  # type: ignore[no-untyped-call]
            except (ValkeyError, OSError):
                return False
            finally:
                await sentinel.aclose()
            if len(known) != replicas:
                return False
        return True

    async def primary_ip(self) -> str | None:
        ips = await self.ips()
        for pod, info in (await self.roles()).items():
            if info is not None and info.get("role") == "master" and pod in ips:
                return ips[pod]
        return None


async def ledger(pods: Pods, stop: asyncio.Event, acknowledged: list[str], acks: list[tuple[float, str]]) -> None:
    """Writes ``ledger:<n>`` through the primary with WAIT 1; records those a replica confirmed (and when, on which
    primary)."""
    sequence, conn, ip = 0, None, None
    while not stop.is_set():
        if conn is None:
            ip = await pods.primary_ip()
            conn = pods.connect(ip) if ip else None
            if conn is None:
                await asyncio.sleep(0.1)
            continue
        try:
            await conn.set(f"ledger:{sequence}", sequence)
            sequence += 1
            if int(await conn.execute_command("WAIT", 1, 500)) >= 1:  # type: ignore[no-untyped-call]
                acknowledged.append(f"ledger:{sequence - 1}")
                acks.append((time.monotonic(), str(ip)))
        except (ValkeyError, OSError):
            await conn.aclose()
            conn = None
    if conn is not None:
        await conn.aclose()


def writable(info: dict[str, Any]) -> bool:
    """A primary that accepts writes: with min-replicas-to-write (Durable), only while it has a good replica."""
    return info.get("role") == "master" and int(info.get("min_slaves_good_slaves", 1)) >= 1


async def watch_primaries(pods: Pods, stop: asyncio.Event, counts: list[int]) -> None:
    while not stop.is_set():
        roles = await pods.roles()
        counts.append(sum(1 for info in roles.values() if info is not None and writable(info)))
        await asyncio.sleep(0.2)


async def test_durable_cache_loses_no_replicated_write_when_the_primary_pod_is_killed(
    operator: Client, namespace: str
) -> None:
    client = operator
    spec = {"dataPolicy": "Durable", "replicas": 3, "storage": {"size": "64Mi"}, "downAfterMilliseconds": 1000}
    await client.create(KIND, {"metadata": {"name": "orders", "namespace": namespace}, "spec": spec})
    found = await eventually(lambda: ready(client, namespace, "orders"), timeout=180, interval=1)
    old = found["status"]["currentPrimary"]
    assert found["status"]["writablePrimaries"] == [old]
    pods = Pods(client, namespace, "orders")
    await pods.load_password()
    await eventually(lambda: pods.sentinels_know_replicas(2), timeout=60, interval=1)

    stop, acknowledged, acks, counts = asyncio.Event(), list[str](), list[tuple[float, str]](), list[int]()
    old_ip = (await pods.ips())[old]
    tasks = [asyncio.create_task(ledger(pods, stop, acknowledged, acks)),
             asyncio.create_task(watch_primaries(pods, stop, counts))]  # fmt: skip

    async def acknowledged_beyond(count: int) -> bool:
        return len(acknowledged) > count

    await eventually(lambda: acknowledged_beyond(200), timeout=60)
    killed_at = time.monotonic()
    await client.delete(POD, old, namespace, grace_period_seconds=0)

    async def failed_over() -> Obj | None:
        current = await ready(client, namespace, "orders")
        if current is not None and current["status"]["currentPrimary"] != old and current["status"]["failovers"]:
            return current
        return None

    after = await eventually(failed_over, timeout=120, interval=1)
    before = len(acknowledged)
    await eventually(lambda: acknowledged_beyond(before + 100), timeout=60)
    stop.set()
    await asyncio.gather(*tasks)

    resumed = min(t for t, ip in acks if t > killed_at and ip != old_ip) - killed_at
    print(f"\nDurable: {len(acknowledged)} acknowledged-and-replicated writes; writes accepted again on a new "
          f"primary {resumed:.2f} s after its pod was killed; failovers {after['status']['failovers']}")  # fmt: skip
    primary = await pods.primary_ip()
    assert primary is not None
    conn = pods.connect(primary)
    try:
        present = int(await conn.exists(*acknowledged))
    finally:
        await conn.aclose()
    assert present == len(acknowledged), f"{len(acknowledged) - present} acknowledged-and-replicated writes lost"
    assert max(counts) == 1, f"two writable primaries seen at once: {counts}"
    assert after["status"]["failovers"][-1]["fromPod"] == old


async def test_regenerable_primary_restarted_empty_never_wipes_a_replica(operator: Client, namespace: str) -> None:
    client = operator
    spec = {"dataPolicy": "Regenerable", "replicas": 3, "downAfterMilliseconds": 1000}
    await client.create(KIND, {"metadata": {"name": "sessions", "namespace": namespace}, "spec": spec})
    found = await eventually(lambda: ready(client, namespace, "sessions"), timeout=180, interval=1)
    old = found["status"]["currentPrimary"]
    pods = Pods(client, namespace, "sessions")
    await pods.load_password()
    ips = await pods.ips()
    conn = pods.connect(ips[old])
    try:
        for start in range(0, 2000, 500):
            async with conn.pipeline(transaction=False) as pipe:
                for i in range(start, start + 500):
                    pipe.set(f"key:{i}", i)
                await pipe.execute()
        assert int(await conn.execute_command("WAIT", 2, 5000)) == 2  # type: ignore[no-untyped-call]
    finally:
        await conn.aclose()
    await eventually(lambda: pods.sentinels_know_replicas(2), timeout=60, interval=1)

    stop, lowest = asyncio.Event(), dict[str, int]()

    async def watch_replicas() -> None:  # the fewest keys each replica held at any moment
        while not stop.is_set():
            for pod, info in (await pods.roles()).items():
                if pod != old and info is not None:
                    lowest[pod] = min(lowest.get(pod, info["keys"]), info["keys"])
            await asyncio.sleep(0.05)

    watcher = asyncio.create_task(watch_replicas())
    conn = pods.connect(ips[old])
    with contextlib.suppress(ValkeyError, OSError):  # the server goes away while answering
        await conn.execute_command("SHUTDOWN", "NOSAVE", "NOW", "FORCE")  # type: ignore[no-untyped-call]
    await conn.aclose()

    async def recovered() -> Obj | None:
        current = await ready(client, namespace, "sessions")
        if current is None or current["status"]["currentPrimary"] == old or not current["status"]["failovers"]:
            return None
        back = (await pods.roles()).get(old)
        return current if back is not None and back.get("role") == "slave" and back["keys"] == 2000 else None

    after = await eventually(recovered, timeout=120, interval=1)
    stop.set()
    await watcher
    print(
        f"\nRegenerable: lowest key counts on the replicas during the restart {lowest}; "
        f"failovers {after['status']['failovers']}"
    )
    assert len(lowest) == 2, f"both replicas watched: {lowest}"
    assert all(keys == 2000 for keys in lowest.values()), f"a replica lost keys: {lowest}"


async def sentinel_peers(pods: Pods) -> dict[str, int]:
    """How many other Sentinels each pod's Sentinel knows (``SENTINEL SENTINELS NAME``); -1 for one that does not
    answer."""
    known: dict[str, int] = {}
    for pod, ip in (await pods.ips()).items():
        sentinel = valkey.Valkey(host=ip, port=26379, password=pods.password, socket_timeout=1.0,
                                 socket_connect_timeout=1.0, decode_responses=True)  # fmt: skip
        try:
            known[pod] = len(await sentinel.execute_command("SENTINEL", "SENTINELS", pods.name))  # type: ignore[no-untyped-call]
        except (ValkeyError, OSError):
            known[pod] = -1
        finally:
            await sentinel.aclose()
    return known


async def sentinels_forgot_the_replaced(pods: Pods, live: int) -> dict[str, int] | None:
    known = await sentinel_peers(pods)
    return known if len(known) == live and all(count == live - 1 for count in known.values()) else None


async def track_replacements(client: Client, namespace: str, name: str, stop: asyncio.Event,
                             order: list[str]) -> None:  # fmt: skip
    """Appends each pod's name the first time it is seen with a uid other than its first one (deleted counts too)."""
    first: dict[str, str] = {}
    while not stop.is_set():
        items, _ = await client.list(POD, namespace, label_selector=f"cache.kanri.dev/cache={name}")
        for pod in items:
            meta = pod["metadata"]
            uid = first.setdefault(meta["name"], meta["uid"])
            if (uid != meta["uid"] or meta.get("deletionTimestamp")) and meta["name"] not in order:
                order.append(meta["name"])
        await asyncio.sleep(0.2)


async def watch_roles(pods: Pods, stop: asyncio.Event, counts: list[int], primaries: list[str]) -> None:
    """:func:`watch_primaries`, and the sequence of pods seen as the only primary (each change appended once)."""
    while not stop.is_set():
        roles = await pods.roles()
        counts.append(sum(1 for info in roles.values() if info is not None and writable(info)))
        masters = [pod for pod, info in roles.items() if info is not None and info.get("role") == "master"]
        if len(masters) == 1 and (not primaries or primaries[-1] != masters[0]):
            primaries.append(masters[0])
        await asyncio.sleep(0.2)


async def settled(client: Client, namespace: str, name: str, pods: int) -> tuple[Obj, list[Obj]] | None:
    """The latest spec observed by the operator and the StatefulSet controller, then Ready, ``Updating`` False,
    exactly ``pods`` pods and each one made from the StatefulSet's current template."""
    current = await ready(client, namespace, name)
    if current is None or current["status"].get("observedGeneration") != current["metadata"]["generation"]:
        return None
    updating = get_condition(current["status"].get("conditions"), "Updating")
    sts = await client.get(STATEFUL_SET, name, namespace)
    if (sts.get("status") or {}).get("observedGeneration") != sts["metadata"]["generation"]:
        return None
    revision = sts["status"].get("updateRevision")
    items, _ = await client.list(POD, namespace, label_selector=f"cache.kanri.dev/cache={name}")
    made = all(p["metadata"]["labels"].get("controller-revision-hash") == revision for p in items)
    if updating is None or updating["status"] != "False" or not made or len(items) != pods:
        return None
    return current, items


async def status_names_the_primary(client: Client, pods: Pods) -> Obj | None:
    """Ready, and ``status.currentPrimary`` is the pod that answers as the only primary."""
    current = await ready(client, pods.namespace, pods.name)
    masters = [pod for pod, info in (await pods.roles()).items() if info is not None and info.get("role") == "master"]
    return current if current is not None and masters == [current["status"]["currentPrimary"]] else None


async def test_durable_rollout_replaces_every_pod_primary_last_then_scales_down_keeping_the_volume(
    operator: Client, namespace: str
) -> None:
    """A resources change replaces all 3 pods (replicas first, one planned switchover, the old primary last) while a
    WAIT 1 ledger writes; then 3 -> 2 pods: the leaving pod is never the primary, its volume stays (Retain), and the
    Sentinels forget the leaving pod's Sentinel (SENTINEL RESET)."""
    client, name = operator, "rolled"
    spec = {"dataPolicy": "Durable", "replicas": 3, "storage": {"size": "64Mi"}, "downAfterMilliseconds": 1000}
    await client.create(KIND, {"metadata": {"name": name, "namespace": namespace}, "spec": spec})
    found = await eventually(lambda: ready(client, namespace, name), timeout=180, interval=1)
    old = found["status"]["currentPrimary"]
    pods = Pods(client, namespace, name)
    await pods.load_password()
    await eventually(lambda: pods.sentinels_know_replicas(2), timeout=60, interval=1)
    before_pods, _ = await client.list(POD, namespace, label_selector=f"cache.kanri.dev/cache={name}")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in before_pods}

    stop, acknowledged, acks, counts = asyncio.Event(), list[str](), list[tuple[float, str]](), list[int]()
    order, primaries = list[str](), list[str]()
    tasks = [asyncio.create_task(ledger(pods, stop, acknowledged, acks)),
             asyncio.create_task(watch_roles(pods, stop, counts, primaries)),
             asyncio.create_task(track_replacements(client, namespace, name, stop, order))]  # fmt: skip

    async def acknowledged_beyond(count: int) -> bool:
        return len(acknowledged) > count

    await eventually(lambda: acknowledged_beyond(200), timeout=60)
    started = time.monotonic()
    await client.patch(KIND, name, {"spec": {"resources": {"requests": {"cpu": "10m"}}}}, namespace)
    after, items = await eventually(lambda: settled(client, namespace, name, 3), timeout=240, interval=1)
    rolled_in, seen_primaries = time.monotonic() - started, list(primaries)
    replaced = {p["metadata"]["name"] for p in items if p["metadata"]["uid"] != uids.get(p["metadata"]["name"])}
    assert replaced == set(uids), f"pods not replaced: {set(uids) - replaced}"
    replicas_first = sorted((pod for pod in uids if pod != old), key=lambda pod: -int(pod.rsplit("-", 1)[1]))
    assert order == [*replicas_first, old], f"replaced in this order: {order} (the primary was {old})"
    planned = [f for f in after["status"]["failovers"] if f["reason"].startswith("planned switchover")]
    assert [(f["fromPod"], f["possibleLossBytes"]) for f in planned] == [(old, 0)], after["status"]["failovers"]
    assert len(after["status"]["failovers"]) == 1, f"a failover besides the planned one: {after['status']['failovers']}"
    assert seen_primaries == [old, planned[0]["toPod"]], f"the primary moved more than once: {seen_primaries}"
    print(f"\nrollout of 3 pods: {rolled_in:.1f} s, order {order}, planned switchover {old} -> {planned[0]['toPod']}")

    primary = after["status"]["currentPrimary"]
    started, primaries[:] = time.monotonic(), [primary]
    await client.patch(KIND, name, {"spec": {"replicas": 2}}, namespace)
    await eventually(lambda: settled(client, namespace, name, 2), timeout=180, interval=1)
    shrunk = await eventually(lambda: status_names_the_primary(client, pods), timeout=30, interval=1)
    print(f"scale-down 3 -> 2: {time.monotonic() - started:.1f} s; primaries seen {primaries}; "
          f"failovers {shrunk['status']['failovers'][1:]}")  # fmt: skip
    # the leaving pod's Sentinel has another address: only SENTINEL RESET makes the others forget it
    peers = await eventually(lambda: sentinels_forgot_the_replaced(pods, 2), timeout=90, interval=1)
    events, _ = await client.list(EVENT, namespace)
    resets = sum(1 for e in events if e.get("reason") == "SentinelReset")
    print(f"Sentinels know {peers} peers {time.monotonic() - started:.1f} s after the scale-down ({resets} resets)")
    before = len(acknowledged)
    await eventually(lambda: acknowledged_beyond(before + 100), timeout=60)
    stop.set()
    await asyncio.gather(*tasks)

    assert shrunk["status"]["currentPrimary"] in {f"{name}-0", f"{name}-1"}
    claims, _ = await client.list(PVC, namespace)
    assert f"data-{name}-2" in {c["metadata"]["name"] for c in claims}, "the removed pod's volume was not kept"
    primary_ip = await pods.primary_ip()
    assert primary_ip is not None
    conn = pods.connect(primary_ip)
    try:
        present = int(await conn.exists(*acknowledged))
    finally:
        await conn.aclose()
    print(f"{len(acknowledged)} confirmed writes; writable primaries seen at once: at most {max(counts)}")
    assert present == len(acknowledged), f"{len(acknowledged) - present} confirmed writes lost"
    assert max(counts) == 1, f"two writable primaries seen at once: {counts}"
