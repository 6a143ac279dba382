"""The Cache operator's product on real nodes (docs/real-nodes.md, docs/cache.md "Tests"): the ``kanri-valkey``
image built by ``make images``, run by the upstream kubelet, containerd and runc of three real nodes in three zones
under the pod security the operator asks for (non-root uid 999, RuntimeDefault seccomp, every capability dropped),
each pod's data on a ``local-path`` volume made by rancher's provisioner.

The Cache controller runs in the test process (the real Manager) and is told the image the nodes imported through
its own knob, ``KANRI_VALKEY_IMAGES`` (what the Helm chart sets). The test's clients reach every pod at its pod
address, which the host routes. The agents and Sentinels find each other by their stable names under the headless
Service: CoreDNS runs as a pod.

A Durable Cache of 3 pods, one per node: the pods run as asked (``/proc/<pid>/status`` of every valkey-server), then
the chaos e2e's ledger writes with ``WAIT 1`` and its watcher counts writable primaries while the primary's node
loses power (``RealNode.stop``: kubelet, containerd, shims, agent and servers SIGKILLed at once, the volume kept) and
is started again: 0 confirmed writes lost, never two writable primaries, the time from the fault to the first
confirmed write on the new primary printed (``-s``), Ready again with every pod back.

One ``RealCluster`` for the module on the session's control plane. Run it serialized with the other tests that use
the machine's pod networks: ``flock /tmp/kanri-e2e.lock .venv/bin/pytest tests/integration/test_real_cache.py -q``.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.cache.api import KIND
from kanri.cache.children import IMAGES_ENV, VALKEY_UID
from kanri.local.controlplane import Endpoint
from kanri.local.realnode import RealCluster, RealNode
from kanri.local.realnode.addons import ClusterDNS
from kanri.local.realnode.addons.localpath import STORAGE_CLASS, LocalPathProvisioner
from kanri.runtime import Client
from kanri.runtime.kinds import POD, SERVICE
from tests.e2e.test_cache_chaos_e2e import STORY, Operator, Workload, cache_operator, converged, run_fault
from tests.e2e.test_cache_e2e import Pods, ready
from tests.integration.realnode_support import coredns_on, environment, kubectl, local_path_on, three_real_nodes
from tests.integration.test_real_kafka import remove_tree
from tests.support import NotYet, eventually

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="session")]
Obj = dict[str, Any]
PREFIX = "kc"
IMAGE = "kanri-valkey"
VERSION = "9.1"
NAME = "ledger"
SPEC = {
    "dataPolicy": "Durable",
    "replicas": 3,
    "version": VERSION,
    "storage": {"size": "64Mi", "storageClassName": STORAGE_CLASS},
    "downAfterMilliseconds": 1000,
    "durability": {"maxReplicaLagSeconds": 2},
}


@pytest.fixture(scope="module")
def work_dir() -> Iterator[Path]:
    """The module's nodes and provisioner live here: a short path, unlike pytest's (the kubelet binds unix sockets,
    at most 107 bytes, deep inside a node's directory)."""
    work = Path(tempfile.mkdtemp(prefix="krc-"))
    yield work
    remove_tree(work)


@pytest.fixture(scope="module")
def cache_nodes(control_plane: Endpoint, work_dir: Path) -> Iterator[RealCluster]:
    """Three real nodes in three zones holding the Valkey image and CoreDNS's (the agents and Sentinels name each
    other by DNS)."""
    with three_real_nodes(control_plane, work_dir, PREFIX, IMAGE) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def cluster_dns(cache_nodes: RealCluster) -> Iterator[ClusterDNS]:
    with coredns_on(cache_nodes) as dns:
        yield dns


@pytest.fixture(scope="module")
def provisioner(cache_nodes: RealCluster, work_dir: Path) -> Iterator[LocalPathProvisioner]:
    with local_path_on(cache_nodes, work_dir, IMAGE) as local_path:
        yield local_path


@pytest.fixture(scope="module")
def images_env(cache_nodes: RealCluster) -> Iterator[str]:
    """``KANRI_VALKEY_IMAGES`` naming the Valkey image as the nodes imported it (read when a StatefulSet is built)."""
    ref = cache_nodes.nodes[0].image(IMAGE).ref
    with environment(IMAGES_ENV, json.dumps({VERSION: ref})):
        yield ref


@pytest_asyncio.fixture(loop_scope="session")
async def operator(
    control_plane: Endpoint,
    namespace: str,
    images_env: str,
    provisioner: LocalPathProvisioner,
    cluster_dns: ClusterDNS,
) -> AsyncIterator[Operator]:
    """The Cache CRD installed and the controller running in this process, watching the test's namespace (stopped
    before the nodes are)."""
    async with cache_operator(control_plane, namespace) as running:
        yield running


async def diagnose(kubeconfig: Path, namespace: str) -> str:
    """What the namespace shows when a wait failed: pods, claims, the last Events and the containers' log tails."""
    parts = [
        await kubectl(kubeconfig, "-n", namespace, "get", "pods,pvc,cache", "-o", "wide", check=False),
        (await kubectl(kubeconfig, "-n", namespace, "get", "events", "--sort-by=.lastTimestamp", check=False))[-4000:],
    ]
    for name in (await kubectl(kubeconfig, "-n", namespace, "get", "pods", "-o", "name", check=False)).split():
        logs = await kubectl(kubeconfig, "-n", namespace, "logs", name, "--all-containers", "--tail=15", check=False)
        parts.append(f"--- {name}\n{logs[-3000:]}")
    return "\n".join(parts)


def valkey_processes(node: RealNode) -> list[dict[str, str]]:
    """``/proc/PID/status`` of every valkey-server among the node's processes (the pod's server and its Sentinel), as
    a field -> value map (``Uid``, ``Seccomp``, ``CapEff``, ``NoNewPrivs`` ...): what runc really gave them."""
    found = []
    for pid in node.pids():
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if b"valkey-server" in argv0:
            found.append({k: v.strip() for k, v in (line.split(":", 1) for line in status.splitlines() if ":" in line)})
    return found


def assert_pod_security(pod: Obj, processes: list[dict[str, str]]) -> None:
    """The pod asked for non-root uid 999, RuntimeDefault seccomp and no capability, was started under them (Running,
    both containers ready) and its server and Sentinel run so: uid 999, seccomp filter mode, no effective or
    permitted capability, no new privileges."""
    spec, status = pod["spec"], pod["status"]
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True, security
    assert security["runAsUser"] == VALKEY_UID, security
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}, security
    for container in spec["containers"]:
        asked = container["securityContext"]
        assert asked["capabilities"]["drop"] == ["ALL"], asked
        assert asked["allowPrivilegeEscalation"] is False, asked
    assert status["phase"] == "Running", status
    assert all(c["ready"] for c in status["containerStatuses"]), status["containerStatuses"]
    assert len(processes) == 2, f"a server and a Sentinel on {spec['nodeName']}: {processes}"
    for process in processes:
        assert process["Uid"].split() == [str(VALKEY_UID)] * 4, process["Uid"]
        assert process["Seccomp"] == "2", f"seccomp mode {process['Seccomp']} (2: filter)"
        assert int(process["CapEff"], 16) == 0, process["CapEff"]
        assert int(process["CapPrm"], 16) == 0, process["CapPrm"]
        assert process["NoNewPrivs"] == "1", process["NoNewPrivs"]


