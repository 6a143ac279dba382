"""Benchmark the KafkaTopic controller against a real control plane and a real broker (a host process from the jars
of ``make kafka-dist``): time to converge N topics, reconciles and operator CPU per topic at rest, and the time of
each partition-growth step (6 -> 12 in steps of 2, no pause, no consumer groups); with ``--brokers 3
--replicas-mb N`` also a replication-factor change 1 -> 3 of a 12-partition topic holding N MB (the operator's
throttle, 20 MiB/s per broker, in force).

    .venv/bin/python bench/kafka_topics.py --topics 1000 --rest 60
    .venv/bin/python bench/kafka_topics.py --topics 100 --rest 20 --brokers 3 --replicas-mb 64

Prints the numbers; record them in docs/benchmarks.md with the command that produced it. The operator runs in
this process (its CPU time is this process's, the broker's is not counted).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Producer
from prometheus_client import CollectorRegistry

from kanri.kafka.api import CLUSTER_KIND, TOPIC_KIND, KafkaCluster, KafkaTopic
from kanri.kafka.topics.reconciler import controller
from kanri.local import ControlPlane
from kanri.runtime import Client, Manager, ManagerOptions, install_crd, parse_time
from kanri.runtime.kinds import NAMESPACE

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' host broker
from tests.kafka_host import host_cluster

NS = "bench"


def reconciles(registry: CollectorRegistry) -> float:
    return sum(
        registry.get_sample_value("controller_runtime_reconcile_total", {"controller": "kafkatopic", "result": r})
        or 0.0
        for r in ("success", "requeue_after", "error")
    )


async def ready_count(client: Client) -> int:
    items, _ = await client.list(TOPIC_KIND, NS)
    return sum(1 for t in items if (t.get("status") or {}).get("phase") == "Ready")


async def wait_ready(client: Client, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (ready := await ready_count(client)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{ready} of {count} topics Ready after {timeout} s")
        await asyncio.sleep(1)


async def growth_steps(client: Client) -> list[float]:
    spec = {"cluster": "events", "partitions": 6, "replicationFactor": 1,
            "partitionGrowth": {"stepSize": 2, "pauseSeconds": 0}}  # fmt: skip
    await client.create(TOPIC_KIND, {"metadata": {"name": "grown", "namespace": NS}, "spec": spec})
    await wait_named(client, "grown", 6)
    asked = time.time()
    await client.patch(TOPIC_KIND, "grown", {"spec": {"partitions": 12}}, NS)
    obj = await wait_named(client, "grown", 12)
    times = [asked] + [parse_time(s["time"]).timestamp() for s in obj["status"]["steps"]]
    return [b - a for a, b in itertools.pairwise(times)]


async def wait_named(client: Client, name: str, partitions: int) -> dict[str, Any]:
    while True:
        obj = await client.get(TOPIC_KIND, name, NS)
        status = obj.get("status") or {}
        if status.get("phase") == "Ready" and status.get("partitions") == partitions:
            return obj
        await asyncio.sleep(0.2)


async def replicas_change(client: Client, bootstrap: str, megabytes: int) -> None:
    spec = {"cluster": "events", "partitions": 12, "replicationFactor": 1}
    await client.create(TOPIC_KIND, {"metadata": {"name": "copied", "namespace": NS}, "spec": spec})
    await wait_named(client, "copied", 12)
    await asyncio.to_thread(fill, bootstrap, "copied", megabytes)
    asked = time.monotonic()
    await client.patch(TOPIC_KIND, "copied", {"spec": {"replicationFactor": 3}}, NS)
    while True:
        status = (await client.get(TOPIC_KIND, "copied", NS)).get("status") or {}
        if status.get("phase") == "Ready" and status.get("replicationFactor") == 3 and "replicasChange" not in status:
            break
        await asyncio.sleep(0.2)
    took = time.monotonic() - asked
    print(f"replication factor 1 -> 3, 12 partitions, {megabytes} MB: {took:.1f} s ({2 * megabytes / took:.1f} MB/s "
          "copied over the brokers)")  # fmt: skip


def fill(bootstrap: str, topic: str, megabytes: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "1", "linger.ms": 20, "compression.type": "none"})
    chunk = bytes(range(256)) * 256  # 64 KiB, incompressible enough
    for i in range(megabytes * 16):
        while True:
            try:
                producer.produce(topic, key=str(i).encode(), value=chunk)
                break
            except BufferError:
                producer.poll(0.1)
    assert producer.flush(120) == 0


async def run(topics: int, rest: float, brokers: int = 1, replicas_mb: int = 0) -> None:
    with tempfile.TemporaryDirectory() as scratch, host_cluster(Path(scratch) / "kafka", brokers) as nodes:
        bootstrap = ",".join(node.bootstrap for node in nodes)
        plane = ControlPlane(Path(scratch) / "cp")
        endpoint = plane.start(exit_with_parent=True)
        try:
            async with await Client.from_kubeconfig(str(endpoint.kubeconfig)) as client:
                for kind in (KafkaCluster, KafkaTopic):
                    await install_crd(client, kind, field_manager="bench")
                await client.create(NAMESPACE, {"metadata": {"name": NS}})
                cluster = await client.create(CLUSTER_KIND, {"metadata": {"name": "events", "namespace": NS},
                                                             "spec": {"storage": {"size": "1Gi"}}})  # fmt: skip
                cluster["status"] = {"bootstrap": bootstrap}
                await client.replace_status(CLUSTER_KIND, cluster)
                registry = CollectorRegistry()
                manager = Manager(client, ManagerOptions(name="kafka-bench", namespace=NS, leader_election=False,
                                                         health_port=0), registry=registry)  # fmt: skip
                manager.add(controller(manager, registry=CollectorRegistry()))
                task = asyncio.create_task(manager.run(handle_signals=False))
                try:
                    await measure(client, registry, topics, rest)
                    if replicas_mb:
                        await replicas_change(client, bootstrap, replicas_mb)
                finally:
                    manager.stop()
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(task, 30)
        finally:
            plane.stop()


async def measure(client: Client, registry: CollectorRegistry, topics: int, rest: float) -> None:
    started, cpu = time.monotonic(), time.process_time()
    for i in range(topics):
        body = {"metadata": {"name": f"t{i:04d}", "namespace": NS},
                "spec": {"cluster": "events", "partitions": 1, "replicationFactor": 1}}  # fmt: skip
        await client.create(TOPIC_KIND, body)
    await wait_ready(client, topics, timeout=max(300, topics))
    converge, converge_cpu = time.monotonic() - started, time.process_time() - cpu
    print(f"{topics} topics created and Ready in {converge:.1f} s (operator CPU {converge_cpu:.1f} s)")
    before, cpu, at = reconciles(registry), time.process_time(), time.monotonic()
    await asyncio.sleep(rest)
    spent, elapsed = time.process_time() - cpu, time.monotonic() - at
    per_minute = (reconciles(registry) - before) / topics / elapsed * 60
    print(f"at rest over {elapsed:.0f} s: {per_minute:.2f} reconciles per topic per minute, operator CPU "
          f"{spent / elapsed * 100:.1f}% of a core ({spent / topics / elapsed * 60 * 1000:.2f} ms per topic per "
          "minute)")  # fmt: skip
    steps = await growth_steps(client)
    print("growth 6->12 in steps of 2: " + ", ".join(f"{s:.2f} s" for s in steps) + f"; total {sum(steps):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--rest", type=float, default=60.0, help="seconds measured at rest")
    parser.add_argument("--brokers", type=int, default=1, help="host brokers of one KRaft quorum")
    parser.add_argument("--replicas-mb", type=int, default=0, help="with --brokers 3: time RF 1 -> 3 of N MB")
    args = parser.parse_args()
    if args.replicas_mb and args.brokers < 3:
        parser.error("--replicas-mb needs --brokers 3")
    asyncio.run(run(args.topics, args.rest, args.brokers, args.replicas_mb))


if __name__ == "__main__":
    main()
