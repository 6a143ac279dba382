"""Three local nodes in three zones on the real control plane (kube-scheduler included), and the chaos verbs with
what the cluster makes of them. One node host for the whole module; most pods are pinned with ``spec.nodeName`` so a
test controls where they run, the placement tests leave it to kube-scheduler. Every test leaves its node running
again."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import secrets
import subprocess
import sys
from collections.abc import AsyncIterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.local.leftovers import find_leftovers
from kanri.local.node import LocalNode, NodeHost, NodeOptions
from kanri.local.node.control import call, serving
from kanri.local.node.kinds import NODE, NODE_LEASE_NAMESPACE, PERSISTENT_VOLUME
from kanri.runtime import Client, get_condition, parse_quantity
from kanri.runtime.kinds import LEASE, POD, PVC, SERVICE
from tests.local_node_support import init_pid, running_nodes, untainted, with_test_network
from tests.support import eventually

Obj = dict[str, Any]

# The system's interpreter: containers run as other users, who cannot enter /root (where pyenv lives).
PYTHON = "/usr/bin/python3"
SLEEPER = "kanri.dev/test/sleeper:1"
HTTP = "kanri.dev/test/http:1"
SHELL = "kanri.dev/test/sh:1"
IMAGES = [
    {"image": SLEEPER, "command": ["/usr/bin/sleep"], "args": ["3600"]},
    {"image": HTTP, "command": [PYTHON, "-m", "http.server", "8080", "--directory", "/etc"]},
    {"image": SHELL, "command": ["/bin/sh", "-c"]},
]
# Waits on the node-lifecycle controller: its --node-monitor-grace-period is 20 s here; 50 s leaves a margin on a busy
# machine.
NODE_MONITOR_GRACE_PERIOD = 50.0
ZONE = "topology.kubernetes.io/zone"


@pytest_asyncio.fixture(loop_scope="session", scope="module")
async def host(control_plane: Endpoint, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[NodeHost]:
    data_dir = tmp_path_factory.mktemp("nodes")
    options = with_test_network(
        NodeOptions(
            data_dir=data_dir,
            name=f"test-zones-{secrets.token_hex(3)}",
            images=IMAGES,
            heartbeat_interval=2.0,
            restart_backoff_base=0.2,
            restart_backoff_max=1.0,
        )
    )
    async with running_nodes(control_plane.kubeconfig, options, count=3) as running:
        yield running
    assert not find_leftovers(options), "the node host left something behind"


def pinned(name: str, namespace: str, node: LocalNode, image: str = SLEEPER, **spec: Any) -> Obj:
    container = {"name": "main", "image": image, **spec.pop("container", {})}
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node.name, "terminationGracePeriodSeconds": 2, "containers": [container], **spec},
    }


def condition(obj: Obj, kind: str) -> Obj | None:
    return get_condition((obj.get("status") or {}).get("conditions"), kind)


async def node_ready(client: Client, name: str) -> str | None:
    ready = condition(await client.get(NODE, name), "Ready")
    return None if ready is None else str(ready["status"])


async def running(client: Client, name: str, namespace: str, restarts: int = 0) -> Obj | None:
    live = await client.get(POD, name, namespace)
    statuses = (live.get("status") or {}).get("containerStatuses") or []
    ready = condition(live, "Ready")
    if (
        statuses
        and "running" in statuses[0]["state"]
        and statuses[0]["restartCount"] == restarts
        and ready is not None
        and ready["status"] == "True"
    ):
        return live
    return None


def process_state(pid: int) -> str | None:
    """The state letter of /proc/PID/stat (R, S, D, T, Z…), None when the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return None


async def renewed_at(client: Client, name: str) -> str:
    return str((await client.get(LEASE, name, NODE_LEASE_NAMESPACE))["spec"]["renewTime"])


