"""One admin client per KafkaCluster: kept while its bootstrap address shares a broker with the new one, closed and
replaced when it shares none, closed when the cluster goes — librdkafka's threads are counted, not assumed."""

from __future__ import annotations

import asyncio
import gc
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kanri.kafka.topics.admin import AdminError
from kanri.kafka.topics.context import Admins

CLUSTER = ("shop", "events")


def threads() -> int:
    """librdkafka's threads in this process (it names them ``rdk:*``)."""
    return len(thread_names())


def thread_names() -> list[str]:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return sorted(name for name in names if name.startswith("rdk:"))


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
    # In a process of its own: another test's client whose threads are still ending (or still alive) would move the
    # count this test compares against.
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", f"import {__name__} as t; t.count_threads_of_replaced_clients()"],
                          cwd=root, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "threads of one client:" in done.stdout, done.stdout


def count_threads_of_replaced_clients() -> None:
    """The scenario, run in a fresh process (no rdk thread exists before it)."""
    assert threads() == 0
    admins = Admins()
    # Passes still running hold the clients they started with: a replaced client must let its threads go on close,
    # not when the last holder drops it.
    held = [admins.of(CLUSTER, "127.0.0.1:1")]
    # The client's threads start, and name themselves, asynchronously: count them once all are there (the main and
    # background threads and at least the internal and the bootstrap broker's), not at the first look.
    one = settled(complete_client, "one client's threads never all started")
    print(f"threads of one client: {one}")
    for n in range(2, 12):  # ten address changes sharing no broker
        held.append(admins.of(CLUSTER, f"127.0.0.{n}:1"))
    settled(lambda: threads() <= one, "a replaced client kept its threads")
    admins.forget(CLUSTER)
    settled(lambda: threads() == 0, "a forgotten client kept its threads")
    assert len(held) == 11


def complete_client() -> bool:
    names = thread_names()
    brokers = sum(1 for name in names if name.startswith("rdk:broker"))
    return "rdk:main" in names and "rdk:bg" in names and brokers >= 2


def settled(holds: Callable[[], bool], what: str, timeout: float = 30.0) -> int:
    """librdkafka's threads start and end asynchronously: wait (with a deadline) until ``holds``; the rdk thread
    count then."""
    deadline = time.monotonic() + timeout
    while True:
        gc.collect()
        if holds():
            return threads()
        assert time.monotonic() < deadline, f"{what}: {thread_names()} after {timeout} s"
        time.sleep(0.05)
