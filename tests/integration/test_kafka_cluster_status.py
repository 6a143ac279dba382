"""The KafkaCluster controller on a real API server and controller manager, with three host brokers (one KRaft
quorum on 127.0.0.1-3) as its brokers: the status says what Kafka reports — every broker registered, the
controller quorum's leader and voters caught up (DescribeQuorum on the wire), offline partitions named in a
``Ready=False PartitionsOffline`` while the only broker holding them is down — with the cluster's metrics; and a
change of ``replicas`` refused without touching the StatefulSet: a scale-down naming the broker that holds replicas
and how many (a Warning Event), a scale-up for the static voter list."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from kanri.kafka.api import CLUSTER_KIND
from kanri.kafka.cluster.reconciler import controller as cluster_controller
from kanri.kafka.topics.admin import TopicAdmin
from kanri.runtime import Client, Manager, ManagerOptions, get_condition
from kanri.runtime.kinds import STATEFUL_SET
from tests.integration.test_kafka_replicas import pod_up, revision_of
from tests.integration.test_kafka_topics import client, metric, metric_is
from tests.kafka_host import HostBroker, host_cluster, restart
from tests.support import eventually

__all__ = ["client"]  # the API client fixture, shared with the topic controller's tests

Obj = dict[str, Any]
OFFLINE = "kanri_kafka_cluster_offline_partitions"
REFUSED = "kanri_kafka_cluster_replicas_change_refused"


@pytest.fixture(scope="module")
def brokers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[HostBroker]]:
    with host_cluster(Path(tmp_path_factory.mktemp("kafka-status")), 3) as running:
        yield running


@contextlib.asynccontextmanager
async def cluster_operator(
    client: Client, namespace: str, brokers: list[HostBroker], registry: CollectorRegistry
) -> AsyncIterator[None]:
    """The KafkaCluster controller with a cluster ``events`` whose three pods (made by the real controller manager)
    are reported running at the host brokers' addresses, as a kubelet would."""
    options = ManagerOptions(name="kafka-operator", namespace=namespace, leader_election=False, health_port=0,
                             graceful_shutdown_timeout=10)  # fmt: skip
    manager = Manager(client, options, registry=CollectorRegistry())
    port = int(brokers[0].bootstrap.rpartition(":")[2])
    manager.add(cluster_controller(manager, client_port=port, registry=registry))
    task = asyncio.create_task(manager.run(handle_signals=False))
    try:
        body = {"metadata": {"name": "events", "namespace": namespace}, "spec": {"storage": {"size": "1Gi"}}}
        await client.create(CLUSTER_KIND, body)
        for node in range(3):
            await eventually(lambda n=node: revision_of(client, namespace, f"events-{n}"), timeout=60)  # type: ignore[misc]
            await pod_up(client, namespace, f"events-{node}", node)
        yield
    finally:
        manager.stop()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 20)


async def ready_is(client: Client, namespace: str, reason: str, says: str = "") -> Obj | None:
    """The cluster's status once its Ready condition has ``reason`` and its message holds ``says``."""
    status = (await client.get(CLUSTER_KIND, "events", namespace)).get("status") or {}
    ready = get_condition(status.get("conditions") or [], "Ready") or {}
    return status if ready.get("reason") == reason and says in str(ready.get("message")) else None


async def degraded_is(client: Client, namespace: str, reason: str) -> Obj | None:
    obj = await client.get(CLUSTER_KIND, "events", namespace)
    status = obj.get("status") or {}
    degraded = get_condition(status.get("conditions") or [], "Degraded") or {}
    current = status.get("observedGeneration") == obj["metadata"]["generation"]
    return degraded if current and degraded.get("reason") == reason else None


async def voter_behind(client: Client, namespace: str, node: int) -> Obj | None:
    """``status.quorum`` once voter ``node`` is not caught up."""
    quorum = ((await client.get(CLUSTER_KIND, "events", namespace)).get("status") or {}).get("quorum") or {}
    lagging = [v for v in quorum.get("voters") or [] if v["nodeId"] == node and not v["caughtUp"]]
    return quorum if lagging else None


async def statefulset_replicas(client: Client, namespace: str) -> int:
    return int((await client.get(STATEFUL_SET, "events", namespace))["spec"]["replicas"])


async def test_status_reports_the_quorum_and_offline_partitions_and_refuses_replica_changes(
    client: Client, namespace: str, brokers: list[HostBroker]
) -> None:
    admin = TopicAdmin(",".join(b.bootstrap for b in brokers))
    await admin.create("lonely", 6, 1, {})  # RF 1: a partition led by a stopped broker has no leader at all
    registry = CollectorRegistry()
    labels = {"namespace": namespace, "cluster": "events"}
    async with cluster_operator(client, namespace, brokers, registry):
        status = await eventually(lambda: ready_is(client, namespace, "BrokersReady"), timeout=60)
        quorum = status["quorum"]
        assert quorum["leaderId"] in (0, 1, 2), quorum
        assert [(v["nodeId"], v["caughtUp"]) for v in quorum["voters"]] == [(0, True), (1, True), (2, True)]
        assert [b["registered"] for b in status["brokers"]] == [True, True, True]
        assert (status["offlinePartitions"], status["replicas"]) == (0, 3)
        # the metrics are set right after the status write: looked at until then
        await eventually(
            lambda: metric_is(registry, "kanri_kafka_cluster_quorum_voters_caught_up", labels, 3), timeout=10
        )
        assert metric(registry, "kanri_kafka_cluster_ready", labels) == 1

        assignment = await admin.assignment("lonely")
        on_2 = sorted(p for p, replicas in assignment.items() if replicas == [2])
        assert on_2, assignment  # Kafka spreads 6 partitions over 3 brokers
        await asyncio.to_thread(brokers[2].stop)  # its pod still reads Ready: only Kafka knows
        try:
            status = await eventually(lambda: ready_is(client, namespace, "PartitionsOffline", "lonely-"), timeout=60)
            assert status["offlinePartitions"] == len(on_2), status
            assert f"lonely-{on_2[0]}" in get_condition(status["conditions"], "Ready")["message"]  # type: ignore[index]
            await eventually(lambda: metric_is(registry, OFFLINE, labels, len(on_2)), timeout=10)

            # a scale-down into the controller voters: refused, the StatefulSet untouched
            await client.patch(CLUSTER_KIND, "events", {"spec": {"replicas": 2}}, namespace)
            refused = await eventually(lambda: degraded_is(client, namespace, "VoterListFixed"), timeout=30)
            assert "nodes 0..2 are the KRaft controller voters" in refused["message"], refused
            assert "at least 3 replicas stay" in refused["message"], refused
            # the stopped node is a voter too: the quorum's leader sees it fall behind
            behind = await eventually(lambda: voter_behind(client, namespace, 2), timeout=30)
            assert behind["votersCaughtUp"] == 2, behind
        finally:
            await asyncio.to_thread(restart, brokers[2])
        assert await statefulset_replicas(client, namespace) == 3
        await eventually(lambda: metric_is(registry, REFUSED, labels, 1), timeout=10)

        await client.patch(CLUSTER_KIND, "events", {"spec": {"replicas": 3}}, namespace)
        await eventually(lambda: degraded_is(client, namespace, "AsExpected"), timeout=30)
        status = await eventually(lambda: ready_is(client, namespace, "BrokersReady"), timeout=60)
        assert status["offlinePartitions"] == 0
        assert status["controllers"] == 3
        await eventually(lambda: metric_is(registry, REFUSED, labels, 0), timeout=10)
    admin.close()