async def heartbeats_pause(client: Client, silent: str, beating: str) -> None:
    """``silent``'s Lease stays as it is while ``beating``'s is renewed twice (a beat that was in flight as the
    node was silenced may land first: the baseline is taken after one renewal of the other's)."""

    async def renewed_after(previous: str) -> str | None:
        current = await renewed_at(client, beating)
        return current if current > previous else None

    mark = await eventually(functools.partial(renewed_after, await renewed_at(client, beating)), timeout=30)
    baseline = await renewed_at(client, silent)
    mark = await eventually(functools.partial(renewed_after, mark), timeout=30)
    await eventually(functools.partial(renewed_after, mark), timeout=30)
    assert await renewed_at(client, silent) == baseline


@contextlib.asynccontextmanager
async def restored(host: NodeHost, name: str) -> AsyncIterator[None]:
    """Whatever the test does to node ``name``, it is running and schedulable again afterwards."""
    try:
        yield
    finally:
        for verb in ("thaw", "heal", "start"):
            await host.chaos(verb, name)
        await eventually(lambda: untainted(host.client, name), timeout=NODE_MONITOR_GRACE_PERIOD + 60, interval=1)


# --- three nodes, three zones ---------------------------------------------------------------------------------------


async def test_three_nodes_register_in_three_zones_with_a_third_of_the_machine_each(
    client: Client, host: NodeHost
) -> None:
    zones = []
    for node in host.nodes:
        registered = await client.get(NODE, node.name)
        labels = registered["metadata"]["labels"]
        assert labels["kubernetes.io/hostname"] == node.name
        zones.append(labels["topology.kubernetes.io/zone"])
        assert await node_ready(client, node.name) == "True"
        cpu = parse_quantity(registered["status"]["capacity"]["cpu"])
        assert cpu == Decimal((os.cpu_count() or 1) * 1000 // 3) / 1000
        assert {"type": "InternalIP", "address": node.options.internal_ip} in registered["status"]["addresses"]
        lease = await client.get(LEASE, node.name, NODE_LEASE_NAMESPACE)
        assert lease["spec"]["holderIdentity"] == node.name
    assert zones == ["zone-a", "zone-b", "zone-c"]
    assert len({n.options.internal_ip for n in host.nodes}) == 3


async def test_each_node_runs_only_its_own_pods_with_addresses_from_its_slice(
    client: Client, host: NodeHost, namespace: str
) -> None:
    for index, node in enumerate(host.nodes):
        await client.create(POD, pinned(f"p{index}", namespace, node))
    for index, node in enumerate(host.nodes):
        live = await eventually(functools.partial(running, client, f"p{index}", namespace), timeout=60)
        assert live["status"]["hostIP"] == node.options.internal_ip
        assert live["status"]["podIP"].startswith(node.options.internal_ip.rsplit(".", 1)[0] + ".")
        assert [w.name for w in node.kubelet.workers.values()] == [f"p{index}"]


async def test_a_volume_is_made_on_the_disk_of_the_node_its_pod_landed_on(
    client: Client, host: NodeHost, namespace: str
) -> None:
    second = host.nodes[1]
    claim = {
        "metadata": {
            "name": "data",
            "namespace": namespace,
            # What kube-scheduler writes on a WaitForFirstConsumer claim once it has placed the pod.
            "annotations": {"volume.kubernetes.io/selected-node": second.name},
        },
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    await client.create(PVC, claim)
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    container = {"args": ["echo here > /data/where && exec sleep 3600"], "volumeMounts": [{"name": "data",
                 "mountPath": "/data"}]}  # fmt: skip
    await client.create(POD, pinned("writer", namespace, second, SHELL, container=container, volumes=volumes))
    await eventually(lambda: running(client, "writer", namespace), timeout=60)

    bound = await client.get(PVC, "data", namespace)
    assert bound["status"]["phase"] == "Bound"
    volume = await client.get(PERSISTENT_VOLUME, bound["spec"]["volumeName"])
    (term,) = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "kubernetes.io/hostname", "operator": "In", "values": [second.name]}]
    path = Path(volume["spec"]["local"]["path"])
    assert path.parent == second.options.volumes_dir.resolve()
    where = path / "where"
    await eventually(lambda: asyncio.to_thread(lambda: where.exists() and where.read_text() == "here\n"), timeout=30)
    await client.delete(POD, "writer", namespace)
    await client.delete(PVC, "data", namespace)