def failover_story(root: Path) -> str:
    """The agents' decisions and Sentinel's failover steps (the chaos e2e's marks) from the container logs the real
    kubelets keep under ``root`` (``pod-logs/<namespace>_<pod>_<uid>/<container>/*.log``), for a failure."""
    lines = []
    for path in sorted(root.rglob("pod-logs/*/*/*.log")):
        pod = path.parent.parent.name.split("_")[1]
        for line in path.read_text(errors="replace").splitlines():
            if any(mark in line for mark in STORY):
                lines.append(f"{pod}/{path.parent.name}: {line[:300]}")
    return "\n".join(lines[-150:])


async def every_pod_back(client: Client, namespace: str, seen: list[Obj]) -> Obj | None:
    """The Cache Ready with its three pods Running and every container ready (``seen``: the last look)."""
    found = await ready(client, namespace, NAME)
    listed, _ = await client.list(POD, namespace, label_selector=f"cache.kanri.dev/cache={NAME}")
    containers = {p["metadata"]["name"]: [c.get("ready") for c in (p.get("status") or {}).get("containerStatuses", [])]
                  for p in listed}  # fmt: skip
    seen[:] = [{"ready": found is not None, "containers": containers}]
    back = len(listed) == 3 and all(flags and all(flags) for flags in containers.values())
    return found if back else None


