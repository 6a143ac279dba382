"""One real KRaft broker from the jars of ``make kafka-dist``, run by ``python -m kanri.kafka.broker`` as a host
process, and the topic logic's admin calls (kanri.kafka.topics.admin) against it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin._config import ConfigResource
from confluent_kafka.admin._resource import ResourceType

from kanri.kafka.api import TOPIC_CONFIG_KEYS, TOPIC_OWNED_KEYS
from kanri.kafka.topics.admin import AdminError, GroupLag, TopicAdmin, TopicState
from tests.kafka_host import HostBroker, host_broker
from tests.support import eventually


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostBroker]:
    with host_broker(Path(tmp_path_factory.mktemp("kafka"))) as running:
        yield running


def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(count):
        producer.produce(topic, key=f"k{i % 7}".encode(), value=str(i).encode())
    assert producer.flush(30) == 0


def consume(bootstrap: str, topic: str, group: str, count: int) -> int:
    """Read ``count`` messages in ``group`` and commit them; return how many came."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([topic])
    seen = 0
    try:
        for _ in range(200):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen += 1
                if seen == count:
                    break
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    return seen


async def test_a_topic_grows_from_6_to_12_partitions_and_never_shrinks(broker: HostBroker) -> None:
    admin = TopicAdmin(broker.bootstrap)
    await admin.create("orders", 6, 1, {"retention.ms": "3600000"})

    async def described(partitions: int) -> TopicState | None:
        state = await admin.describe("orders")
        return state if state is not None and state.partitions == partitions else None

    state = await eventually(lambda: described(6), timeout=30)
    assert state.replication_factor == 1
    assert state.config == {"retention.ms": "3600000"}
    await admin.grow("orders", 12)
    await eventually(lambda: described(12), timeout=30)  # metadata lags a change: poll, never read once
    with pytest.raises(AdminError) as refused:
        await admin.grow("orders", 8)
    assert refused.value.code == "INVALID_PARTITIONS"
    assert await admin.describe("no-such-topic") is None


async def test_config_is_set_and_dropped_key_by_key(broker: HostBroker) -> None:
    admin = TopicAdmin(broker.bootstrap)
    await admin.create("configured", 1, 1, {"cleanup.policy": "compact"})
    await admin.set_config("configured", {"retention.ms": "60000"}, remove=["cleanup.policy"])

    async def config() -> dict[str, str] | None:
        state = await admin.describe("configured")
        return dict(state.config) if state is not None and "cleanup.policy" not in state.config else None

    assert await eventually(config, timeout=30) == {"retention.ms": "60000"}


async def test_a_consumer_groups_lag_is_what_it_has_not_consumed(broker: HostBroker) -> None:
    admin = TopicAdmin(broker.bootstrap)
    await admin.create("events", 3, 1, {})
    await asyncio.to_thread(produce, broker.bootstrap, "events", 30)
    assert await asyncio.to_thread(consume, broker.bootstrap, "events", "billing", 20) == 20
    ends = await admin.end_offsets("events", 3)
    assert sum(ends.values()) == 30

    async def billing() -> GroupLag | None:
        groups = await admin.groups_on("events", 3)
        return next((g for g in groups if g.group == "billing"), None)

    group = await eventually(billing, timeout=30)
    assert group.lag == 10, group
    assert group.state == "EMPTY"  # it left: no members, offsets kept
    assert await admin.groups_on("orders-without-groups", 1) == []
    await admin.delete("events")
    await admin.delete("events")  # deleting what is gone is done, not an error


async def test_the_shared_snapshot_is_reused_but_a_topic_written_since_is_read_alone(broker: HostBroker) -> None:
    admin = TopicAdmin(broker.bootstrap)
    await admin.create("snap-a", 2, 1, {"retention.ms": "120000"})

    async def seen() -> TopicState | None:
        admin.written("snap-a")  # each look reads it alone, until Kafka reports it
        return await admin.state("snap-a", max_age=60)

    assert (await eventually(seen, timeout=30)).config == {"retention.ms": "120000"}
    first = await admin.snapshot(max_age=60)
    await admin.create("snap-b", 1, 1, {})
    assert await admin.snapshot(max_age=60) is first  # within max_age: no new read
    assert "snap-b" not in first
    admin.written("snap-b")
    state = await eventually(lambda: admin.state("snap-b", max_age=60), timeout=30)
    assert state.partitions == 1
    assert (await admin.snapshot(max_age=0)).keys() >= {"snap-a", "snap-b"}


async def test_every_topic_setting_the_api_allows_is_one_kafka_knows(broker: HostBroker) -> None:
    admin = TopicAdmin(broker.bootstrap)
    await admin.create("settings", 1, 1, {})
    resource = ConfigResource(ResourceType.TOPIC, "settings")
    entries = await asyncio.wrap_future(admin._client.describe_configs([resource])[resource])
    known = set(entries)
    assert set(TOPIC_CONFIG_KEYS + TOPIC_OWNED_KEYS) <= known, sorted(set(TOPIC_CONFIG_KEYS) - known)
