"""Against a real three-node KRaft cluster (host processes on 127.0.0.1-3): the rolling-restart gate read from
Kafka's ISRs (held while a broker is down, open again once it is back in sync), and — with a real kube-apiserver —
a replication-factor change by reassignment: RF 1 -> 3 on a topic holding messages, throttled and tracked in
status.replicasChange, the operator stopped mid-change and a new one finishing it from what Kafka reports; every
message is still readable afterwards, also with the broker that led half the partitions stopped."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from prometheus_client import CollectorRegistry

from kanri.kafka.api import CLUSTER_KIND, TOPIC_KIND
from kanri.kafka.cluster.reconciler import controller as cluster_controller
from kanri.kafka.cluster.roll_step import REVISION
from kanri.kafka.cluster.rolling import BrokerPod, Hold, PartitionIsr, Restart, next_restart, safe_to_stop
from kanri.kafka.topics import reassign_wire, replicas_step
from kanri.kafka.topics.admin import TopicAdmin
from kanri.runtime import ApiError, Client, Manager, ManagerOptions
from kanri.runtime.kinds import POD
from tests.integration.test_kafka_topics import client, condition, events, metric_is, operator, topic
from tests.kafka_host import HostBroker, host_cluster, restart
from tests.support import eventually

__all__ = ["client"]  # the API client fixture, shared with the topic controller's tests

Obj = dict[str, Any]
MESSAGES = 3000
PAYLOAD = b"p" * 400  # 1.2 MB in all: with a 150 kB/s throttle the copies take seconds to catch up


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[HostBroker]]:
    with host_cluster(Path(tmp_path_factory.mktemp("kafka3")), 3) as running:
        yield running


def produce(bootstrap: str, name: str) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for i in range(MESSAGES):
        producer.produce(name, key=f"k{i}".encode(), value=f"{i}:".encode() + PAYLOAD)
    assert producer.flush(60) == 0


def read_all(bootstrap: str, name: str, partitions: int) -> list[int]:
    """Every message's number, read from the start of every partition (no group: nothing committed)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "replicas-check", "enable.auto.commit": False})
    consumer.assign([TopicPartition(name, p, 0) for p in range(partitions)])
    seen: list[int] = []
    try:
        for _ in range(600):
            for message in consumer.consume(500, 0.5):
                if message.error() is None:
                    seen.append(int((message.value() or b"").split(b":")[0]))
            if len(seen) >= MESSAGES:
                break
    finally:
        consumer.close()
    return seen


async def in_sync(admin: TopicAdmin, topic: str, size: int) -> list[PartitionIsr] | None:
    """Every partition's ISR, once every partition of ``topic`` has ``size`` in-sync replicas."""
    view = [PartitionIsr(*row) for row in await admin.in_sync()]
    mine = [p for p in view if p.topic == topic]
    return view if mine and all(len(p.isr) == size for p in mine) else None


async def test_a_restart_is_held_while_stopping_a_broker_would_take_a_partition_under_min_isr(
    brokers: list[HostBroker],
) -> None:
    admin = TopicAdmin(",".join(b.bootstrap for b in brokers))
    await admin.create("gated", 3, 3, {"min.insync.replicas": "2"})
    await admin.create("scratch", 1, 1, {})  # RF 1: down with its broker whatever is waited for, so never a hold
    outdated = [BrokerPod(f"events-{n}", n, True, False) for n in range(3)]
    view = await eventually(lambda: in_sync(admin, "gated", 3), timeout=30)
    assert next_restart(outdated, view) == Restart("events-2", 2)
    await asyncio.to_thread(brokers[0].stop)  # broker 0 down (a restart under way, or a failure)
    try:
        view = await eventually(lambda: in_sync(admin, "gated", 2), timeout=60)
        held = next_restart([replace(outdated[0], current=True), *outdated[1:]], view)
        assert isinstance(held, Hold), held
        assert held.reason == "MinInSyncReplicas"
        assert "stopping broker 2 would leave gated-0 (in sync: 2, min.insync.replicas 2)" in held.message
        assert "scratch" not in held.message
    finally:
        await asyncio.to_thread(restart, brokers[0])
    view = await eventually(lambda: in_sync(admin, "gated", 3), timeout=90)  # back in sync: the gate opens
    assert safe_to_stop(2, view) is None
    admin.close()


