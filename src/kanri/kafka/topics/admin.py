"""What the topic logic asks a Kafka cluster, as plain records: one admin client per cluster, every call awaited
(the client's futures are threads' futures) and bounded by a timeout.

Metadata is eventually consistent: right after a change a broker may still answer with the old partition count, so
callers decide from what they read *now* and look again (never "change, then read once and trust it").
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient

# the admin package re-exports these without declaring them public; mypy wants the modules that define them
from confluent_kafka.admin._config import AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource
from confluent_kafka.admin._listoffsets import OffsetSpec
from confluent_kafka.admin._resource import ResourceType
from confluent_kafka.cimpl import NewPartitions, NewTopic

T = TypeVar("T")
_LOG = logging.getLogger("kanri.kafka.admin")
_LATEST: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]
_EARLIEST: Any = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
_NEWEST: Any = OffsetSpec.max_timestamp()  # type: ignore[no-untyped-call]


class AdminError(Exception):
    """Kafka refused or did not answer: ``code`` is Kafka's error name (``INVALID_PARTITIONS``, ``_TIMED_OUT``…),
    ``retriable`` whether asking again may help."""

    def __init__(self, code: str, message: str, retriable: bool) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.retriable = retriable


@dataclass(frozen=True)
class TopicState:
    """A topic as Kafka reports it now."""

    name: str
    partitions: int
    replication_factor: int
    """The smallest replica count of any partition (a reassignment under way shows the larger one)."""
    config: Mapping[str, str]
    """The topic's own settings (``DYNAMIC_TOPIC_CONFIG``), not the broker defaults."""
    under_replicated: int = 0
    """Partitions whose in-sync replicas are fewer than their replicas."""
    retention_ms: int | None = None
    """The effective ``retention.ms`` (own or default); -1 or None: kept forever."""
    max_replication_factor: int = 0
    """The largest replica count of any partition (0: not read)."""


@dataclass(frozen=True)
class GroupLag:
    """One consumer group that reads the topic: committed offsets on it, or members assigned to it."""

    group: str
    state: str
    """``STABLE``, ``PREPARING_REBALANCE``, ``COMPLETING_REBALANCE``, ``EMPTY``, ``DEAD`` or ``UNKNOWN``."""
    lag: int
    """Messages kept that it has not consumed: over every partition, end offset - committed offset, or - the first
    kept offset where it committed nothing (a partition it never read, or one a growth step added)."""
    members: int = 0
    committed: Mapping[int, int] = field(default_factory=dict)


async def _wait(future: Future[T], timeout: float) -> T:
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), timeout)
    except KafkaException as exc:
        error = exc.args[0]
        raise AdminError(error.name(), error.str(), bool(error.retriable())) from None
    except TimeoutError:
        raise AdminError("_TIMED_OUT", f"no answer within {timeout} s", True) from None


