"""A KafkaCluster scaled up and back down on a real API server and controller manager, with host brokers as its
brokers (three controller voters on 127.0.0.1-3, a broker-only fourth started when the StatefulSet asks for it):

- 3 -> 4: the StatefulSet grows at once, ``status.rebalance`` (ScaleUp) is on record and held while broker 3 is not
  there, then the replicas are spread over four brokers by a throttled reassignment (the throttle named only the
  moving replicas and is lifted at the end), every acknowledged message still there;
- 4 -> 3: refused while broker 3 holds replicas (a Warning Event naming them and the drain annotation); with the
  annotation naming broker 3 it is drained (``status.rebalance`` Drain), then the StatefulSet shrinks, every message
  still there and broker 3 holding nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from kanri.kafka.api import CLUSTER_KIND, DRAIN_BROKERS
from kanri.kafka.cluster.reconciler import controller as cluster_controller
from kanri.kafka.topics.admin import TopicAdmin
from kanri.runtime import Client, Manager, ManagerOptions, get_condition
from kanri.runtime.kinds import STATEFUL_SET
from tests.integration.test_kafka_replicas import pod_up, revision_of
from tests.integration.test_kafka_topics import client, events, metric_is
from tests.kafka_host import HostBroker, add_node, host_cluster
from tests.support import eventually

__all__ = ["client"]

Obj = dict[str, Any]
MESSAGES = 600
THROTTLE_KEYS = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(tmp_path_factory.mktemp("kafka-scaling"))


@pytest.fixture(scope="module")
def brokers(workdir: Path) -> Iterator[list[HostBroker]]:
    with host_cluster(workdir, 3) as running:
        yield running


@contextlib.asynccontextmanager
async def operator(client: Client, namespace: str, brokers: list[HostBroker]) -> AsyncIterator[CollectorRegistry]:
    options = ManagerOptions(name="kafka-operator", namespace=namespace, leader_election=False, health_port=0,
                             graceful_shutdown_timeout=10)  # fmt: skip
    manager = Manager(client, options, registry=CollectorRegistry())
    registry = CollectorRegistry()
    port = int(brokers[0].bootstrap.rpartition(":")[2])
    manager.add(cluster_controller(manager, client_port=port, registry=registry))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        yield registry
    finally:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


async def pods_up(client: Client, namespace: str, nodes: range) -> None:
    """What a kubelet would report for each broker pod the real StatefulSet controller made."""
    for node in nodes:
        await eventually(lambda n=node: revision_of(client, namespace, f"events-{n}"), timeout=60)  # type: ignore[misc]
        await pod_up(client, namespace, f"events-{node}", node)


def produce(bootstrap: str, topic: str) -> dict[tuple[int, int], bytes]:
    """``MESSAGES`` keyed messages with acks=all: (partition, offset) -> value of every acknowledged one."""
    acked: dict[tuple[int, int], bytes] = {}

    def delivered(error: Any, message: Any) -> None:
        if error is None:
            acked[(message.partition(), message.offset())] = message.value()

    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for i in range(MESSAGES):
        producer.produce(topic, key=f"k{i % 30}", value=f"m{i}".encode(), on_delivery=delivered)
    assert producer.flush(60) == 0
    assert len(acked) == MESSAGES
    return acked


def consume_all(bootstrap: str, topic: str, partitions: int) -> dict[tuple[int, int], bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "scaling-check", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})  # fmt: skip
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen: dict[tuple[int, int], bytes] = {}
    idle = 0
    while len(seen) < MESSAGES and idle < 40:
        message: Any = consumer.poll(0.5)
        if message is None or message.error():
            idle += 1
            continue
        seen[(message.partition(), message.offset())] = message.value()
    consumer.close()
    return seen


async def status_of(client: Client, namespace: str) -> Obj:
    return (await client.get(CLUSTER_KIND, "events", namespace)).get("status") or {}


async def rebalance_says(client: Client, namespace: str, reason: str, text: str = "") -> Obj | None:
    record = (await status_of(client, namespace)).get("rebalance") or {}
    return record if record.get("reason") == reason and text in str(record.get("blockedBy")) else None


async def rebalance_gone(client: Client, namespace: str) -> Obj | None:
    status = await status_of(client, namespace)
    return status if "rebalance" not in status and status.get("phase") == "Ready" else None


async def statefulset_replicas(client: Client, namespace: str, want: int) -> int | None:
    replicas = int((await client.get(STATEFUL_SET, "events", namespace))["spec"]["replicas"])
    return replicas if replicas == want else None


async def degraded_is(client: Client, namespace: str, reason: str) -> Obj | None:
    obj = await client.get(CLUSTER_KIND, "events", namespace)
    status = obj.get("status") or {}
    degraded = get_condition(status.get("conditions") or [], "Degraded") or {}
    current = status.get("observedGeneration") == obj["metadata"]["generation"]
    return degraded if current and degraded.get("reason") == reason else None


def loads(assignment: dict[int, list[int]], brokers: int) -> list[int]:
    return [sum(1 for replicas in assignment.values() if b in replicas) for b in range(brokers)]


async def test_scale_up_spreads_replicas_and_a_drained_scale_down_loses_nothing(
    client: Client, namespace: str, brokers: list[HostBroker], workdir: Path
) -> None:
    bootstrap = ",".join(b.bootstrap for b in brokers)
    admin = TopicAdmin(bootstrap)
    await admin.create("orders", 12, 2, {"min.insync.replicas": "1"})
    acked = await asyncio.to_thread(produce, bootstrap, "orders")
    async with operator(client, namespace, brokers) as registry:
        labels = {"namespace": namespace, "cluster": "events"}
        body = {"metadata": {"name": "events", "namespace": namespace}, "spec": {"storage": {"size": "1Gi"}}}
        await client.create(CLUSTER_KIND, body)
        await pods_up(client, namespace, range(3))
        status = await eventually(lambda: rebalance_gone(client, namespace), timeout=60)
        assert status["controllers"] == 3

        # 3 -> 4: the StatefulSet grows at once; the rebalance is on record and waits for broker 3
        await client.patch(CLUSTER_KIND, "events", {"spec": {"replicas": 4}}, namespace)
        await eventually(lambda: statefulset_replicas(client, namespace, 4), timeout=30)
        held = await eventually(lambda: rebalance_says(client, namespace, "ScaleUp", "broker 3 not"), timeout=30)
        assert held["brokers"] == [0, 1, 2, 3], held
        await eventually(lambda: metric_is(registry, "kanri_kafka_cluster_rebalance_held", labels, 1), timeout=10)
        assert await events(client, namespace, "ScaleUp"), "no ScaleUp Event"
        await asyncio.to_thread(add_node, brokers, workdir)  # broker only: its own process, the voters unchanged
        await pods_up(client, namespace, range(3, 4))
        status = await eventually(lambda: rebalance_gone(client, namespace), timeout=120)
        assignment = await admin.assignment("orders")
        spread = loads(assignment, 4)
        assert min(spread) >= 5, spread  # 24 replicas over 4 brokers
        assert max(spread) - min(spread) <= 2, spread
        internal = [p for p in (await admin.partition_map())[1] if 3 in p[3]]
        assert internal, "broker 3 got no replica at all"
        done = await events(client, namespace, "RebalanceDone")
        assert done, "no RebalanceDone Event"
        assert "partitions moved" in done[-1]["message"], done
        config = (await admin.describe("orders")).config  # type: ignore[union-attr]
        assert not set(config) & set(THROTTLE_KEYS), config  # lifted
        assert status["replicas"] == 4
        assert await asyncio.to_thread(consume_all, bootstrap, "orders", 12) == acked

        # 4 -> 3 while broker 3 holds replicas: refused, naming it and the way to drain it
        await client.patch(CLUSTER_KIND, "events", {"spec": {"replicas": 3}}, namespace)
        refused = await eventually(lambda: degraded_is(client, namespace, "ScaleDownRefused"), timeout=30)
        assert "broker 3 holds" in refused["message"], refused
        assert f"{DRAIN_BROKERS}=3" in refused["message"], refused
        warned = await eventually(lambda: events(client, namespace, "ScaleDownRefused"), timeout=30)
        assert "docs/kafka.md#scaling" in warned[0]["message"]
        assert await statefulset_replicas(client, namespace, 4) == 4

        # the drain asked for: broker 3 emptied, then the StatefulSet shrinks
        await client.patch(CLUSTER_KIND, "events", {"metadata": {"annotations": {DRAIN_BROKERS: "3"}}}, namespace)
        await eventually(lambda: statefulset_replicas(client, namespace, 3), timeout=120)
        drained = await events(client, namespace, "DrainStarted")
        assert drained, "no DrainStarted Event"
        assert "broker 3" in drained[0]["message"], drained
        assignment = await admin.assignment("orders")
        assert not [p for p, replicas in assignment.items() if 3 in replicas], assignment
        assert not [row for row in (await admin.partition_map())[1] if 3 in row[3]]
        await eventually(lambda: degraded_is(client, namespace, "AsExpected"), timeout=30)
        assert await asyncio.to_thread(consume_all, bootstrap, "orders", 12) == acked
    admin.close()