async def pod_up(client: Client, namespace: str, name: str, node: int) -> None:
    """What a kubelet would report for a started broker pod: running, ready, at host broker ``node``'s address."""
    ready = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-06T00:00:00Z"}
    status = {"phase": "Running", "podIP": f"127.0.0.{node + 1}", "conditions": [ready]}
    await client.patch_status(POD, name, {"status": status}, namespace)


async def revision_of(client: Client, namespace: str, name: str) -> str | None:
    try:
        pod = await client.get(POD, name, namespace)
    except ApiError:
        return None
    return None if pod["metadata"].get("deletionTimestamp") else pod["metadata"]["labels"].get(REVISION)


async def rolling_says(client: Client, namespace: str, text: str) -> str | None:
    said = ((await client.get(CLUSTER_KIND, "events", namespace)).get("status") or {}).get("rollingRestart") or ""
    return said if text in said else None


@contextlib.asynccontextmanager
async def cluster_operator(client: Client, namespace: str, port: int) -> AsyncIterator[None]:
    options = ManagerOptions(name="kafka-operator", namespace=namespace, leader_election=False, health_port=0,
                             graceful_shutdown_timeout=10)  # fmt: skip
    manager = Manager(client, options, registry=CollectorRegistry())
    manager.add(cluster_controller(manager, client_port=port))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        yield
    finally:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


async def test_a_config_change_restarts_one_broker_at_a_time_behind_the_min_isr_gate(
    client: Client, namespace: str, brokers: list[HostBroker]
) -> None:
    """The KafkaCluster controller on a real API server (its StatefulSet's pods made by the real controller
    manager, their status written here as a kubelet would) and the three host brokers as its brokers."""
    admin = TopicAdmin(",".join(b.bootstrap for b in brokers))
    await admin.create("rolled", 3, 3, {"min.insync.replicas": "2"})
    port = int(brokers[0].bootstrap.rpartition(":")[2])
    body = {"metadata": {"name": "events", "namespace": namespace}, "spec": {"storage": {"size": "1Gi"}}}
    async with cluster_operator(client, namespace, port):
        await client.create(CLUSTER_KIND, body)
        for node in range(3):
            await eventually(lambda n=node: revision_of(client, namespace, f"events-{n}"), timeout=60)  # type: ignore[misc]
            await pod_up(client, namespace, f"events-{node}", node)
        await eventually(lambda: rolling_ready(client, namespace), timeout=60)
        old = await revision_of(client, namespace, "events-1")
        await client.patch(CLUSTER_KIND, "events", {"spec": {"config": {"log.retention.hours": "100"}}}, namespace)
        # the highest broker goes first; the StatefulSet controller makes its pod again on the new revision. The
        # Event, not status.rollingRestart: the pass the pod's deletion wakes at once overwrites "restarted ..." with
        # the wait for it to be ready, so a poll may never see that status (it failed a clean-clone CI that way).
        first = await eventually(lambda: restarts(client, namespace, 1), timeout=60)
        assert first[0]["message"].startswith("events-2 restarted for revision "), first
        assert await revision_of(client, namespace, "events-1") == old
        await asyncio.to_thread(brokers[2].stop)  # what the restart does to Kafka: broker 2 leaves the ISRs
        try:
            await eventually(lambda: in_sync(admin, "rolled", 2), timeout=60)
            new = await eventually(lambda: revision_of(client, namespace, "events-2"), timeout=60)
            assert new != old
            await pod_up(client, namespace, "events-2", 2)  # ready (the listener answers), not yet in sync
            held = await eventually(
                lambda: rolling_says(client, namespace, "stopping broker 1 would leave"), timeout=60
            )
            assert held.startswith("MinInSyncReplicas: ")
            assert "(in sync: 2, min.insync.replicas 2)" in held
            assert await revision_of(client, namespace, "events-1") == old  # held: nothing else restarted
        finally:
            await asyncio.to_thread(restart, brokers[2])
        # back in sync: the gate opens and broker 1 goes next (its new pod then waits to be ready, like broker 2's)
        restarted = await eventually(lambda: restarts(client, namespace, 2), timeout=90)
        assert [e["message"].split()[0] for e in restarted] == ["events-2", "events-1"]
    admin.close()