class TopicAdmin:
    """The admin calls the topic logic needs, against one cluster's bootstrap address."""

    def __init__(self, bootstrap: str, timeout: float = 15.0) -> None:
        self.bootstrap = bootstrap
        self.timeout = timeout
        # librdkafka's own log (every failed connect, while a broker restarts) goes to Python logging, not stderr
        config: dict[str, Any] = {"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 5000,
                                  "logger": _LOG}  # fmt: skip
        self._handle: AdminClient | None = AdminClient(config)
        self._snapshot: tuple[float, dict[str, TopicState]] | None = None
        self._offsets: tuple[float, dict[str, dict[str, dict[int, int]]]] | None = None
        self._offsets_lock = asyncio.Lock()  # its own: a slow listing of many groups must not hold topic reads
        self._snapshot_lock = asyncio.Lock()
        self._written: dict[str, float] = {}

    @property
    def _client(self) -> AdminClient:
        if self._handle is None:
            raise AdminError("_DESTROY", f"the admin client of {self.bootstrap} was closed", True)
        return self._handle

    def close(self) -> None:
        """Let go of the client: confluent-kafka 2.16 has no close(); librdkafka's handle (its threads and
        connections) is destroyed with the last reference, which this drops. A call after it raises a retriable
        AdminError (a pass that still held this client looks again with the new one)."""
        self._handle = None

    async def describe(self, name: str) -> TopicState | None:
        """The topic now, or None when Kafka has no such topic."""
        futures = self._client.describe_topics(TopicCollection([name]), request_timeout=self.timeout)
        try:
            description: Any = await _wait(futures[name], self.timeout)
        except AdminError as exc:
            if exc.code == "UNKNOWN_TOPIC_OR_PART":
                return None
            raise
        partitions = description.partitions
        replicas = min((len(p.replicas) for p in partitions), default=0)
        most = max((len(p.replicas) for p in partitions), default=0)
        under = sum(1 for p in partitions if len(p.isr) < len(p.replicas))
        own, retention = await self._config(name)
        return TopicState(name, len(partitions), replicas, own, under, retention, most)

    async def _config(self, name: str) -> tuple[dict[str, str], int | None]:
        resource = ConfigResource(ResourceType.TOPIC, name)
        entries: dict[str, Any] = await _wait(self._client.describe_configs([resource])[resource], self.timeout)
        return _own_config(entries)

    async def snapshot(self, max_age: float) -> dict[str, TopicState]:
        """Every topic of the cluster (internal ones aside), read at most once per ``max_age`` seconds and shared by
        every caller: one metadata request and one config request for all topics, instead of two requests per
        topic per look (a thousand topics at rest cost a thousand looks every resync). :meth:`state` reads a topic
        written since on its own."""
        async with self._snapshot_lock:
            if self._snapshot is not None and time.monotonic() - self._snapshot[0] < max_age:
                return self._snapshot[1]
            taken = time.monotonic()
            try:
                metadata = await asyncio.to_thread(self._client.list_topics, timeout=self.timeout)
            except KafkaException as exc:
                error = exc.args[0]
                raise AdminError(error.name(), error.str(), bool(error.retriable())) from None
            topics = {n: t for n, t in metadata.topics.items() if not n.startswith("__") and t.error is None}
            resources = [ConfigResource(ResourceType.TOPIC, name) for name in topics]
            futures = self._client.describe_configs(resources, request_timeout=self.timeout) if resources else {}
            states = {}
            for resource, future in futures.items():
                name = resource.name
                own, retention = _own_config(await _wait(future, self.timeout))
                parts = list(topics[name].partitions.values())
                replicas = min((len(p.replicas) for p in parts), default=0)
                most = max((len(p.replicas) for p in parts), default=0)
                under = sum(1 for p in parts if len(p.isrs) < len(p.replicas))
                states[name] = TopicState(name, len(parts), replicas, own, under, retention, most)
            self._snapshot = (taken, states)
            return states

    def written(self, name: str) -> None:
        """The topic was just changed: until a snapshot taken after now, :meth:`state` asks Kafka for it alone."""
        self._written[name] = time.monotonic()

    async def state(self, name: str, max_age: float) -> TopicState | None:
        """The topic from the shared :meth:`snapshot`, or read alone when it was written since that was taken."""
        states = await self.snapshot(max_age)
        assert self._snapshot is not None
        if self._written.get(name, -1.0) >= self._snapshot[0]:
            return await self.describe(name)
        self._written.pop(name, None)
        return states.get(name)

    async def create(self, name: str, partitions: int, replication_factor: int, config: Mapping[str, str]) -> None:
        topic = NewTopic(name, num_partitions=partitions, replication_factor=replication_factor, config=dict(config))
        await _wait(self._client.create_topics([topic], request_timeout=self.timeout)[name], self.timeout)

    async def grow(self, name: str, total: int) -> None:
        """Make the topic ``total`` partitions (Kafka refuses fewer with ``INVALID_PARTITIONS``)."""
        futures = self._client.create_partitions([NewPartitions(name, total)], request_timeout=self.timeout)
        await _wait(futures[name], self.timeout)

    async def set_config(self, name: str, values: Mapping[str, str], remove: list[str]) -> None:
        """Set ``values`` and drop ``remove`` (back to the broker default) on the topic, leaving other keys alone."""
        entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in sorted(values.items())]
        entries += [ConfigEntry(k, "", incremental_operation=AlterConfigOpType.DELETE) for k in sorted(remove)]
        resource = ConfigResource(ResourceType.TOPIC, name, incremental_configs=entries)
        await _wait(self._client.incremental_alter_configs([resource])[resource], self.timeout)

    async def delete(self, name: str) -> None:
        futures = self._client.delete_topics([name], operation_timeout=self.timeout, request_timeout=self.timeout)
        try:
            await _wait(futures[name], self.timeout)
        except AdminError as exc:
            if exc.code != "UNKNOWN_TOPIC_OR_PART":
                raise

    async def end_offsets(self, name: str, partitions: int, earliest: bool = False) -> dict[int, int]:
        """The next offset to be written in each partition (the high watermark), or with ``earliest`` the first
        offset still kept (retention moves it)."""
        spec = _EARLIEST if earliest else _LATEST
        request = {TopicPartition(name, p): spec for p in range(partitions)}
        futures = self._client.list_offsets(request, request_timeout=self.timeout)
        answers = {tp.partition: await _wait(f, self.timeout) for tp, f in futures.items()}
        return {p: int(info.offset) for p, info in answers.items()}

    async def newest_timestamp(self, name: str, partitions: int) -> int | None:
        """The timestamp (ms) of the newest message in the topic; None when it holds none."""
        request = {TopicPartition(name, p): _NEWEST for p in range(partitions)}
        futures = self._client.list_offsets(request, request_timeout=self.timeout)
        stamps = [int((await _wait(f, self.timeout)).timestamp) for f in futures.values()]
        newest = max(stamps, default=-1)
        return newest if newest >= 0 else None

    async def assignment(self, name: str) -> dict[int, list[int]]:
        """Each partition's replicas (broker ids, the preferred leader first), as Kafka reports them now."""
        futures = self._client.describe_topics(TopicCollection([name]), request_timeout=self.timeout)
        description: Any = await _wait(futures[name], self.timeout)
        return {p.id: [node.id for node in p.replicas] for p in description.partitions}

    async def broker_ids(self) -> list[int]:
        """The ids of the brokers the cluster reports."""
        try:
            metadata = await asyncio.to_thread(self._client.list_topics, timeout=self.timeout)
        except KafkaException as exc:
            error = exc.args[0]
            raise AdminError(error.name(), error.str(), bool(error.retriable())) from None
        return sorted(int(b) for b in metadata.brokers)

    async def throttle(self, name: str, brokers: list[int], rate: int | None) -> None:
        """With ``rate``: cap replication traffic of throttled replicas at ``rate`` bytes/s on every broker and
        throttle every replica of the topic; with None: the topic's replicas are no longer throttled (the brokers'
        rate stays, it applies to throttled replicas only)."""
        keys = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")
        if rate is None:
            await self.set_config(name, {}, list(keys))
            return
        await self.replication_rate(brokers, rate)
        await self.set_config(name, dict.fromkeys(keys, "*"), [])

    async def replication_rate(self, brokers: list[int], rate: int) -> None:
        """Cap the replication traffic of throttled replicas at ``rate`` bytes/s (leader and follower side) on each
        broker."""
        rates = {"leader.replication.throttled.rate": str(rate), "follower.replication.throttled.rate": str(rate)}
        for broker in brokers:
            entries = [ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET) for k, v in rates.items()]
            resource = ConfigResource(ResourceType.BROKER, str(broker), incremental_configs=entries)
            await _wait(self._client.incremental_alter_configs([resource])[resource], self.timeout)

    async def throttle_replicas(self, name: str, leaders: str, followers: str) -> None:
        """Throttle exactly these replicas of the topic (``partition:broker`` lists; empty: that side none)."""
        keys = ("leader.replication.throttled.replicas", "follower.replication.throttled.replicas")
        values = dict(zip(keys, (leaders, followers), strict=True))
        await self.set_config(name, {k: v for k, v in values.items() if v}, [k for k, v in values.items() if not v])

    async def in_sync(self) -> list[tuple[str, int, tuple[int, ...], tuple[int, ...], int]]:
        """Every partition of every topic (internal ones included: ``__consumer_offsets`` matters to a restart) as
        (topic, partition, replicas, in-sync replicas, the topic's effective ``min.insync.replicas``)."""
        try:
            metadata = await asyncio.to_thread(self._client.list_topics, timeout=self.timeout)
        except KafkaException as exc:
            error = exc.args[0]
            raise AdminError(error.name(), error.str(), bool(error.retriable())) from None
        topics = {name: topic for name, topic in metadata.topics.items() if topic.error is None}
        resources = [ConfigResource(ResourceType.TOPIC, name) for name in topics]
        futures = self._client.describe_configs(resources, request_timeout=self.timeout) if resources else {}
        found = []
        for resource, future in futures.items():
            entries: dict[str, Any] = await _wait(future, self.timeout)
            setting = entries.get("min.insync.replicas")
            min_isr = int(setting.value) if setting is not None and setting.value is not None else 1
            for p in topics[resource.name].partitions.values():
                found.append((resource.name, int(p.id), tuple(p.replicas), tuple(p.isrs), min_isr))
        return sorted(found)

    async def brokers(self) -> int:
        """How many brokers the cluster reports."""
        return (await self.health())[0]

    async def health(self) -> tuple[int, int, int]:
        """Brokers, under-replicated partitions and partitions without a leader, over every topic."""
        try:
            metadata = await asyncio.to_thread(self._client.list_topics, timeout=self.timeout)
        except KafkaException as exc:
            error = exc.args[0]
            raise AdminError(error.name(), error.str(), bool(error.retriable())) from None
        partitions = [p for topic in metadata.topics.values() for p in topic.partitions.values()]
        under = sum(1 for p in partitions if len(p.isrs) < len(p.replicas))
        offline = sum(1 for p in partitions if p.leader < 0)
        return len(metadata.brokers), under, offline

    # --- for kanri.kafka.cluster (issue 30, the KafkaCluster's status): the whole metadata in one request ---
    async def partition_map(self) -> tuple[list[int], list[tuple[str, int, int, tuple[int, ...], tuple[int, ...]]]]:
        """The registered broker ids, and every partition of every topic (internal ones included) as (topic,
        partition, leader or -1, replicas, in-sync replicas): one metadata request."""
        try:
            metadata = await asyncio.to_thread(self._client.list_topics, timeout=self.timeout)
        except KafkaException as exc:
            error = exc.args[0]
            raise AdminError(error.name(), error.str(), bool(error.retriable())) from None
        rows = [(name, int(p.id), int(p.leader), tuple(p.replicas), tuple(p.isrs))
                for name, topic in metadata.topics.items() if topic.error is None
                for p in topic.partitions.values()]  # fmt: skip
        return sorted(int(b) for b in metadata.brokers), sorted(rows)

    # --- end of the KafkaCluster addition ---

    async def groups_on(self, name: str, partitions: int) -> list[GroupLag]:
        """Every consumer group with committed offsets on the topic or members assigned to it, with its lag."""
        listing: Any = await _wait(self._client.list_consumer_groups(request_timeout=self.timeout), self.timeout)
        ids = sorted(g.group_id for g in listing.valid)
        if not ids:
            return []
        described = self._client.describe_consumer_groups(ids, request_timeout=self.timeout)
        readers: list[tuple[Any, dict[int, int]]] = []
        for group in ids:
            description: Any = await _wait(described[group], self.timeout)
            committed = await self._committed(group, name)
            if committed or any(_assigned(member, name) for member in description.members):
                readers.append((description, committed))
        if not readers:
            return []
        ends = await self.end_offsets(name, partitions)
        starts = await self.end_offsets(name, partitions, earliest=True)
        groups = []
        for description, committed in readers:
            lag = sum(max(0, end - committed.get(p, starts.get(p, end))) for p, end in ends.items())
            state = str(getattr(description.state, "name", description.state))
            groups.append(GroupLag(description.group_id, state, lag, len(description.members), committed))
        return groups

    async def lag_by_group(self, name: str, partitions: int, max_age: float) -> dict[str, int]:
        """Each consumer group's lag on the topic, from a listing of every group's offsets shared by all topics of
        the cluster (taken at most every ``max_age`` seconds): for the metrics, where growth and deletion read
        :meth:`groups_on` fresh. Two offset requests for a topic some group reads, none for the others."""
        readers = {group: offsets[name] for group, offsets in (await self._all_offsets(max_age)).items()
                   if name in offsets}  # fmt: skip
        if not readers:
            return {}
        ends = await self.end_offsets(name, partitions)
        starts = await self.end_offsets(name, partitions, earliest=True)
        return {group: sum(max(0, end - committed.get(p, starts.get(p, end))) for p, end in ends.items())
                for group, committed in readers.items()}  # fmt: skip

    async def _all_offsets(self, max_age: float) -> dict[str, dict[str, dict[int, int]]]:
        """Group -> topic -> partition -> committed offset, for every group of the cluster, including a topic its
        members are assigned without having committed on it (an empty mapping). Shared and cached."""
        async with self._offsets_lock:
            if self._offsets is not None and time.monotonic() - self._offsets[0] < max_age:
                return self._offsets[1]
            taken = time.monotonic()
            listing: Any = await _wait(self._client.list_consumer_groups(request_timeout=self.timeout), self.timeout)
            ids = sorted(g.group_id for g in listing.valid)
            described = self._client.describe_consumer_groups(ids, request_timeout=self.timeout) if ids else {}
            found: dict[str, dict[str, dict[int, int]]] = {}
            for group in ids:
                description: Any = await _wait(described[group], self.timeout)
                for member in description.members:
                    for tp in member.assignment.topic_partitions if member.assignment else []:
                        found.setdefault(group, {}).setdefault(tp.topic, {})
                request = [ConsumerGroupTopicPartitions(group)]
                futures = self._client.list_consumer_group_offsets(request, request_timeout=self.timeout)
                answer: Any = await _wait(futures[group], self.timeout)
                for tp in answer.topic_partitions:
                    if tp.offset >= 0:
                        found.setdefault(group, {}).setdefault(tp.topic, {})[tp.partition] = int(tp.offset)
            self._offsets = (taken, found)
            return found

    async def _committed(self, group: str, name: str) -> dict[int, int]:
        request = [ConsumerGroupTopicPartitions(group)]
        futures = self._client.list_consumer_group_offsets(request, request_timeout=self.timeout)
        answer: Any = await _wait(futures[group], self.timeout)
        return {tp.partition: int(tp.offset) for tp in answer.topic_partitions if tp.topic == name and tp.offset >= 0}


def _assigned(member: Any, topic: str) -> bool:
    assignment = member.assignment
    return bool(assignment) and any(tp.topic == topic for tp in assignment.topic_partitions)


def _own_config(entries: Mapping[str, Any]) -> tuple[dict[str, str], int | None]:
    """The topic's own settings (``DYNAMIC_TOPIC_CONFIG``) and its effective ``retention.ms``."""
    own = {
        key: str(entry.value)
        for key, entry in entries.items()
        if entry.source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value and entry.value is not None
    }
    retention = entries.get("retention.ms")
    return own, int(retention.value) if retention is not None and retention.value is not None else None
