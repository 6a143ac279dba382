"""The Kafka operator end to end on a local node: a 3-broker KRaft cluster of real pods (kanri.dev/kafka:4.4.0, the
launcher and the kafka-dist jars) and a topic grown from 6 to 12 partitions in checked steps while a keyed
``acks=all`` producer runs and one broker's pod is deleted (made again on its volume) mid-growth; then, still under
the producer, a fourth (broker-only) node is added and the replicas spread onto it, and it is drained and removed. Every
acknowledged message is in the ledger; afterwards every one is consumed exactly as acknowledged (same partition,
same offset): none lost. Per-key order is measured and asserted within a partition."""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import pytest_asyncio
from confluent_kafka import Consumer, Producer

from kanri.kafka.api import CLUSTER_KIND, DRAIN_BROKERS, TOPIC_KIND
from kanri.kafka.topics.admin import TopicAdmin
from kanri.kit import tls
from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.runtime import Client
from kanri.runtime.kinds import POD, SECRET
from tests.kafka_operator import kafka_operator
from tests.support import eventually

pytestmark = [pytest.mark.timeout(420)]
Obj = dict[str, Any]
KEYS = 40


@pytest_asyncio.fixture(loop_scope="session")
async def operator(control_plane: Endpoint, namespace: str, node: LocalNode) -> AsyncIterator[Client]:
    """Both CRDs installed and both controllers running in this process, watching the test's namespace."""
    async with kafka_operator(control_plane.kubeconfig, namespace) as client:
        yield client


@dataclass
class Ledger:
    """Every message the brokers acknowledged: (key, sequence) -> (partition, offset)."""

    acked: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    failed: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def delivered(self, error: Any, message: Any) -> None:
        with self.lock:
            if error is not None:
                self.failed += 1
                return
            key, seq = message.key().decode(), int(message.value())
            self.acked[(key, seq)] = (message.partition(), message.offset())


class KeyedProducer:
    """``acks=all``, idempotent, keyed: every key's sequence numbers go up by one; the topic's metadata is refreshed
    every second so new partitions are used (and keys move) while the test runs."""

    def __init__(self, bootstrap: str, topic: str, ledger: Ledger) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                                  "topic.metadata.refresh.interval.ms": 1000, "linger.ms": 5})  # fmt: skip
        self.topic, self.ledger = topic, ledger
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        seq: dict[str, int] = defaultdict(int)
        while not self.stop.is_set():
            key = f"key-{self.sent % KEYS}"
            self.producer.produce(self.topic, key=key.encode(), value=str(seq[key]).encode(),
                                  on_delivery=self.ledger.delivered)  # fmt: skip
            seq[key] += 1
            self.sent += 1
            self.producer.poll(0)
            time.sleep(0.002)
        self.producer.flush(60)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(90)


def consume_all(bootstrap: str, topic: str, expected: int) -> list[tuple[str, int, int, int]]:
    """Read the topic from the start in a new group: (key, sequence, partition, offset) of every message."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "ledger-check", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([topic])
    seen: list[tuple[str, int, int, int]] = []
    deadline = time.monotonic() + 120
    try:
        while len(seen) < expected and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error() is not None:
                continue
            key, value = message.key() or b"", message.value() or b"-1"
            seen.append((key.decode(), int(value), message.partition() or 0, message.offset() or 0))
    finally:
        consumer.close()
    return seen


def assert_none_lost_or_moved(ledger: Ledger, seen: list[tuple[str, int, int, int]]) -> None:
    """Every acknowledged message was consumed, at the partition and offset it was acknowledged at."""
    consumed = {(key, seq): (partition, offset) for key, seq, partition, offset in seen}
    lost = [entry for entry in ledger.acked if entry not in consumed]
    assert not lost, f"{len(lost)} of {len(ledger.acked)} acknowledged messages lost, e.g. {lost[:5]}"
    moved = [k for k, v in consumed.items() if ledger.acked[k] != v]
    assert not moved, f"{len(moved)} messages consumed at another partition/offset than acknowledged: {moved[:5]}"


def assert_ledger_kept(ledger: Ledger, seen: list[tuple[str, int, int, int]], held: int) -> None:
    """Everything in the topic was consumed, every acknowledged message at the partition and offset it was
    acknowledged at, and within a partition each key's messages in sequence order."""
    assert len(seen) == held, f"{len(seen)} of the {held} messages in the topic consumed"
    assert_none_lost_or_moved(ledger, seen)
    per_partition: dict[tuple[str, int], list[int]] = defaultdict(list)
    for key, seq, partition, _ in sorted(seen, key=lambda m: (m[2], m[3])):
        per_partition[(key, partition)].append(seq)
    unordered = [kp for kp, seqs in per_partition.items() if seqs != sorted(seqs)]
    assert not unordered, f"a key's messages out of order within a partition: {unordered[:5]}"


