"""One admin client per KafkaCluster: kept while its bootstrap address shares a broker with the new one, closed and
replaced when it shares none, closed when the cluster goes — librdkafka's threads are counted, not assumed."""

from __future__ import annotations

import asyncio
import gc
import os
import time
from collections.abc import Callable

import pytest

from kanri.kafka.topics.admin import AdminError
from kanri.kafka.topics.context import Admins

CLUSTER = ("shop", "events")


def threads() -> int:
    """librdkafka's threads in this process (it names them ``rdk:*``); other tests' threads do not count."""
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return sum(1 for name in names if name.startswith("rdk:"))


def test_a_changed_bootstrap_keeps_the_client_while_a_broker_is_shared_and_replaces_it_otherwise() -> None:
    admins = Admins()
    first = admins.of(CLUSTER, "10.0.0.1:9092,10.0.0.2:9092")
    same = admins.of(CLUSTER, "10.0.0.2:9092,10.0.0.3:9092")  # one broker restarted with a new IP
    assert same is first
    assert first.bootstrap == "10.0.0.2:9092,10.0.0.3:9092"  # kanri's own requests go to the current brokers
    other = admins.of(("shop", "audit"), "10.0.0.2:9092")  # another cluster never shares a client
    assert other is not first
    replaced = admins.of(CLUSTER, "10.0.1.1:9092")  # every broker moved: the old client knows no one
    assert replaced is not first
    with pytest.raises(AdminError, match="closed") as closed:
        asyncio.run(first.describe("orders"))
    assert closed.value.retriable  # a pass that still held it looks again with the new one
    assert len(admins) == 2
    admins.forget(CLUSTER)
    admins.forget(("shop", "audit"))
    assert len(admins) == 0


def test_replaced_and_forgotten_clients_release_their_threads() -> None:
    before = threads()
    admins = Admins()
    admins.of(CLUSTER, "127.0.0.1:1")
    one = threads() - before
    assert one > 0  # librdkafka runs threads per client
    for n in range(2, 12):  # ten address changes sharing no broker
        admins.of(CLUSTER, f"127.0.0.{n}:1")
    settled(lambda count: count - before <= one, "a replaced client kept its threads")
    admins.forget(CLUSTER)
    settled(lambda count: count <= before, "a forgotten client kept its threads")


def settled(holds: Callable[[int], bool], what: str, timeout: float = 20.0) -> None:
    """librdkafka's threads end asynchronously after its client is destroyed: wait (with a deadline) until the
    thread count satisfies ``holds``."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        count = threads()
        if holds(count):
            return
        assert time.monotonic() < deadline, f"{what}: {count} threads after {timeout} s"
        time.sleep(0.05)