async def test_the_scheduler_places_a_pod_and_its_waiting_claim_on_a_node_of_the_asked_zone(
    client: Client, host: NodeHost, namespace: str
) -> None:
    second = host.nodes[1]
    claim = {
        "metadata": {"name": "zonal", "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }
    await client.create(PVC, claim)
    # WaitForFirstConsumer: nothing is provisioned before a pod using the claim is scheduled.
    assert (await client.get(PVC, "zonal", namespace))["status"]["phase"] == "Pending"
    volumes = [{"name": "data", "persistentVolumeClaim": {"claimName": "zonal"}}]
    body = pinned("placed", namespace, second, volumes=volumes, nodeSelector={ZONE: str(second.options.zone)})
    del body["spec"]["nodeName"]  # kube-scheduler's choice this time
    await client.create(POD, body)
    live = await eventually(lambda: running(client, "placed", namespace), timeout=90)
    assert live["spec"]["nodeName"] == second.name
    bound = await client.get(PVC, "zonal", namespace)
    assert bound["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == second.name
    volume = await client.get(PERSISTENT_VOLUME, bound["spec"]["volumeName"])
    (term,) = volume["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["values"] == [second.name]
    assert Path(volume["spec"]["local"]["path"]).parent == second.options.volumes_dir.resolve()


async def pending_message(client: Client, name: str, namespace: str) -> str | None:
    """The scheduler's PodScheduled=False message, once it has written one."""
    scheduled = condition(await client.get(POD, name, namespace), "PodScheduled")
    if scheduled is None or scheduled["status"] != "False":
        return None
    return str(scheduled.get("message") or "") or None


async def test_four_pods_with_required_hostname_anti_affinity_fill_three_nodes_and_one_waits(
    client: Client, host: NodeHost, namespace: str
) -> None:
    ours = [n.name for n in host.nodes]
    label = {"app": "spread"}
    affinity = {
        # Only this host's nodes (other tests' Nodes may exist in the session's control plane) ...
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ours}]}
                ]
            }
        },
        # ... and never two of these pods on one of them.
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": label}, "topologyKey": "kubernetes.io/hostname"}
            ]
        },
    }
    names = [f"spread-{i}" for i in range(4)]
    for name in names:
        body = pinned(name, namespace, host.nodes[0], affinity=affinity)
        del body["spec"]["nodeName"]  # kube-scheduler places them
        body["metadata"]["labels"] = label
        await client.create(POD, body)

    async def placement() -> dict[str, str] | None:
        pods = [await client.get(POD, name, namespace) for name in names]
        placed = {p["metadata"]["name"]: p["spec"]["nodeName"] for p in pods if p["spec"].get("nodeName")}
        return placed if len(placed) >= 3 else None

    placed = await eventually(placement, timeout=60)
    assert len(placed) == 3, placed
    assert sorted(placed.values()) == sorted(ours), placed  # one per node
    for name in placed:
        await eventually(functools.partial(running, client, name, namespace), timeout=90)
    (waiting,) = set(names) - set(placed)
    message = await eventually(functools.partial(pending_message, client, waiting, namespace), timeout=30)
    assert "3 node(s) didn't match pod anti-affinity rules" in message, message
    assert (await client.get(POD, waiting, namespace))["spec"].get("nodeName") is None  # still waiting, not bound


# --- stop / start -----------------------------------------------------------------------------------------------------