async def steps_done(client: Client, namespace: str, count: int) -> bool:
    status = (await client.get(TOPIC_KIND, "orders", namespace)).get("status") or {}
    return len(status.get("steps") or []) >= count


async def restart_broker(client: Client, namespace: str, pod: str) -> str:
    """Delete the broker's pod (its StatefulSet makes it again, on the same volume); the old pod's uid."""
    uid = str((await client.get(POD, pod, namespace))["metadata"]["uid"])
    await client.delete(POD, pod, namespace)
    return uid


async def healthy(client: Client, namespace: str, old_uid: str) -> Obj | None:
    """The cluster once it is Ready with every broker, the restarted one a new pod."""
    pod = await client.get(POD, "events-1", namespace)
    if pod["metadata"]["uid"] == old_uid:
        return None
    cluster = await phase(client, CLUSTER_KIND, namespace, "events", "Ready")
    return cluster if cluster is not None and cluster["status"]["readyBrokers"] == 3 else None


async def settled(client: Client, namespace: str, brokers: int) -> Obj | None:
    """The cluster once it runs ``brokers`` nodes, every one ready, no rebalance left and nothing under-replicated."""
    cluster = await phase(client, CLUSTER_KIND, namespace, "events", "Ready")
    if cluster is None:
        return None
    status = cluster["status"]
    done = status.get("replicas") == status.get("readyBrokers") == brokers and "rebalance" not in status
    return cluster if done and status.get("underReplicatedPartitions") == 0 else None


async def replicas_on(bootstrap: str, broker: int) -> tuple[int, int]:
    """Partition replicas (every topic, internal ones included) broker ``broker`` holds now, and in the cluster."""
    admin = TopicAdmin(bootstrap)
    try:
        rows = (await admin.partition_map())[1]
    finally:
        admin.close()
    return sum(1 for row in rows if broker in row[3]), sum(len(row[3]) for row in rows)


async def phase(client: Client, kind: Any, namespace: str, name: str, wanted: str) -> Obj | None:
    obj = await client.get(kind, name, namespace)
    status = obj.get("status") or {}
    current = status.get("observedGeneration") == obj["metadata"]["generation"]
    return obj if current and status.get("phase") == wanted else None


