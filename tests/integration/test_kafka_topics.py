"""The KafkaTopic controller against a real kube-apiserver and a real Kafka broker (a host process from the jars of
``make kafka-dist``): create, growth in checked steps, drift, conflicts, managed: false, and the deletion gate.

The KafkaCluster object here only publishes the host broker's address in its status (no cluster controller runs):
the topic controller reads nothing else of it."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from confluent_kafka import Consumer, Producer
from prometheus_client import CollectorRegistry

from kanri.cli import status_kafka
from kanri.kafka.api import APPROVE_DELETION, APPROVE_GROWTH, CLUSTER_KIND, TOPIC_KIND, KafkaCluster, KafkaTopic
from kanri.kafka.operator import build
from kanri.kafka.topics.admin import TopicAdmin
from kanri.kafka.topics.context import Timings
from kanri.kafka.topics.reconciler import controller
from kanri.local import Endpoint
from kanri.runtime import ApiError, Client, Manager, ManagerOptions, get_condition, install_crd
from kanri.runtime.kinds import EVENT
from tests.kafka_host import HostBroker, host_broker
from tests.support import eventually

Obj = dict[str, Any]
#: A converged topic looked at again every 2 s (the product's 30 s would make the drift test wait ~30 s).
TIMINGS = Timings(resync=2.0, snapshot_age=1.0, group_offsets_age=1.0)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostBroker]:
    with host_broker(Path(tmp_path_factory.mktemp("kafka"))) as running:
        yield running


@pytest_asyncio.fixture(loop_scope="session")
async def client(control_plane: Endpoint) -> AsyncIterator[Client]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as c:
        for kind in (KafkaCluster, KafkaTopic):
            await install_crd(c, kind, field_manager="kafka-tests")
        yield c


@contextlib.asynccontextmanager
async def operator(
    client: Client, namespace: str, broker: HostBroker | str, registry: CollectorRegistry | None = None
) -> AsyncIterator[TopicAdmin]:
    """The topic controller for ``namespace``, with a KafkaCluster ``events`` that points at the host broker (or at
    the bootstrap address given)."""
    bootstrap = broker if isinstance(broker, str) else broker.bootstrap
    body = {"metadata": {"name": "events", "namespace": namespace}, "spec": {"storage": {"size": "1Gi"}}}
    try:
        cluster = await client.create(CLUSTER_KIND, body)
    except ApiError as exc:  # a second operator in the same test: the cluster is there already
        if exc.status != 409:
            raise
        cluster = await client.get(CLUSTER_KIND, "events", namespace)
    cluster["status"] = {"bootstrap": bootstrap}
    await client.replace_status(CLUSTER_KIND, cluster)
    options = ManagerOptions(name="kafka-operator", namespace=namespace, leader_election=False, health_port=0,
                             graceful_shutdown_timeout=10)  # fmt: skip
    manager = Manager(client, options, registry=CollectorRegistry())
    manager.add(controller(manager, registry=registry or CollectorRegistry(), timings=TIMINGS))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        yield TopicAdmin(bootstrap)
    finally:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


def topic(namespace: str, name: str, **spec: Any) -> Obj:
    base = {"cluster": "events", "partitions": 6, "replicationFactor": 1}
    return {"metadata": {"name": name, "namespace": namespace}, "spec": base | spec}


async def condition(client: Client, namespace: str, name: str, kind_reason: str) -> Obj | None:
    """The KafkaTopic once its Ready condition has ``kind_reason`` at its current generation."""
    obj = await client.get(TOPIC_KIND, name, namespace)
    status = obj.get("status") or {}
    ready = get_condition(status.get("conditions"), "Ready") or {}
    current = status.get("observedGeneration") == obj["metadata"]["generation"]
    return obj if current and ready.get("reason") == kind_reason else None


async def events(client: Client, namespace: str, reason: str) -> list[Obj]:
    found, _ = await client.list(EVENT, namespace)
    return [e for e in found if e["reason"] == reason]


def metric(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float | None:
    return registry.get_sample_value(name, labels)


async def metric_is(registry: CollectorRegistry, name: str, labels: dict[str, str], want: float) -> str | None:
    """``name=want`` once the sample has that value (for eventually)."""
    return f"{name}={want}" if metric(registry, name, labels) == want else None


class Reader:
    """A consumer group member in a thread: subscribed (so the group is active and stable) but committing only when
    told, so its lag is whatever the test says."""

    def __init__(self, bootstrap: str, topic: str, group: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                                  "enable.auto.commit": False})  # fmt: skip
        self.consumer.subscribe([topic])
        self.catch_up = threading.Event()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        read = False
        while not self.stop.is_set():
            message = self.consumer.poll(0.2)
            read = read or (message is not None and message.error() is None)
            if self.catch_up.is_set() and read:
                self.consumer.commit(asynchronous=False)  # the positions of everything read so far
                read = False
        self.consumer.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(30)


async def active_lag(admin: TopicAdmin, topic: str, partitions: int, group: str, lag: int) -> bool:
    """Whether ``group`` has members on the topic and lags ``lag`` messages."""
    groups = await admin.groups_on(topic, partitions)
    return any(g.group == group and g.members > 0 and g.state == "STABLE" and g.lag == lag for g in groups)


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(count):
        producer.produce(topic, key=f"k{i}".encode(), value=b"x")
    assert producer.flush(30) == 0


async def test_a_topic_is_created_grown_in_checked_steps_and_held_while_a_group_lags(
    client: Client, namespace: str, broker: HostBroker
) -> None:
    growth = {"stepSize": 2, "pauseSeconds": 1, "maxLag": 5}
    registry = CollectorRegistry()
    async with operator(client, namespace, broker, registry) as admin:
        await client.create(TOPIC_KIND, topic(namespace, "orders", partitionGrowth=growth,
                                              config={"retention.ms": "3600000"}))  # fmt: skip
        created = await eventually(lambda: condition(client, namespace, "orders", "TopicReady"), timeout=60)
        assert created["status"]["partitions"] == 6
        state = await admin.describe("orders")
        assert state is not None
        assert state.config == {"retention.ms": "3600000"}

        await asyncio.to_thread(produce, broker.bootstrap, "orders", 20)
        reader = await asyncio.to_thread(Reader, broker.bootstrap, "orders", "billing")
        try:
            await eventually(lambda: active_lag(admin, "orders", 6, "billing", 20), timeout=60)
            await client.patch(TOPIC_KIND, "orders", {"spec": {"partitions": 12}}, namespace)
            held = await eventually(lambda: condition(client, namespace, "orders", "ConsumerLag"), timeout=60)
            assert "billing lag 20" in held["status"]["growth"]["blockedBy"]
            labels = {"namespace": namespace, "topic": "orders"}
            await eventually(lambda: metric_is(registry, "kanri_kafka_topic_growth_blocked", labels, 1), timeout=30)
            lag = labels | {"group": "billing"}
            await eventually(lambda: metric_is(registry, "kanri_kafka_topic_consumer_lag", lag, 20), timeout=30)
            assert (await admin.describe("orders")).partitions == 6  # type: ignore[union-attr]
            reader.catch_up.set()  # the group commits what it read: lag 0, the steps go on
            done = await eventually(lambda: condition(client, namespace, "orders", "TopicReady"), timeout=90)
        finally:
            await asyncio.to_thread(reader.close)
        steps = [(s["fromPartitions"], s["toPartitions"]) for s in done["status"]["steps"]]
        assert steps == [(6, 8), (8, 10), (10, 12)]
        assert "billing STABLE" in done["status"]["steps"][0]["checks"]
        assert done["status"]["partitions"] == 12
        assert "growth" not in done["status"]
        assert len(await events(client, namespace, "GrowthStep")) == 3
        assert metric(registry, "kanri_kafka_topic_growth_blocked", labels) == 0
        assert metric(registry, "kanri_kafka_topic_growth_steps_done", labels) == 3
        assert metric(registry, "kanri_kafka_topic_partitions", labels) == 12


async def test_kanri_status_reads_the_topic_and_its_groups_from_kafka(
    client: Client, namespace: str, broker: HostBroker
) -> None:
    async with operator(client, namespace, broker):
        await client.create(TOPIC_KIND, topic(namespace, "shown", partitions=2, config={"retention.ms": "600000"}))
        await eventually(lambda: condition(client, namespace, "shown", "TopicReady"), timeout=60)
        await asyncio.to_thread(produce, broker.bootstrap, "shown", 5)
        snap = await status_kafka.snapshot(client, "shown", namespace)
    assert snap.kafka_error is None
    assert snap.kafka is not None
    assert (snap.kafka.partitions, dict(snap.kafka.config)) == (2, {"retention.ms": "600000"})
    assert snap.groups == []
    assert [e["reason"] for e in snap.events] == ["TopicCreated"]
    assert snap.cluster is not None


async def test_a_key_ordered_topic_grows_only_by_approved_steps(
    client: Client, namespace: str, broker: HostBroker
) -> None:
    spec = {"keyOrdered": True, "partitions": 2, "partitionGrowth": {"stepSize": 1, "pauseSeconds": 0}}
    async with operator(client, namespace, broker) as admin:
        await client.create(TOPIC_KIND, topic(namespace, "payments", **spec))
        await eventually(lambda: condition(client, namespace, "payments", "TopicReady"), timeout=60)
        await client.patch(TOPIC_KIND, "payments", {"spec": {"partitions": 3}}, namespace)
        waiting = await eventually(lambda: condition(client, namespace, "payments", "ApprovalRequired"), timeout=60)
        assert "approve-growth='payments 2->3'" in get_condition(waiting["status"]["conditions"], "Ready")["message"]  # type: ignore[index]
        await client.patch(TOPIC_KIND, "payments", {"metadata": {"annotations": {APPROVE_GROWTH: "payments 2->3"}}},
                           namespace)  # fmt: skip
        await eventually(lambda: condition(client, namespace, "payments", "TopicReady"), timeout=60)
        assert (await admin.describe("payments")).partitions == 3  # type: ignore[union-attr]


async def test_drift_is_reverted_and_reported_and_a_second_claim_gets_a_conflict(
    client: Client, namespace: str, broker: HostBroker
) -> None:
    async with operator(client, namespace, broker) as admin:
        await client.create(TOPIC_KIND, topic(namespace, "audit", partitions=1, config={"retention.ms": "600000"}))
        await eventually(lambda: condition(client, namespace, "audit", "TopicReady"), timeout=60)
        await admin.set_config("audit", {"retention.ms": "1", "segment.ms": "60000"}, remove=[])

        async def reverted() -> Obj | None:
            state = await admin.describe("audit")
            return None if state is None or dict(state.config) != {"retention.ms": "600000"} else {"ok": True}

        await eventually(reverted, timeout=30)  # found by the resync (TIMINGS: 2 s), nothing pokes the KafkaTopic
        drift = await eventually(lambda: events(client, namespace, "ConfigDriftReverted"), timeout=30)
        assert "retention.ms, segment.ms" in drift[0]["message"]

        await client.create(TOPIC_KIND, topic(namespace, "audit-copy", partitions=4, topicName="audit",
                                              partitionGrowth={"pauseSeconds": 0}))  # fmt: skip
        conflict = await eventually(lambda: condition(client, namespace, "audit-copy", "ResourceConflict"), timeout=60)
        assert "managed by KafkaTopic audit" in get_condition(conflict["status"]["conditions"], "Ready")["message"]  # type: ignore[index]
        assert (await admin.describe("audit")).partitions == 1  # type: ignore[union-attr]
        await client.delete(TOPIC_KIND, "audit", namespace)  # Retain: the topic stays, the younger claim takes over
        await eventually(lambda: condition(client, namespace, "audit-copy", "TopicReady"), timeout=90)
        assert (await admin.describe("audit")).partitions == 4  # type: ignore[union-attr]
        assert await eventually(lambda: events(client, namespace, "TopicRetained"), timeout=30)


async def test_deletion_waits_for_consumers_and_an_approval_and_retain_keeps_the_topic(
    client: Client, namespace: str, broker: HostBroker
) -> None:
    async with operator(client, namespace, broker) as admin:
        await client.create(TOPIC_KIND, topic(namespace, "kept", partitions=1))
        await admin.create("loose", 1, 1, {})  # made outside kanri; the KafkaTopic below only watches it
        await client.create(TOPIC_KIND, topic(namespace, "loose", partitions=3, managed=False))
        await client.create(TOPIC_KIND, topic(namespace, "gone", partitions=2, deletionPolicy="Delete"))
        await eventually(lambda: condition(client, namespace, "gone", "TopicReady"), timeout=60)
        await eventually(lambda: condition(client, namespace, "kept", "TopicReady"), timeout=60)
        await asyncio.to_thread(produce, broker.bootstrap, "gone", 10)
        reader = await asyncio.to_thread(Reader, broker.bootstrap, "gone", "reports")
        try:
            await eventually(lambda: active_lag(admin, "gone", 2, "reports", 10), timeout=60)
            await client.delete(TOPIC_KIND, "gone", namespace)
            blocked = await eventually(lambda: condition(client, namespace, "gone", "DeletionBlocked"), timeout=60)
            reasons = blocked["status"]["deletionBlockedBy"]
            assert "reports (lag 10)" in reasons
            assert f"{APPROVE_DELETION}=gone" in reasons
            assert await eventually(lambda: events(client, namespace, "DeletionBlocked"), timeout=30)
            await client.patch(TOPIC_KIND, "gone", {"metadata": {"annotations": {APPROVE_DELETION: "gone"}}}, namespace)

            async def only_lag_blocks() -> Obj | None:
                obj = await client.get(TOPIC_KIND, "gone", namespace)
                text = (obj.get("status") or {}).get("deletionBlockedBy") or ""
                return obj if "approve-deletion" not in text and "reports" in text else None

            await eventually(only_lag_blocks, timeout=60)
            assert await admin.describe("gone") is not None  # approved, but a group still has unread messages
            reader.catch_up.set()

            async def deleted() -> bool:
                try:
                    await client.get(TOPIC_KIND, "gone", namespace)
                except Exception:
                    return await admin.describe("gone") is None
                return False

            await eventually(deleted, timeout=90)
        finally:
            await asyncio.to_thread(reader.close)
        await client.delete(TOPIC_KIND, "kept", namespace)
        await client.delete(TOPIC_KIND, "loose", namespace)

        async def both_gone() -> bool:
            names = [t["metadata"]["name"] for t in (await client.list(TOPIC_KIND, namespace))[0]]
            return not ({"kept", "loose"} & set(names))

        await eventually(both_gone, timeout=60)
        assert await admin.describe("kept") is not None  # Retain
        loose = await admin.describe("loose")
        assert loose is not None  # managed: false: neither grown to 3 nor deleted
        assert loose.partitions == 1


async def test_a_step_on_record_is_finished_after_a_restart_without_deciding_it_again(
    client: Client, namespace: str, broker: HostBroker
) -> None:
    spec = {"keyOrdered": True, "partitions": 6, "partitionGrowth": {"stepSize": 2, "pauseSeconds": 0}}
    async with operator(client, namespace, broker) as admin:
        await client.create(TOPIC_KIND, topic(namespace, "ledger", **spec))
        await eventually(lambda: condition(client, namespace, "ledger", "TopicReady"), timeout=60)
    # the operator stopped right after committing an (approved) step 6->8, before asking Kafka
    await client.patch(TOPIC_KIND, "ledger", {"spec": {"partitions": 10}}, namespace)
    step = {"fromPartitions": 6, "toPartitions": 8, "time": "2026-12-06T10:00:00Z", "checks": "no consumer groups"}
    await client.patch_status(TOPIC_KIND, "ledger", {"status": {"growth": {"target": 10, "step": step}}}, namespace)
    async with operator(client, namespace, broker) as admin:
        # no approval annotation: the recorded step is carried out, the next one (8->10) waits for its approval
        waiting = await eventually(lambda: condition(client, namespace, "ledger", "ApprovalRequired"), timeout=60)
        assert (await admin.describe("ledger")).partitions == 8  # type: ignore[union-attr]
        assert waiting["status"]["growth"]["blockedBy"].count("ledger 8->10") == 1
        assert [(s["fromPartitions"], s["toPartitions"]) for s in waiting["status"]["steps"]] == [(6, 8)]


async def test_a_replication_factor_kafka_cannot_honour_is_named_and_never_silently_ignored(
    client: Client, namespace: str, broker: HostBroker
) -> None:
    async with operator(client, namespace, broker) as admin:
        await client.create(TOPIC_KIND, topic(namespace, "wide", replicationFactor=3))  # one broker here
        refused = await eventually(lambda: condition(client, namespace, "wide", "ReplicationFactorTooLarge"),
                                   timeout=60)  # fmt: skip
        assert "replicationFactor 3 is more than the 1 brokers" in get_condition(
            refused["status"]["conditions"], "Ready")["message"]  # type: ignore[index]  # fmt: skip
        assert await admin.describe("wide") is None
        await client.create(TOPIC_KIND, topic(namespace, "narrow", partitions=1))
        await eventually(lambda: condition(client, namespace, "narrow", "TopicReady"), timeout=60)
        await client.patch(TOPIC_KIND, "narrow", {"spec": {"replicationFactor": 2}}, namespace)
        # an existing topic: it keeps its replicas, and status says why the change is not made
        kept = await eventually(lambda: condition(client, namespace, "narrow", "ReplicationFactorTooLarge"), timeout=60)
        message = get_condition(kept["status"]["conditions"], "Degraded")["message"]  # type: ignore[index]
        assert "replicationFactor 2 is more than the 1 brokers of cluster events: topic narrow keeps" in message
        assert kept["status"]["replicationFactor"] == 1
        assert "replicasChange" not in kept["status"]


async def test_the_operator_process_serves_both_controllers_metrics_at_its_metrics_endpoint(client: Client) -> None:
    """``kanri kafka run``'s wiring (kanri.kafka.operator.build): the topic and cluster metrics the alerts are built
    on are in the manager's /metrics, not in a registry nobody serves (the topic ones once were)."""
    options = ManagerOptions(name="kafka-operator", leader_election=False, health_port=0, graceful_shutdown_timeout=10)
    manager = Manager(client, options)
    build(manager)
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        port = await eventually(lambda: asyncio.sleep(0, manager.health_port), timeout=30)
        async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{port}/metrics") as response:
            text = await response.text()
        for family in ("kanri_kafka_topic_partitions", "kanri_kafka_topic_consumer_lag", "kanri_kafka_cluster_"):
            assert f"# HELP {family}" in text, f"{family} is not served at /metrics"
    finally:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)
