"""What a topic step may use: the kit's pass context plus the topic's spec, its name in Kafka, the admin client of
its cluster and what Kafka reported this pass. Steps depend on :class:`TopicContext`, never on the reconciler."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from kanri import kit
from kanri.kafka.api import FIELD_MANAGER, LABELS, TOPIC_KIND, KafkaTopicSpec
from kanri.kafka.topics.admin import TopicAdmin, TopicState
from kanri.kafka.topics.ownership import topic_name
from kanri.runtime import Cache, Client, EventRecorder, Result

#: Problem reasons, most serious first (the Degraded condition names the first).
SEVERITY = ("ResourceConflict", "ReplicationFactorTooLarge", "TopicRefused", "ReplicasChangeRefused",
            "DeletionBlocked")  # fmt: skip


@dataclass(frozen=True)
class Timings:
    """How often the topic controller looks (the product defaults; tests pass shorter ones)."""

    resync: float = 30.0
    """A converged topic is looked at again after this: drift made outside kanri is found within it."""
    snapshot_age: float = 5.0
    """How old the shared read of every topic of a cluster may be (TopicAdmin.snapshot); a topic kanri changed
    itself is read alone until a newer snapshot."""
    group_offsets_age: float = 30.0
    """How old the shared listing of every consumer group's offsets may be (the lag metric only)."""


DEFAULT_TIMINGS = Timings()


class TopicContext(kit.PassContext, Protocol):
    @property
    def spec(self) -> KafkaTopicSpec: ...

    @property
    def topic(self) -> str:
        """The topic's name in Kafka."""
        ...

    def now(self) -> datetime: ...

    @property
    def timings(self) -> Timings: ...

    admin: TopicAdmin | None
    """The cluster's admin client, once the connect step found the cluster."""
    observed: TopicState | None
    """The topic as Kafka reported it this pass (None: it does not exist, or was not asked yet)."""


class Admins:
    """One admin client per KafkaCluster, shared by both controllers and every topic on it (librdkafka runs threads
    per client: 1,000 topics on one cluster still make one client).

    The bootstrap address (the ready brokers' pod IPs) changes whenever a broker restarts. A client learns every
    broker from metadata, so while the new address shares a broker with the old one the client is kept (only its
    ``bootstrap`` is updated, for the requests kanri writes itself); when none is shared it could reach no one it
    knows: it is closed and replaced. :meth:`forget` closes the client of a cluster that is gone."""

    def __init__(self, factory: Callable[[str], TopicAdmin] = TopicAdmin) -> None:
        self._factory = factory
        self._clients: dict[tuple[str, str], TopicAdmin] = {}

    def of(self, cluster: tuple[str, str], bootstrap: str) -> TopicAdmin:
        """The client of ``cluster`` (namespace, name) for its current ``bootstrap``."""
        current = self._clients.get(cluster)
        if current is not None and _addresses(current.bootstrap) & _addresses(bootstrap):
            current.bootstrap = bootstrap
            return current
        if current is not None:
            current.close()
        self._clients[cluster] = self._factory(bootstrap)
        return self._clients[cluster]

    def forget(self, cluster: tuple[str, str]) -> None:
        if (current := self._clients.pop(cluster, None)) is not None:
            current.close()

    def __len__(self) -> int:
        return len(self._clients)


def _addresses(bootstrap: str) -> set[str]:
    return {part.strip() for part in bootstrap.split(",") if part.strip()}


class TopicPass(kit.ObjectPass):
    """One pass over one KafkaTopic (implements :class:`TopicContext`)."""

    def __init__(
        self,
        *,
        client: Client,
        cache: Cache,
        events: EventRecorder,
        obj: dict[str, Any],
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        timings: Timings = DEFAULT_TIMINGS,
    ) -> None:
        super().__init__(client=client, cache=cache, events=events, kind=TOPIC_KIND, obj=obj, labels=LABELS,
                         field_manager=FIELD_MANAGER, severity=SEVERITY)  # fmt: skip
        self._spec = KafkaTopicSpec.model_validate(self.obj.get("spec") or {})
        self._clock = clock
        self._timings = timings
        self.admin: TopicAdmin | None = None
        self.observed: TopicState | None = None

    @property
    def spec(self) -> KafkaTopicSpec:
        return self._spec

    @property
    def topic(self) -> str:
        return topic_name(self.obj)

    def now(self) -> datetime:
        return self._clock()

    @property
    def timings(self) -> Timings:
        return self._timings

    async def run_topic(self, steps: Iterable[Callable[[TopicContext], Awaitable[Result | None]]]) -> Result | None:
        """:meth:`kanri.kit.ObjectPass.run` for topic steps: in order until one returns a Result, then one status
        write."""
        for step in steps:
            ended = await step(self)
            if ended is not None:
                if ended.requeue_after is not None:
                    self.requeue(ended.requeue_after)
                break
        return await self.finish()