async def test_a_topic_grows_6_to_12_in_steps_under_a_keyed_acks_all_producer_and_nothing_is_lost(
    operator: Client, namespace: str
) -> None:
    client = operator
    await client.create(CLUSTER_KIND, {"metadata": {"name": "events", "namespace": namespace},
                                       "spec": {"replicas": 3, "storage": {"size": "256Mi"}}})  # fmt: skip
    cluster = await eventually(lambda: phase(client, CLUSTER_KIND, namespace, "events", "Ready"), timeout=240)
    assert cluster["status"]["readyBrokers"] == 3
    bootstrap = cluster["status"]["bootstrap"]
    growth = {"stepSize": 2, "pauseSeconds": 3, "maxLag": 1000000}
    spec = {"cluster": "events", "partitions": 6, "replicationFactor": 3, "config": {"min.insync.replicas": "2"},
            "partitionGrowth": growth}  # fmt: skip
    await client.create(TOPIC_KIND, {"metadata": {"name": "orders", "namespace": namespace}, "spec": spec})
    await eventually(lambda: phase(client, TOPIC_KIND, namespace, "orders", "Ready"), timeout=60)

    ledger = Ledger()
    producer = await asyncio.to_thread(KeyedProducer, bootstrap, "orders", ledger)
    try:
        await eventually(lambda: asyncio.sleep(0, len(ledger.acked) > 500), timeout=60)
        started = time.monotonic()
        await client.patch(TOPIC_KIND, "orders", {"spec": {"partitions": 12}}, namespace)
        await eventually(lambda: steps_done(client, namespace, 1), timeout=60)
        restarted = await restart_broker(client, namespace, "events-1")  # one broker restarts mid-growth
        grown = await eventually(lambda: phase(client, TOPIC_KIND, namespace, "orders", "Ready"), timeout=180)
        growth_seconds = time.monotonic() - started
        # the restarted broker is back: the cluster is Ready again (3 brokers, nothing under-replicated)
        healed = await eventually(lambda: healthy(client, namespace, restarted), timeout=180)
        # still under the producer: a fourth broker (broker only) added, replicas spread onto it, then drained off
        # again and removed
        await client.patch(CLUSTER_KIND, "events", {"spec": {"replicas": 4}}, namespace)
        spread = await eventually(lambda: settled(client, namespace, 4), timeout=240)
        on_broker_3, replicas = await replicas_on(bootstrap, 3)
        await client.patch(CLUSTER_KIND, "events", {"spec": {"replicas": 3}, "metadata": {"annotations": {
            DRAIN_BROKERS: "3"}}}, namespace)  # fmt: skip
        await eventually(lambda: settled(client, namespace, 3), timeout=240)
        left_on_3, _ = await replicas_on(bootstrap, 3)
        await asyncio.sleep(3)  # the producer sees the new partitions (metadata every second) and writes to them
    finally:
        await asyncio.to_thread(producer.close)
    assert healed["status"]["underReplicatedPartitions"] == 0
    assert spread["status"]["controllers"] == 3
    # its share: no broker holds more than one replica above another after the rebalance
    assert on_broker_3 >= replicas // 4, f"broker 3 got {on_broker_3} of {replicas} replicas after the scale-up"
    assert left_on_3 == 0, f"broker 3 still holds {left_on_3} replicas after its drain"
    steps = [(s["fromPartitions"], s["toPartitions"]) for s in grown["status"]["steps"]]
    assert steps == [(6, 8), (8, 10), (10, 12)]
    assert grown["status"]["partitions"] == 12
    assert ledger.failed == 0

    seen = await asyncio.to_thread(consume_all, bootstrap, "orders", len(ledger.acked))
    assert_none_lost_or_moved(ledger, seen)
    # per-key order: within one partition a key's messages are in sequence order; across a growth step a key may
    # move to another partition (that is what keyOrdered's approvals guard), measured here
    per_partition: dict[tuple[str, int], list[int]] = defaultdict(list)
    partitions_of: dict[str, set[int]] = defaultdict(set)
    for key, seq, partition, _ in sorted(seen, key=lambda m: (m[2], m[3])):
        per_partition[(key, partition)].append(seq)
        partitions_of[key].add(partition)
    assert all(seqs == sorted(seqs) for seqs in per_partition.values())
    keys_moved = sum(1 for parts in partitions_of.values() if len(parts) > 1)
    print(
        f"kafka e2e: {len(ledger.acked)} acknowledged, 0 lost; 6->12 in {growth_seconds:.1f} s (3 steps); "
        f"{keys_moved} of {KEYS} keys moved partition during the growth"
    )
    assert keys_moved > 0  # the producer did use the new partitions


TLS_CLIENT = """
import sys
print("client for", sys.argv[1], flush=True)
from confluent_kafka import Consumer, Producer, TopicPartition
conf = {"bootstrap.servers": sys.argv[1], "security.protocol": "SSL", "ssl.ca.location": sys.argv[2],
        "ssl.endpoint.identification.algorithm": "https"}
acked = []
producer = Producer(conf | {"acks": "all", "message.timeout.ms": 20000})
for i in range(20):
    producer.produce("secure", value=b"m%d" % i, on_delivery=lambda error, _m: acked.append(error is None))
producer.flush(40)
if acked.count(True) != 20:
    print("acknowledged", acked.count(True), "of 20", flush=True)
    sys.exit(1)
consumer = Consumer(conf | {"group.id": "tls-pod", "auto.offset.reset": "earliest"})
consumer.assign([TopicPartition("secure", 0, 0)])
seen = 0
for _ in range(240):
    message = consumer.poll(0.5)
    seen += message is not None and message.error() is None
    if seen >= 20:
        break
consumer.close()
sys.exit(0 if seen >= 20 else 2)
"""