async def restarts(client: Client, namespace: str, count: int) -> list[Obj] | None:
    """The BrokerRestarted Events, oldest first, once there are ``count``."""
    found = sorted(await events(client, namespace, "BrokerRestarted"), key=lambda e: e["metadata"]["creationTimestamp"])
    return found if len(found) >= count else None


async def rolling_ready(client: Client, namespace: str) -> Obj | None:
    status = (await client.get(CLUSTER_KIND, "events", namespace)).get("status") or {}
    return status if status.get("bootstrap") and status.get("readyBrokers") == 3 else None


async def test_replication_factor_1_to_3_is_moved_throttled_and_resumed_after_a_restart(
    client: Client, namespace: str, brokers: list[HostBroker], monkeypatch: pytest.MonkeyPatch
) -> None:
    bootstrap = ",".join(b.bootstrap for b in brokers)
    monkeypatch.setattr(replicas_step, "THROTTLE_BYTES_PER_SECOND", 150_000)
    registry = CollectorRegistry()
    async with operator(client, namespace, bootstrap, registry) as admin:
        await client.create(TOPIC_KIND, topic(namespace, "copied", partitions=4))
        await eventually(lambda: condition(client, namespace, "copied", "TopicReady"), timeout=60)
        await asyncio.to_thread(produce, bootstrap, "copied")
        await client.patch(TOPIC_KIND, "copied", {"spec": {"replicationFactor": 3}}, namespace)
        moving = await eventually(lambda: condition(client, namespace, "copied", "ReplicasChanging"), timeout=60)
        record = moving["status"]["replicasChange"]
        assert (record["fromReplicas"], record["toReplicas"], record["partitionsTotal"]) == (1, 3, 4)
        assert record["throttleBytesPerSecond"] == 150_000
        labels = {"namespace": namespace, "topic": "copied"}
        await eventually(lambda: metric_is(registry, "kanri_kafka_topic_replicas_change_partitions", labels, 4))
        assert (await admin.describe("copied")).config["follower.replication.throttled.replicas"] == "*"  # type: ignore[union-attr]
    # the operator is gone mid-change: the record stays, Kafka goes on moving (or has finished meanwhile)
    stopped = await client.get(TOPIC_KIND, "copied", namespace)
    assert stopped["status"]["replicasChange"]["toReplicas"] == 3
    still = await reassign_wire.ongoing(bootstrap, "copied", [0, 1, 2, 3])
    async with operator(client, namespace, bootstrap) as admin:
        done = await eventually(lambda: condition(client, namespace, "copied", "TopicReady"), timeout=120)
        assert "replicasChange" not in done["status"]
        assert done["status"]["replicationFactor"] == 3
        assignment = await admin.assignment("copied")
        assert all(sorted(held) == [0, 1, 2] for held in assignment.values()), assignment
        config = (await admin.describe("copied")).config  # type: ignore[union-attr]
        assert "follower.replication.throttled.replicas" not in config, config  # the throttle is lifted
        started = await events(client, namespace, "ReplicasChangeStarted")
        finished = await eventually(lambda: events(client, namespace, "ReplicasChanged"), timeout=30)
        assert (len(started), len(finished)) == (1, 1), (started, finished)
        assert "1 -> 3 on 4 partitions" in finished[0]["message"]
    seen = await asyncio.to_thread(read_all, bootstrap, "copied", 4)
    assert sorted(seen) == list(range(MESSAGES))
    # every copy holds the messages: with the leader of partitions 0 and 3 stopped the others serve all of them
    leader = assignment[0][0]
    brokers[leader].stop()
    others = ",".join(b.bootstrap for i, b in enumerate(brokers) if i != leader)
    seen = await asyncio.to_thread(read_all, others, "copied", 4)
    assert sorted(seen) == list(range(MESSAGES)), f"{len(seen)} read; still moving at the restart: {sorted(still)}"
