"""The Kafka operator end to end on a local node: a 3-broker KRaft cluster of real pods (kanri.dev/kafka:4.4.0, the
launcher and the kafka-dist jars) and a topic grown from 6 to 12 partitions in checked steps while a keyed
``acks=all`` producer runs and one broker's pod is deleted (made again on its volume) mid-growth. Every
acknowledged message is in the ledger; afterwards every one is consumed exactly as acknowledged (same partition,
same offset): none lost. Per-key order is measured and asserted within a partition."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from confluent_kafka import Consumer, Producer

from kanri.kafka.api import CLUSTER_KIND, TOPIC_KIND, KafkaCluster, KafkaTopic
from kanri.kafka.cluster.reconciler import controller as cluster_controller
from kanri.kafka.topics.reconciler import controller as topic_controller
from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.runtime import Client, Manager, ManagerOptions, install_crd
from kanri.runtime.kinds import POD
from tests.support import eventually

pytestmark = [pytest.mark.timeout(420)]
Obj = dict[str, Any]
KEYS = 40


@pytest_asyncio.fixture(loop_scope="session")
async def operator(control_plane: Endpoint, namespace: str, node: LocalNode) -> AsyncIterator[Client]:
    """Both CRDs installed and both controllers running in this process, watching the test's namespace."""
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        for kind in (KafkaCluster, KafkaTopic):
            await install_crd(client, kind, field_manager="kanri-tests")
        manager = Manager(client, ManagerOptions(name="kafka-operator", namespace=namespace, leader_election=False,
                                                 health_port=None))  # fmt: skip
        manager.add(cluster_controller(manager))
        manager.add(topic_controller(manager))
        task = asyncio.create_task(manager.run(handle_signals=False))
        try:
            yield client
        finally:
            manager.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 20)


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
        await asyncio.sleep(3)  # the producer sees the new partitions (metadata every second) and writes to them
    finally:
        await asyncio.to_thread(producer.close)
    assert healed["status"]["underReplicatedPartitions"] == 0
    steps = [(s["fromPartitions"], s["toPartitions"]) for s in grown["status"]["steps"]]
    assert steps == [(6, 8), (8, 10), (10, 12)]
    assert grown["status"]["partitions"] == 12
    assert ledger.failed == 0

    seen = await asyncio.to_thread(consume_all, bootstrap, "orders", len(ledger.acked))
    consumed = {(key, seq): (partition, offset) for key, seq, partition, offset in seen}
    lost = [entry for entry in ledger.acked if entry not in consumed]
    assert not lost, f"{len(lost)} of {len(ledger.acked)} acknowledged messages lost, e.g. {lost[:5]}"
    moved = [k for k, v in consumed.items() if ledger.acked[k] != v]
    assert not moved, f"{len(moved)} messages consumed at another partition/offset than acknowledged: {moved[:5]}"
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