def tls_client_pod(name: str, bootstrap: str, secret: str) -> Obj:
    """A client in the pod network: Python's confluent-kafka over TLS to ``bootstrap``, trusting only the ``ca.crt``
    of ``secret`` and checking the broker's name; it exits 0 once 20 messages went in and came back out."""
    return {
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532},
            "containers": [{"name": "client", "image": "kanri.dev/operator:test",
                            "command": ["python3", "-c", TLS_CLIENT, bootstrap, "/ca/ca.crt"],
                            "volumeMounts": [{"name": "ca", "mountPath": "/ca", "readOnly": True}]}],
            "volumes": [{"name": "ca", "secret": {"secretName": secret}}],
        },
    }  # fmt: skip


async def pod_ended(client: Client, namespace: str, name: str) -> Obj | None:
    """The pod's status once it ended (phase Succeeded or Failed: its container's exit code says why)."""
    status = (await client.get(POD, name, namespace)).get("status") or {}
    return status if status.get("phase") in ("Succeeded", "Failed") else None


async def test_dedicated_controllers_and_tls_clients_trusting_the_clusters_ca_and_others_refused(
    operator: Client, namespace: str
) -> None:
    """Three broker-only pods beside one dedicated controller pod (the quorum's only voter, node 1000), with the TLS
    listener: a client pod trusting ``<name>-ca`` writes and reads through the bootstrap Service's name, one trusting
    another CA is refused at the handshake."""
    client = operator
    spec = {"replicas": 3, "storage": {"size": "256Mi"}, "tls": {"enabled": True}, "controllers": 1,
            "dedicatedControllers": True}  # fmt: skip
    await client.create(CLUSTER_KIND, {"metadata": {"name": "secure", "namespace": namespace}, "spec": spec})
    cluster = await eventually(lambda: phase(client, CLUSTER_KIND, namespace, "secure", "Ready"), timeout=240)
    status = cluster["status"]
    assert (status["controllers"], status["dedicatedControllers"], status["readyBrokers"]) == (1, True, 3), status
    assert [v["nodeId"] for v in status["quorum"]["voters"]] == [1000], status["quorum"]
    assert [b["nodeId"] for b in status["brokers"]] == [0, 1, 2]  # the controller's pod is not counted a broker
    assert (await client.get(POD, "secure-controller-0", namespace))["status"]["phase"] == "Running"
    tls_status = status["tls"]
    assert tls_status["bootstrap"] == f"secure-bootstrap.{namespace}.svc:9094"
    assert tls_status["caSecret"] == "secure-ca"
    ca = await client.get(SECRET, "secure-ca", namespace)
    assert set(ca["data"]) == {"ca.crt"}  # what clients read holds no key
    topic = {"cluster": "secure", "partitions": 1, "replicationFactor": 3}
    await client.create(TOPIC_KIND, {"metadata": {"name": "secure", "namespace": namespace}, "spec": topic})
    await eventually(lambda: phase(client, TOPIC_KIND, namespace, "secure", "Ready"), timeout=60)

    other = tls.build_ca("another CA", datetime.now(UTC))
    await client.create(SECRET, {"metadata": {"name": "other-ca", "namespace": namespace},
                                 "data": {"ca.crt": base64.b64encode(other.cert).decode()}})  # fmt: skip
    await client.create(POD, tls_client_pod("trusting", tls_status["bootstrap"], "secure-ca") | {
        "metadata": {"name": "trusting", "namespace": namespace}})  # fmt: skip
    await client.create(POD, tls_client_pod("stranger", tls_status["bootstrap"], "other-ca") | {
        "metadata": {"name": "stranger", "namespace": namespace}})  # fmt: skip
    trusting = await eventually(lambda: pod_ended(client, namespace, "trusting"), timeout=180)
    assert trusting["phase"] == "Succeeded", trusting.get("containerStatuses")
    stranger = await eventually(lambda: pod_ended(client, namespace, "stranger"), timeout=180)
    assert stranger["phase"] == "Failed", stranger
    # refused at the handshake (exit 1: nothing acknowledged), not a client that could not start
    assert stranger["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 1, stranger
