"""The chart's Kafka operator as a pod of the local node (values kafka.enabled), in namespaced mode
(watchNamespaces): under the chart's ServiceAccount and the Role it grants in the watched namespace, its two
controllers make a one-broker KafkaCluster Ready and create a KafkaTopic on it (a message produced with acks=all is
read back), and leave a KafkaCluster in a namespace it does not watch alone. On the broker pod, growth and deletion
as issue 30 asks: a partition step is held while an active consumer group lags and goes on once it caught up; a
`Delete` topic whose consumer group lags is blocked, named in status with the lag and the approval it needs, stays
after the approval while the group lags, and goes once the group caught up; a `Retain` topic (the default)
outlives its KafkaTopic with its messages. `helm uninstall` removes the operator; the cluster, its topic and its
messages stay (the brokers need no operator)."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from kanri.kafka.api import APPROVE_DELETION, CLUSTER_KIND, TOPIC_KIND, KafkaCluster, KafkaTopic
from kanri.kafka.topics.admin import TopicAdmin
from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.runtime import ApiError, Client, install_crd
from kanri.runtime.kinds import DEPLOYMENT, NAMESPACE, POD, STATEFUL_SET
from tests.helm_support import CHART, helm_async, pod_log_tails
from tests.integration.test_kafka_topics import Reader, active_lag, produce
from tests.support import eventually

Obj = dict[str, Any]
OPERATOR_LABEL = "app.kubernetes.io/name=kanri-kafka-operator"


async def phase(client: Client, kind: Any, namespace: str, name: str, wanted: str) -> Obj | None:
    obj = await client.get(kind, name, namespace)
    status = obj.get("status") or {}
    current = status.get("observedGeneration") == obj["metadata"]["generation"]
    return obj if current and status.get("phase") == wanted else None


def produce_and_read_back(bootstrap: str, topic: str, value: bytes, *earlier: bytes) -> list[bytes]:
    """One message with acks=all, then the topic's messages from the start until it and ``earlier`` were read (at
    most 30 s: they may be in different partitions)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    delivered: list[Any] = []
    producer.produce(topic, value, on_delivery=lambda error, message: delivered.append(error))
    producer.flush(30)
    assert delivered == [None], f"not acknowledged: {delivered}"
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"e2e-{secrets.token_hex(3)}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([topic])
    seen: list[bytes] = []
    try:
        for _ in range(30):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None and (body := message.value()) is not None:
                seen.append(body)
            if {value, *earlier} <= set(seen):
                break
    finally:
        consumer.close()
    return seen