async def test_a_stopped_node_turns_unknown_with_its_containers_gone_and_comes_back_on_start(
    client: Client, host: NodeHost, namespace: str
) -> None:
    third = host.nodes[2]
    # Its own toleration: with the test cluster's 30 s default, a slow start/Ready on a busy machine would let the
    # taint manager evict it before the resync this test is about.
    tolerate = [{"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
                 "tolerationSeconds": 300}]  # fmt: skip
    await client.create(POD, pinned("victim", namespace, third, tolerations=tolerate))
    await eventually(lambda: running(client, "victim", namespace), timeout=60)
    pid = init_pid(third, namespace, "victim")
    assert pid is not None
    async with restored(host, third.name):
        assert await host.chaos("stop", third.name)
        assert not await host.chaos("stop", third.name)  # idempotent
        assert process_state(pid) in (None, "Z")  # killed at once, not after a grace period
        # The node-lifecycle controller's verdict once the grace period has passed without a heartbeat.
        await eventually(lambda: _unknown(client, third.name), timeout=NODE_MONITOR_GRACE_PERIOD + 60, interval=1)
        taints = (await client.get(NODE, third.name))["spec"].get("taints") or []
        assert "node.kubernetes.io/unreachable" in {t["key"] for t in taints}
        assert host.nodes[0].state.describe() == "Running"
        assert await node_ready(client, host.nodes[0].name) == "True"  # the others beat on

        assert await host.chaos("start", third.name)
        assert await eventually(lambda: _ready(client, third.name), timeout=60)
        # A rebooted kubelet's resync: the pod still bound here gets a fresh container, counted as a restart.
        live = await eventually(lambda: running(client, "victim", namespace, restarts=1), timeout=60)
        assert live["status"]["containerStatuses"][0]["lastState"]["terminated"]["reason"] == "Unknown"
        assert init_pid(third, namespace, "victim") not in (None, pid)


async def _unknown(client: Client, name: str) -> bool:
    return await node_ready(client, name) == "Unknown"


async def _ready(client: Client, name: str) -> bool:
    return await node_ready(client, name) == "True"


# --- freeze / thaw ----------------------------------------------------------------------------------------------------


def _frozen(pid: int) -> bool:
    # The v1 freezer parks a task in the kernel's refrigerator: /proc shows it as D (or T, by kernel version).
    return process_state(pid) in ("D", "T")


async def test_freeze_stops_every_process_of_the_node_at_once_and_thaw_resumes_them(
    client: Client, host: NodeHost, namespace: str
) -> None:
    first = host.nodes[0]
    await client.create(
        POD, pinned("icy", namespace, first, SHELL, container={"args": ["sleep 3600 & exec sleep 3600"]})
    )
    await client.create(POD, pinned("other", namespace, host.nodes[1]))
    await eventually(lambda: running(client, "icy", namespace), timeout=60)
    await eventually(lambda: running(client, "other", namespace), timeout=60)
    worker = next(w for w in first.kubelet.workers.values() if w.name == "icy")
    cgroup = worker.cgroups["main"]
    assert cgroup is not None
    # The init and its background sleep (sh may not have forked it yet when the pod first reports running).
    pids = await eventually(lambda: asyncio.sleep(0, p if len(p := cgroup.pids()) >= 2 else None), timeout=30)
    other = init_pid(host.nodes[1], namespace, "other")
    assert other is not None
    async with restored(host, first.name):
        assert await host.chaos("freeze", first.name)
        assert not await host.chaos("freeze", first.name)
        assert all(_frozen(pid) for pid in pids), [process_state(p) for p in pids]
        assert not _frozen(other)  # another node's pod runs on
        assert not first.state.acting  # heartbeats and kubelet paused
        await heartbeats_pause(client, first.name, host.nodes[1].name)

        assert await host.chaos("thaw", first.name)
        assert not any(_frozen(pid) for pid in pids), [process_state(p) for p in pids]
        assert first.state.acting
        await eventually(lambda: running(client, "icy", namespace), timeout=30)  # the same container, no restart


# --- partition / heal -------------------------------------------------------------------------------------------------