async def test_a_durable_cache_on_real_nodes_keeps_every_confirmed_write_through_a_node_stop(
    control_plane: Endpoint,
    operator: Operator,
    namespace: str,
    cache_nodes: RealCluster,
    images_env: str,
    work_dir: Path,
) -> None:
    client, kubeconfig = operator.client, control_plane.kubeconfig
    started = time.monotonic()
    await client.create(KIND, {"metadata": {"name": NAME, "namespace": namespace}, "spec": SPEC})
    try:
        await eventually(lambda: ready(client, namespace, NAME), timeout=180, interval=1)
    except NotYet as exc:
        raise AssertionError(f"the Cache not Ready: {exc}\n{await diagnose(kubeconfig, namespace)}") from None
    print(f"Durable Cache create -> Ready (3 pods) on real nodes in {time.monotonic() - started:.1f} s")

    nodes = {node.spec.name: node for node in cache_nodes.nodes}
    listed, _ = await client.list(POD, namespace, label_selector=f"cache.kanri.dev/cache={NAME}")
    placed = {p["metadata"]["name"]: str(p["spec"]["nodeName"]) for p in listed}
    assert sorted(placed.values()) == sorted(nodes), f"one pod per node expected, the scheduler placed {placed}"
    for pod in listed:
        assert {c["image"] for c in pod["spec"]["containers"]} == {images_env}
        assert_pod_security(pod, valkey_processes(nodes[placed[pod["metadata"]["name"]]]))

    pods = Pods(client, namespace, NAME)
    await pods.load_password()
    workload = Workload(pods, str((await client.get(SERVICE, f"{NAME}-ro", namespace))["spec"]["clusterIP"]))
    try:
        await eventually(lambda: converged(workload), timeout=60, interval=1)
    except NotYet as exc:
        raise AssertionError(f"not converged before the fault: {workload.seen}") from exc
    tasks = [asyncio.create_task(t) for t in (workload.write(), workload.watch())]
    results: list[str] = []
    restarted: list[float] = []
    stopped_at: list[float] = []
    stopped: list[RealNode] = []

    async def power_off(_pod: str, node: str) -> None:
        await asyncio.to_thread(nodes[node].stop)
        stopped.append(nodes[node])
        stopped_at.append(time.monotonic())

    async def power_on(_pod: str, node: str) -> None:
        start = await asyncio.to_thread(nodes[node].start)
        stopped.remove(nodes[node])
        restarted.append(start)

    try:
        await eventually(lambda: asyncio.sleep(0, len(workload.acked) > 100 or None), timeout=30)
        try:
            # run_fault's log story reads the home-made node's pods/ directories: the real kubelet's are told below
            await run_fault(workload, client, namespace, "node stopped", power_off, power_on, results, work_dir)
        except (AssertionError, NotYet) as exc:
            story = failover_story(work_dir)
            raise AssertionError(f"{exc}\n{story}\n{await diagnose(kubeconfig, namespace)}") from exc
        seen: list[Obj] = []
        try:
            await eventually(lambda: every_pod_back(client, namespace, seen), timeout=120, interval=1)
        except NotYet as exc:
            raise AssertionError(
                f"not Ready with every pod back: {seen}\n{await diagnose(kubeconfig, namespace)}"
            ) from exc
        healed = time.monotonic() - stopped_at[0]
    finally:
        workload.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for node in stopped:  # the test failed with the node down: bring it back for the fixtures' teardown
            await asyncio.to_thread(node.start)
    print(
        f"cache on real nodes: the stopped node's start -> node Ready {restarted[0]:.1f} s; Cache Ready with every pod "
        f"back {healed:.1f} s after the stop; {len(workload.acked)} writes confirmed in all; "
        f"test {time.monotonic() - started:.0f} s"
    )
    for pod in (await client.list(POD, namespace, label_selector=f"cache.kanri.dev/cache={NAME}"))[0]:
        assert_pod_security(pod, valkey_processes(nodes[str(pod["spec"]["nodeName"])]))  # restarted, same rules