def topics_in_kafka(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


def commit_after(bootstrap: str, topic: str, group: str, count: int) -> int:
    """The consumer group ``group`` reads ``count`` messages of ``topic`` (one partition) from where it stands and
    commits; returns the offset it committed."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})  # fmt: skip
    consumer.subscribe([topic])
    read = []
    try:
        for _ in range(60):
            message = consumer.poll(1.0)
            if message is not None and message.error() is None:
                read.append(message)
            if len(read) == count:
                break
        assert len(read) == count, f"read {len(read)} of {count} messages of {topic}"
        consumer.commit(message=read[-1], asynchronous=False)
        offset = read[-1].offset()
        assert offset is not None
        return offset + 1
    finally:
        consumer.close()


async def blocked_by(client: Client, namespace: str, name: str, *wanted: str) -> str | None:
    """The KafkaTopic's ``status.deletionBlockedBy`` once it names every one of ``wanted`` (and no approval when
    ``wanted`` does not ask for one)."""
    status = (await client.get(TOPIC_KIND, name, namespace)).get("status") or {}
    text = str(status.get("deletionBlockedBy") or "")
    if not text or not all(w in text for w in wanted):
        return None
    if not any("approve-deletion" in w for w in wanted) and "approve-deletion" in text:
        return None
    return text


async def growth_blocked(client: Client, namespace: str, name: str, reason: str) -> Obj | None:
    """The KafkaTopic once ``status.growth.blockedBy`` names ``reason``."""
    obj = await client.get(TOPIC_KIND, name, namespace)
    blocked = str(((obj.get("status") or {}).get("growth") or {}).get("blockedBy") or "")
    return obj if reason in blocked else None


async def topic_gone(client: Client, namespace: str, name: str) -> bool:
    try:
        await client.get(TOPIC_KIND, name, namespace)
    except ApiError as exc:
        return exc.not_found
    return False


@pytest.mark.timeout(420)
async def test_the_charts_kafka_operator_runs_a_cluster_and_topic_in_its_namespace_only_and_uninstall_keeps_them(
    client: Client, node: LocalNode, control_plane: Endpoint, namespace: str, tmp_path: Path
) -> None:
    release = f"kanri-{secrets.token_hex(3)}"
    kubeconfig = ["--kubeconfig", str(control_plane.kubeconfig), "--namespace", namespace]
    home = tmp_path / "helm"
    elsewhere = f"kafka-unwatched-{secrets.token_hex(3)}"
    for kind in (KafkaCluster, KafkaTopic):  # crds/ brings them on a first install; shared by the session here
        await install_crd(client, kind, field_manager="kanri-tests")
    await client.create(NAMESPACE, {"metadata": {"name": elsewhere}})
    installed = False
    try:
        values = ["--set", f"watchNamespaces={{{namespace}}}", "--set", "kafka.enabled=true"]
        await helm_async("install", release, str(CHART), *kubeconfig, *values, "--wait", "--timeout", "180s",
                         home=home)  # fmt: skip
        installed = True
        operators, _ = await client.list(POD, namespace, label_selector=OPERATOR_LABEL)
        assert len(operators) == 1
        spec = {"replicas": 1, "storage": {"size": "256Mi"}}
        await client.create(CLUSTER_KIND, {"metadata": {"name": "events", "namespace": namespace}, "spec": spec})
        await client.create(CLUSTER_KIND, {"metadata": {"name": "ignored", "namespace": elsewhere}, "spec": spec})
        cluster = await eventually(lambda: phase(client, CLUSTER_KIND, namespace, "events", "Ready"), timeout=240)
        bootstrap = cluster["status"]["bootstrap"]
        topic = {"cluster": "events", "partitions": 2, "replicationFactor": 1}
        await client.create(TOPIC_KIND, {"metadata": {"name": "audit", "namespace": namespace}, "spec": topic})
        found = await eventually(lambda: phase(client, TOPIC_KIND, namespace, "audit", "Ready"), timeout=90)
        assert found["status"]["partitions"] == 2, found["status"]
        seen = await asyncio.to_thread(produce_and_read_back, bootstrap, "audit", b"through-the-chart")
        assert b"through-the-chart" in seen, seen
        # Growth in checked steps: held while the active group "billing" lags over maxLag, then on to 4 partitions
        growth = {"stepSize": 1, "pauseSeconds": 1, "maxLag": 5}
        await client.create(TOPIC_KIND, {"metadata": {"name": "metrics", "namespace": namespace},
                                         "spec": {"cluster": "events", "partitions": 2, "replicationFactor": 1,
                                                  "partitionGrowth": growth}})  # fmt: skip
        await eventually(lambda: phase(client, TOPIC_KIND, namespace, "metrics", "Ready"), timeout=90)
        await asyncio.to_thread(produce, bootstrap, "metrics", 10)
        admin = TopicAdmin(bootstrap)
        reader = await asyncio.to_thread(Reader, bootstrap, "metrics", "billing")
        try:
            await eventually(lambda: active_lag(admin, "metrics", 2, "billing", 10), timeout=60)
            await client.patch(TOPIC_KIND, "metrics", {"spec": {"partitions": 4}}, namespace)
            held = await eventually(lambda: growth_blocked(client, namespace, "metrics", "billing lag 10"), timeout=60)
            assert held["status"]["partitions"] == 2, held["status"]
            reader.catch_up.set()  # the group commits what it read: lag 0, the steps go on
            grown = await eventually(lambda: phase(client, TOPIC_KIND, namespace, "metrics", "Ready"), timeout=90)
        finally:
            await asyncio.to_thread(reader.close)
            admin.close()
        assert [(s["fromPartitions"], s["toPartitions"]) for s in grown["status"]["steps"]] == [(2, 3), (3, 4)]
        assert grown["status"]["partitions"] == 4
        # Delete: blocked while the group "reports" lags, and without an approval; then approved, then caught up
        await client.create(TOPIC_KIND, {"metadata": {"name": "ledger", "namespace": namespace},
                                         "spec": {"cluster": "events", "partitions": 1, "replicationFactor": 1,
                                                  "deletionPolicy": "Delete"}})  # fmt: skip
        await eventually(lambda: phase(client, TOPIC_KIND, namespace, "ledger", "Ready"), timeout=90)
        await asyncio.to_thread(produce, bootstrap, "ledger", 5)
        assert await asyncio.to_thread(commit_after, bootstrap, "ledger", "reports", 2) == 2
        await client.delete(TOPIC_KIND, "ledger", namespace)
        reasons = await eventually(
            lambda: blocked_by(client, namespace, "ledger", "reports (lag 3)", f"{APPROVE_DELETION}=ledger"), timeout=90
        )
        await client.patch(TOPIC_KIND, "ledger", {"metadata": {"annotations": {APPROVE_DELETION: "ledger"}}}, namespace)
        await eventually(lambda: blocked_by(client, namespace, "ledger", "reports (lag 3)"), timeout=60)
        assert await asyncio.to_thread(commit_after, bootstrap, "ledger", "reports", 3) == 5
        await eventually(lambda: topic_gone(client, namespace, "ledger"), timeout=90)
        # Retain (the default): the KafkaTopic goes, the topic and its message stay
        await client.delete(TOPIC_KIND, "audit", namespace)
        await eventually(lambda: topic_gone(client, namespace, "audit"), timeout=60)
        # not watched: no child, no status there (its Role is in the watched namespace only)
        items, _ = await client.list(STATEFUL_SET, elsewhere)
        assert items == []
        assert not (await client.get(CLUSTER_KIND, "ignored", elsewhere)).get("status")

        await helm_async("uninstall", release, *kubeconfig, "--wait", "--timeout", "120s", home=home)
        installed = False
        with pytest.raises(ApiError) as gone:
            await client.get(DEPLOYMENT, f"{release}-kafka-operator", namespace)
        assert gone.value.not_found
        # the cluster, the topic and its message stay: the broker serves without the operator
        again = await asyncio.to_thread(produce_and_read_back, bootstrap, "audit", b"after-uninstall",
                                        b"through-the-chart")  # fmt: skip
        assert b"through-the-chart" in again, again
        assert b"after-uninstall" in again, again
        assert "ledger" not in await asyncio.to_thread(topics_in_kafka, bootstrap), reasons
    finally:
        print(await pod_log_tails(tmp_path / "node", "*kafka-operator*"))
        if installed:
            await helm_async("uninstall", release, *kubeconfig, "--wait", "--timeout", "120s", home=home)
        await client.delete(NAMESPACE, elsewhere)