async def _connects(netns: str, address: str, port: int = 8080) -> bool:
    """Whether a TCP connection from inside network namespace ``netns`` to ``address:port`` opens (2 s)."""
    script = f"import socket,sys\ns=socket.socket(); s.settimeout(2)\nsys.exit(s.connect_ex(('{address}', {port})))\n"
    process = await asyncio.create_subprocess_exec(
        "nsenter", f"--net={netns}", sys.executable, "-c", script, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return await process.wait() == 0


async def _host_connects(address: str) -> bool:
    """Whether a process on the host (the usual source address) opens a connection to ``address:8080`` (2 s)."""
    try:
        async with asyncio.timeout(2):
            _, writer = await asyncio.open_connection(address, 8080)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


async def test_a_partitioned_nodes_pods_neither_reach_nor_are_reached_by_other_nodes_pods_until_healed(
    client: Client, host: NodeHost, namespace: str
) -> None:
    cut, other = host.nodes[0], host.nodes[1]
    # Ready only once it listens (probed from the node's own address, as during the partition).
    listening = {"readinessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 1}}
    await client.create(POD, pinned("inside", namespace, cut, HTTP, container=listening))
    await client.create(POD, pinned("outside", namespace, other, HTTP, container=listening))
    inside = await eventually(lambda: running(client, "inside", namespace), timeout=60)
    outside = await eventually(lambda: running(client, "outside", namespace), timeout=60)
    inside_ns = next(w.netns for w in cut.kubelet.workers.values() if w.name == "inside")
    outside_ns = next(w.netns for w in other.kubelet.workers.values() if w.name == "outside")
    assert inside_ns
    assert outside_ns
    inside_ip, outside_ip = inside["status"]["podIP"], outside["status"]["podIP"]
    assert await _connects(outside_ns, inside_ip)
    assert await _connects(inside_ns, outside_ip)
    api = await client.get(SERVICE, "kubernetes", "default")  # the API server, through its Service
    api_ip, api_port = api["spec"]["clusterIP"], api["spec"]["ports"][0]["port"]
    assert await _connects(inside_ns, api_ip, api_port)
    assert await _host_connects(inside_ip)
    async with restored(host, cut.name):
        assert await host.chaos("partition", cut.name)
        assert not await host.chaos("partition", cut.name)
        assert not await _connects(outside_ns, inside_ip)
        assert not await _connects(inside_ns, outside_ip)
        assert await _connects(inside_ns, inside_ip)  # its own pods still reach each other
        assert not await _connects(inside_ns, api_ip, api_port)  # nor the API server
        assert await _connects(outside_ns, api_ip, api_port)
        assert not await _host_connects(inside_ip)  # nor does anything else on the host (but the node's probes)
        assert not cut.state.acting  # its heartbeats and API calls pause (simulated: the node process is the host's)
        await heartbeats_pause(client, cut.name, other.name)

        assert await host.chaos("heal", cut.name)
        assert await _connects(inside_ns, api_ip, api_port)
        assert await _host_connects(inside_ip)
        assert await _connects(outside_ns, inside_ip)
        assert await _connects(inside_ns, outside_ip)
        # Its probes went on meanwhile (from the node's address): the pod is still Ready, never restarted.
        assert await eventually(lambda: running(client, "inside", namespace), timeout=30)


# --- the control endpoint ---------------------------------------------------------------------------------------------


async def test_the_control_socket_lists_the_nodes_and_runs_verbs(host: NodeHost, tmp_path: Path) -> None:
    path = tmp_path / "control.sock"
    async with serving(host, path):
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        listed = await call(path, "GET", "/nodes")
        assert [n["name"] for n in listed] == [n.name for n in host.nodes]
        assert {n["state"] for n in listed} == {"Running"}
        third = host.nodes[2].name
        async with restored(host, third):
            answer = await call(path, "POST", f"/nodes/{third}/partition")
            assert answer == {"node": {**answer["node"], "state": "Partitioned"}, "changed": True}
            assert (await call(path, "POST", f"/nodes/{third}/partition"))["changed"] is False
            assert (await call(path, "POST", f"/nodes/{third}/heal"))["node"]["state"] == "Running"
