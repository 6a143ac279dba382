"""The Kafka operator's product on real nodes (docs/real-nodes.md, docs/kafka.md "Tests"): the broker image
``kanri-kafka:4.4.0`` built by ``make images``, run by the upstream kubelet, containerd and runc of three real nodes
in three zones under the pod security the operator asks for (non-root uid 1001, RuntimeDefault seccomp, every
capability dropped), each broker on a ``local-path`` volume made by rancher's provisioner.

The KafkaCluster and KafkaTopic controllers run in the test process (the real Manager) and are told the image the
nodes imported through their own knob, ``KANRI_KAFKA_IMAGES`` (what the Helm chart sets). They and the test's clients
reach every broker at its pod address, which the brokers advertise and the host routes. The controller voters find
each other by their stable names under the headless Service: CoreDNS runs as a pod.

A 3-broker cluster (all three KRaft voters, one per node), a topic of 6 partitions, RF 3 and ``min.insync.replicas``
2 grown 6 -> 10 in steps of 2 under a keyed ``acks=all`` producer; after the first step the node of the active
controller loses power (``RealNode.stop``: kubelet, containerd, shims and the JVM SIGKILLed at once, the volume kept)
while the second is due, and is started again. Every acknowledged message is consumed at exactly the partition and
offset it was acknowledged at.

One ``RealCluster`` for the module on the session's control plane. Run it serialized with the other tests that use
the machine's pod networks: ``flock /tmp/kanri-e2e.lock .venv/bin/pytest tests/integration/test_real_kafka.py -q``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.kafka.api import CLUSTER_KIND, TOPIC_KIND
from kanri.kafka.cluster.children import IMAGES_ENV, KAFKA_UID
from kanri.local.controlplane import Endpoint
from kanri.local.realnode import RealCluster, RealNode
from kanri.local.realnode.addons import ClusterDNS
from kanri.local.realnode.addons.localpath import STORAGE_CLASS, LocalPathProvisioner
from kanri.runtime import Client
from kanri.runtime.kinds import POD
from tests.e2e.test_kafka_chaos_e2e import current, degraded, leader_of, messages_in, ready, until
from tests.e2e.test_kafka_e2e import KeyedProducer, Ledger, assert_ledger_kept, consume_all, steps_done
from tests.integration.realnode_support import coredns_on, environment, kubectl, local_path_on, three_real_nodes
from tests.kafka_operator import kafka_operator
from tests.support import eventually

pytestmark = [pytest.mark.timeout(480), pytest.mark.asyncio(loop_scope="session")]
Obj = dict[str, Any]
PREFIX = "kf"
IMAGE = "kanri-kafka"
VERSION = "4.4.0"
NAME = "events"
TOPIC = "orders"


@pytest.fixture(scope="module")
def work_dir() -> Iterator[Path]:
    """The module's nodes and provisioner live here: a short path, unlike pytest's (the kubelet binds unix sockets,
    at most 107 bytes, deep inside a node's directory)."""
    work = Path(tempfile.mkdtemp(prefix="krk-"))
    yield work
    remove_tree(work)


def remove_tree(path: Path, timeout: float = 30.0) -> None:
    """Remove ``path``, asking again until a deadline: right after the nodes' stop a removal once left the module's
    2 GB directory behind (ignored errors), which a later ``rm -rf`` removed."""
    deadline = time.monotonic() + timeout
    while True:
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            return
        if time.monotonic() > deadline:
            left = sorted(str(p) for p in path.rglob("*"))[:5]
            raise AssertionError(f"{path} not removed in {timeout} s; still there: {left}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def kafka_nodes(control_plane: Endpoint, work_dir: Path) -> Iterator[RealCluster]:
    """Three real nodes in three zones holding the broker image and CoreDNS's (the voters resolve each other by
    name)."""
    with three_real_nodes(control_plane, work_dir, PREFIX, IMAGE) as nodes:
        yield nodes


@pytest.fixture(scope="module")
def cluster_dns(kafka_nodes: RealCluster) -> Iterator[ClusterDNS]:
    with coredns_on(kafka_nodes) as dns:
        yield dns


@pytest.fixture(scope="module")
def provisioner(kafka_nodes: RealCluster, work_dir: Path) -> Iterator[LocalPathProvisioner]:
    with local_path_on(kafka_nodes, work_dir, IMAGE) as local_path:
        yield local_path


@pytest.fixture(scope="module")
def images_env(kafka_nodes: RealCluster) -> Iterator[str]:
    """``KANRI_KAFKA_IMAGES`` naming the broker image as the nodes imported it (read when a StatefulSet is built)."""
    ref = kafka_nodes.nodes[0].image(IMAGE).ref
    with environment(IMAGES_ENV, json.dumps({VERSION: ref})):
        yield ref


@pytest_asyncio.fixture(loop_scope="session")
async def operator(
    control_plane: Endpoint,
    namespace: str,
    images_env: str,
    provisioner: LocalPathProvisioner,
    cluster_dns: ClusterDNS,
) -> AsyncIterator[Client]:
    """Both CRDs installed and both controllers running in this process, watching the test's namespace (stopped
    before the nodes are)."""
    async with kafka_operator(control_plane.kubeconfig, namespace) as client:
        yield client


async def diagnose(kubeconfig: Path, namespace: str) -> str:
    """What the namespace shows when a wait failed: pods, claims, the last Events and the brokers' log tails."""
    parts = [
        await kubectl(kubeconfig, "-n", namespace, "get", "pods,pvc,kafkacluster,kafkatopic", "-o", "wide",
                      check=False),
        (await kubectl(kubeconfig, "-n", namespace, "get", "events", "--sort-by=.lastTimestamp", check=False))[-4000:],
    ]  # fmt: skip
    for name in (await kubectl(kubeconfig, "-n", namespace, "get", "pods", "-o", "name", check=False)).split():
        logs = await kubectl(kubeconfig, "-n", namespace, "logs", name, "--tail=20", check=False)
        parts.append(f"--- {name}\n{logs[-3000:]}")
    return "\n".join(parts)


def broker_processes(node: RealNode) -> list[dict[str, str]]:
    """``/proc/PID/status`` of every JVM running ``kafka.Kafka`` among the node's processes, as a field -> value
    map (``Uid``, ``Seccomp``, ``CapEff``, ``NoNewPrivs`` ...): what runc really gave the broker."""
    found = []
    for pid in node.pids():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        if b"kafka.Kafka" in argv:
            found.append({k: v.strip() for k, v in (line.split(":", 1) for line in status.splitlines() if ":" in line)})
    return found


def assert_pod_security(pod: Obj, processes: list[dict[str, str]]) -> None:
    """The broker pod asked for non-root uid 1001, RuntimeDefault seccomp and no capability, was started under them
    (Running, ready) and its JVM runs so: uid 1001, seccomp filter mode, no effective capability, no new
    privileges."""
    spec, status = pod["spec"], pod["status"]
    security = spec["securityContext"]
    assert security["runAsNonRoot"] is True, security
    assert security["runAsUser"] == KAFKA_UID, security
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}, security
    container = spec["containers"][0]["securityContext"]
    assert container["capabilities"]["drop"] == ["ALL"], container
    assert container["allowPrivilegeEscalation"] is False, container
    assert status["phase"] == "Running", status
    assert status["containerStatuses"][0]["ready"], status
    assert len(processes) == 1, f"one broker JVM on {spec['nodeName']}: {processes}"
    jvm = processes[0]
    assert jvm["Uid"].split() == [str(KAFKA_UID)] * 4, jvm["Uid"]
    assert jvm["Seccomp"] == "2", f"seccomp mode {jvm['Seccomp']} (2: filter)"
    assert int(jvm["CapEff"], 16) == 0, jvm["CapEff"]
    assert int(jvm["CapPrm"], 16) == 0, jvm["CapPrm"]
    assert jvm["NoNewPrivs"] == "1", jvm["NoNewPrivs"]


def grown_to(partitions: int) -> Callable[[Obj], bool]:
    """A KafkaTopic Ready for its current generation with ``partitions`` partitions."""
    return lambda topic: current(topic).get("phase") == "Ready" and topic["status"].get("partitions") == partitions


async def test_a_three_broker_cluster_on_real_nodes_keeps_every_acknowledged_message_through_growth_and_a_node_stop(
    control_plane: Endpoint, operator: Client, namespace: str, kafka_nodes: RealCluster, images_env: str
) -> None:
    client, kubeconfig = operator, control_plane.kubeconfig

    async def read_cluster() -> Obj:
        return await client.get(CLUSTER_KIND, NAME, namespace)

    async def read_topic() -> Obj:
        return await client.get(TOPIC_KIND, TOPIC, namespace)

    async def explained(wait: Awaitable[Obj]) -> Obj:
        try:
            return await wait
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{await diagnose(kubeconfig, namespace)}") from None

    started = time.monotonic()
    storage = {"size": "256Mi", "storageClassName": STORAGE_CLASS}
    await client.create(CLUSTER_KIND, {"metadata": {"name": NAME, "namespace": namespace},
                                       "spec": {"replicas": 3, "version": VERSION, "storage": storage}})  # fmt: skip
    cluster = await explained(until(read_cluster, ready, "the cluster Ready with 3 brokers", 300))
    print(f"KafkaCluster create -> Ready (3 brokers) on real nodes in {time.monotonic() - started:.1f} s")
    quorum = cluster["status"]["quorum"]
    assert quorum["leaderId"] >= 0, quorum
    assert quorum["votersCaughtUp"] == 3, quorum

    nodes = {node.spec.name: node for node in kafka_nodes.nodes}
    placed: dict[int, str] = {}
    for broker in range(3):
        pod = await client.get(POD, f"{NAME}-{broker}", namespace)
        placed[broker] = str(pod["spec"]["nodeName"])
        assert pod["spec"]["containers"][0]["image"] == images_env
        assert_pod_security(pod, broker_processes(nodes[placed[broker]]))
    assert sorted(placed.values()) == sorted(nodes), f"one broker per node expected, the scheduler placed {placed}"

    bootstrap = str(cluster["status"]["bootstrap"])
    growth = {"stepSize": 2, "pauseSeconds": 3, "maxLag": 1000000}
    spec = {"cluster": NAME, "partitions": 6, "replicationFactor": 3, "config": {"min.insync.replicas": "2"},
            "partitionGrowth": growth}  # fmt: skip
    await client.create(TOPIC_KIND, {"metadata": {"name": TOPIC, "namespace": namespace}, "spec": spec})
    await explained(until(read_topic, lambda t: current(t).get("phase") == "Ready", "the topic Ready", 90))

    ledger = Ledger()
    producer = await asyncio.to_thread(KeyedProducer, bootstrap, TOPIC, ledger)
    victim: RealNode | None = None
    growing: asyncio.Task[Obj] | None = None
    try:
        await eventually(lambda: asyncio.sleep(0, len(ledger.acked) > 500), timeout=60)
        grow_started = time.monotonic()
        await client.patch(TOPIC_KIND, TOPIC, {"spec": {"partitions": 10}}, namespace)
        await eventually(lambda: steps_done(client, namespace, 1), timeout=90)
        first_step = time.monotonic() - grow_started

        # the first step (6 -> 8) is done: the active controller's node loses power (every process of it SIGKILLed
        # at once, its volume kept) while the second step (8 -> 10) is due
        leader = leader_of(await until(read_cluster, lambda c: leader_of(c) >= 0, "a quorum leader", 30))
        victim = nodes[placed[leader]]
        acked_at_stop = len(ledger.acked)
        await asyncio.to_thread(victim.stop)
        stopped_at = time.monotonic()
        growing = asyncio.create_task(until(read_topic, grown_to(10), "the topic grown to 10", 180))
        down = await explained(until(read_cluster, degraded(leader), f"broker {leader} reported down", 120))
        down_after = time.monotonic() - stopped_at
        await eventually(lambda: asyncio.sleep(0, len(ledger.acked) > acked_at_stop + 300), timeout=90)
        acked_while_down, acked_down_after = len(ledger.acked) - acked_at_stop, time.monotonic() - stopped_at
        # the step finishes with the node down: two brokers and the quorum's majority are left
        grown = await explained(growing)
        grown_after = time.monotonic() - stopped_at
        restart_seconds = await asyncio.to_thread(victim.start)
        victim, down_for = None, time.monotonic() - stopped_at
        healed = await explained(until(read_cluster, ready, "the cluster Ready again with 3 brokers", 240))
        healed_after = time.monotonic() - stopped_at - down_for
        acked_at_heal = len(ledger.acked)
        await eventually(lambda: asyncio.sleep(0, len(ledger.acked) > acked_at_heal + 300), timeout=60)
    finally:
        await asyncio.to_thread(producer.close)
        if growing is not None and not growing.done():
            growing.cancel()
        if victim is not None:  # the test failed with the node down: bring it back for the fixtures' teardown
            await asyncio.to_thread(victim.start)

    steps = [(s["fromPartitions"], s["toPartitions"]) for s in grown["status"]["steps"]]
    assert steps == [(6, 8), (8, 10)], steps
    said = next(c for c in down["status"]["conditions"] if c["type"] == "Ready")
    print(
        f"kafka on real nodes: 6->8 in {first_step:.1f} s; then node {placed[leader]} (broker {leader}, the active "
        f"controller) stopped: status said so {down_after:.1f} s after ({said['reason']}: {said['message']}); "
        f"{acked_while_down} acknowledged in its first {acked_down_after:.1f} s down; 8->10 done while it was down, "
        f"{grown_after:.1f} s after the stop; node down {down_for:.1f} s; "
        f"its start -> node Ready {restart_seconds:.1f} s; cluster Ready with 3 brokers and 0 under-replicated "
        f"{healed_after:.1f} s after the start"
    )
    restarted = await client.get(POD, f"{NAME}-{leader}", namespace)
    assert_pod_security(restarted, broker_processes(nodes[placed[leader]]))  # restarted by the kubelet, same rules
    print(f"broker {leader}'s pod after the node's start: restartCount "
          f"{restarted['status']['containerStatuses'][0]['restartCount']}")  # fmt: skip

    bootstrap = str(healed["status"]["bootstrap"])
    held = await messages_in(bootstrap, 10)
    seen = await asyncio.to_thread(consume_all, bootstrap, TOPIC, held)
    print(
        f"kafka on real nodes: {producer.sent} sent, {len(ledger.acked)} acknowledged, {ledger.failed} failed (told "
        f"to the producer), {held} in the topic, {len(seen)} consumed; test {time.monotonic() - started:.0f} s"
    )
    assert_ledger_kept(ledger, seen, held)
    assert {partition for _, _, partition, _ in seen} >= {6, 7, 8, 9}, "the producer used the new partitions"
