"""The Kafka operator end to end with a node stopped (issue 30 "Done means"): three local nodes in three zones, a
3-broker KRaft cluster of pods (one broker per node, all three controller voters), a topic of RF 3 and
``min.insync.replicas`` 2 grown 6 -> 12 in steps of 2 (3 s apart) under a keyed ``acks=all`` producer whose bootstrap
lists all three brokers.

After the first step, the node of the active controller (the metadata quorum's leader, which also leads a third of
the partitions) loses power (the ``stop`` chaos verb: every container SIGKILLed, the volume kept). Asserted while it is
down: the growth finishes, the producer's writes are still acknowledged (two in-sync replicas satisfy
``min.insync.replicas`` 2), and the KafkaCluster's status says the broker is not ready and partitions are
under-replicated. The node is started again: the cluster is Ready with 0 under-replicated partitions. Afterwards
every acknowledged message is consumed at exactly the partition and offset it was acknowledged at (none lost);
failed sends are counted and printed (an ``acks=all`` error is not a loss: the producer was told).

Per-key order: within a partition a key's messages are in sequence order (asserted). Across a growth step a key
moves when CRC-32(key) modulo the partition count changes (librdkafka's default partitioner, consistent_random);
asserted: every message of a key went where that rule sends it for one of the counts 6, 8, 10, 12, and in sequence
order the counts never go back (a key changes partition only at a step, once, and never returns to a count it left:
its old and new partitions' messages do not interleave). What a step breaks is the order *across* partitions: a
consumer reading the old and the new partition independently can see a key's newer messages first. The keys that
moved at each step are printed (``-s``), measured and as the rule predicts.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
import time
import zlib
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.kafka.api import CLUSTER_KIND, TOPIC_KIND
from kanri.kafka.topics.admin import TopicAdmin
from kanri.local import Endpoint
from kanri.local.imagemap import default_image_map
from kanri.local.node import NodeHost, NodeOptions
from kanri.runtime import Client, get_condition
from kanri.runtime.kinds import POD
from tests.e2e.test_kafka_e2e import KEYS, KeyedProducer, Ledger, assert_ledger_kept, consume_all, steps_done
from tests.kafka_operator import kafka_operator
from tests.local_node_support import running_nodes, with_test_network
from tests.support import NotYet, eventually

pytestmark = [pytest.mark.timeout(420), pytest.mark.faults]
Obj = dict[str, Any]
NAME = "events"
TOPIC = "orders"
COUNTS = (6, 8, 10, 12)
"""The partition counts the topic goes through (steps of 2)."""


@pytest_asyncio.fixture(loop_scope="session")
async def host(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[NodeHost]:
    options = with_test_network(
        NodeOptions(data_dir=tmp_path / "nodes", name=f"test-kc-{secrets.token_hex(3)}", images=default_image_map(),
                    restart_backoff_base=0.5, restart_backoff_max=5.0)
    )  # fmt: skip
    async with running_nodes(control_plane.kubeconfig, options, count=3) as nodes:
        yield nodes


@pytest_asyncio.fixture(loop_scope="session")
async def operator(control_plane: Endpoint, namespace: str, host: NodeHost) -> AsyncIterator[Client]:
    """Both CRDs installed and both controllers running in this process, watching the test's namespace (stopped
    before the nodes are)."""
    async with kafka_operator(control_plane.kubeconfig, namespace) as client:
        yield client


async def until(read: Callable[[], Awaitable[Obj]], done: Callable[[Obj], bool], what: str, timeout: float) -> Obj:
    """Poll ``read`` until ``done`` holds for what it returns; else fail naming ``what`` and the last thing read."""
    seen: list[Obj] = [{}]

    async def look() -> Obj | None:
        seen[0] = await read()
        return seen[0] if done(seen[0]) else None

    try:
        return await eventually(look, timeout=timeout, interval=0.5)
    except NotYet as exc:
        raise AssertionError(f"{what}: not so after {timeout} s; last seen {seen[0]!r:.3000}") from exc


def current(obj: Obj) -> Obj:
    """``obj``'s status once it describes the object's current generation ({} before)."""
    status = obj.get("status") or {}
    return status if status.get("observedGeneration") == obj["metadata"]["generation"] else {}


def ready(obj: Obj, brokers: int = 3) -> bool:
    """A KafkaCluster Ready with ``brokers`` ready brokers and nothing under-replicated."""
    status = current(obj)
    return status.get("phase") == "Ready" and status.get("readyBrokers") == brokers and (
        status.get("underReplicatedPartitions") == 0)  # fmt: skip


def degraded(broker: int) -> Callable[[Obj], bool]:
    """The KafkaCluster not Ready, with partitions under-replicated and broker ``broker`` reported not ready or not
    registered with Kafka (or gone from the list: its pod evicted)."""

    def check(obj: Obj) -> bool:
        status = obj.get("status") or {}
        condition = get_condition(status.get("conditions"), "Ready")
        entry = next((b for b in status.get("brokers") or [] if b.get("nodeId") == broker), None)
        down = entry is None or not entry.get("ready") or entry.get("registered") is False
        under = int(status.get("underReplicatedPartitions") or 0)
        return condition is not None and condition["status"] == "False" and under > 0 and down

    return check


def leader_of(obj: Obj) -> int:
    """The controller quorum's leader as the KafkaCluster's status reports it (-1: none known)."""
    return int((((obj.get("status") or {}).get("quorum")) or {}).get("leaderId", -1))


async def nodes_of_brokers(client: Client, namespace: str) -> dict[int, str]:
    """Each broker's node (``events-<id>``'s ``spec.nodeName``)."""
    found = {}
    for broker in range(3):
        found[broker] = str((await client.get(POD, f"{NAME}-{broker}", namespace))["spec"].get("nodeName"))
    return found


async def messages_in(bootstrap: str, partitions: int) -> int:
    """How many messages the topic holds (end minus start offset, summed: no transactions, so no markers)."""
    admin = TopicAdmin(bootstrap)
    try:
        end = await admin.end_offsets(TOPIC, partitions)
        start = await admin.end_offsets(TOPIC, partitions, earliest=True)
    finally:
        admin.close()
    return sum(end.values()) - sum(start.values())


def partition_for(key: str, partitions: int) -> int:
    """Where librdkafka's default partitioner (consistent_random) sends a keyed message: CRC-32 of the key modulo
    the partition count."""
    return zlib.crc32(key.encode()) % partitions


def counts_used(key: str, partitions: list[int]) -> list[int] | None:
    """For a key's partitions in sequence order, the index in :data:`COUNTS` each message was partitioned with: the
    earliest fit that never goes back to a smaller count; None when there is none (a message where no count in
    sequence sends it)."""
    index, used = 0, []
    for partition in partitions:
        while index < len(COUNTS) and partition_for(key, COUNTS[index]) != partition:
            index += 1
        if index == len(COUNTS):
            return None
        used.append(index)
    return used


async def test_a_topic_grows_6_to_12_under_a_keyed_acks_all_producer_while_a_brokers_node_is_stopped(
    operator: Client, host: NodeHost, namespace: str
) -> None:
    client = operator

    async def read_cluster() -> Obj:
        return await client.get(CLUSTER_KIND, NAME, namespace)

    async def read_topic() -> Obj:
        return await client.get(TOPIC_KIND, TOPIC, namespace)

    started = time.monotonic()
    await client.create(CLUSTER_KIND, {"metadata": {"name": NAME, "namespace": namespace},
                                       "spec": {"replicas": 3, "storage": {"size": "256Mi"}}})  # fmt: skip
    cluster = await until(read_cluster, ready, "the cluster Ready with 3 brokers", 240)
    placed = await nodes_of_brokers(client, namespace)
    assert len(set(placed.values())) == 3, f"one broker per node expected, the scheduler placed them {placed}"
    bootstrap = str(cluster["status"]["bootstrap"])
    assert len(bootstrap.split(",")) == 3, f"the producer's bootstrap lists every broker: {bootstrap}"
    growth = {"stepSize": 2, "pauseSeconds": 3, "maxLag": 1000000}
    spec = {"cluster": NAME, "partitions": 6, "replicationFactor": 3, "config": {"min.insync.replicas": "2"},
            "partitionGrowth": growth}  # fmt: skip
    await client.create(TOPIC_KIND, {"metadata": {"name": TOPIC, "namespace": namespace}, "spec": spec})
    await until(read_topic, lambda t: current(t).get("phase") == "Ready", "the topic Ready", 60)

    ledger = Ledger()
    producer = await asyncio.to_thread(KeyedProducer, bootstrap, TOPIC, ledger)
    stopped: str | None = None
    try:
        await eventually(lambda: asyncio.sleep(0, len(ledger.acked) > 500), timeout=60)
        await client.patch(TOPIC_KIND, TOPIC, {"spec": {"partitions": 12}}, namespace)
        await eventually(lambda: steps_done(client, namespace, 1), timeout=60)
        # the first step is done: the active controller's node loses power
        quorum = await until(read_cluster, lambda c: leader_of(c) >= 0, "a quorum leader in status", 30)
        victim = leader_of(quorum)
        victim_pod = str((await client.get(POD, f"{NAME}-{victim}", namespace))["metadata"]["uid"])
        acked_at_stop, stopped = len(ledger.acked), placed[victim]
        assert await host.chaos("stop", stopped)
        stopped_at, stop_clock = time.monotonic(), time.strftime("%H:%M:%S", time.gmtime())

        async def since_stop(wait: Awaitable[Obj]) -> tuple[Obj, float]:
            found = await wait
            return found, time.monotonic() - stopped_at

        # with the node down: the growth finishes, the status says what is missing, writes are still acknowledged
        async with asyncio.TaskGroup() as group:
            growing = group.create_task(since_stop(until(read_topic, lambda t: current(t).get("phase") == "Ready",
                                                         "the growth finished", 150)))  # fmt: skip
            reporting = group.create_task(since_stop(until(read_cluster, degraded(victim),
                                                           f"broker {victim} reported down", 120)))  # fmt: skip
        (grown, grown_after), (down, down_after) = growing.result(), reporting.result()
        acked_at_report = len(ledger.acked)
        await eventually(lambda: asyncio.sleep(0, len(ledger.acked) > acked_at_report + 300), timeout=60)
        acked_while_down = len(ledger.acked) - acked_at_stop
        assert await host.chaos("start", stopped)
        stopped, down_for = None, time.monotonic() - stopped_at
        healed = await until(read_cluster, ready, "the cluster Ready again with 3 brokers", 240)
        healed_after = time.monotonic() - stopped_at - down_for
        acked_at_heal = len(ledger.acked)
        await eventually(lambda: asyncio.sleep(0, len(ledger.acked) > acked_at_heal + 300), timeout=60)
    finally:
        await asyncio.to_thread(producer.close)
        if stopped is not None:
            await host.chaos("start", stopped)
    replaced = (await client.get(POD, f"{NAME}-{victim}", namespace))["metadata"]["uid"] != victim_pod
    steps = [(s["fromPartitions"], s["toPartitions"]) for s in grown["status"]["steps"]]
    assert steps == [(6, 8), (8, 10), (10, 12)]
    print(f"kafka chaos: node stopped at {stop_clock}Z; steps done at {[s['time'] for s in grown['status']['steps']]}")
    assert grown["status"]["partitions"] == 12
    condition = get_condition(down["status"]["conditions"], "Ready")
    assert condition is not None
    print(
        f"kafka chaos: broker {victim} (the active controller) on node {placed[victim]} stopped; growth 6->12 "
        f"finished {grown_after:.1f} s after; status said {condition['reason']!r} ({condition['message']}) "
        f"{down_after:.1f} s after; node down {down_for:.1f} s, {acked_while_down} messages acknowledged meanwhile; "
        f"Ready with 3 brokers and 0 under-replicated {healed_after:.1f} s after the start "
        f"(pod {'replaced' if replaced else 'the same'})"
    )
    # every acknowledged message is where it was acknowledged; failures were reported to the producer, not lost
    bootstrap = str(healed["status"]["bootstrap"])
    held = await messages_in(bootstrap, 12)
    seen = await asyncio.to_thread(consume_all, bootstrap, TOPIC, held)
    print(f"kafka chaos: {producer.sent} sent, {len(ledger.acked)} acknowledged, {ledger.failed} failed (told to the "
          f"producer), {held} in the topic, {len(seen)} consumed; test {time.monotonic() - started:.0f} s")  # fmt: skip
    # nothing lost or moved; per-key order within a partition: a key's sequence numbers go up in offset order
    assert_ledger_kept(ledger, seen, held)
    # across the steps: each key moves only where the partitioner sends it for the next count, never back
    by_key: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for (key, seq), (partition, _) in ledger.acked.items():
        by_key[key].append((seq, partition))
    moves = [0] * len(COUNTS)
    for key, messages in by_key.items():
        partitions = [partition for _, partition in sorted(messages)]
        used = counts_used(key, partitions)
        expected = [partition_for(key, n) for n in COUNTS]
        assert used is not None, f"{key}: partitions {partitions} do not follow the counts {COUNTS} ({expected})"
        for before, after, index in zip(partitions, partitions[1:], used[1:], strict=False):
            moves[index] += before != after
    for i, (a, b) in enumerate(itertools.pairwise(COUNTS), start=1):
        predicted = sum(partition_for(key, a) != partition_for(key, b) for key in by_key)
        print(f"kafka chaos: step {a}->{b}: {moves[i]} of {KEYS} keys changed partition ({predicted} by CRC-32)")
    assert sum(moves) > 0, "the producer used the new partitions"
