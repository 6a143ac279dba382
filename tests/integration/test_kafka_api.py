"""The KafkaCluster and KafkaTopic kinds on the real API server: what the API refuses, it refuses with a message that
says why (the CEL rules of kanri.kafka.api)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from kanri.kafka.api import CLUSTER_KIND, TOPIC_KIND, KafkaCluster, KafkaTopic
from kanri.local import Endpoint
from kanri.runtime import ApiError, Client, install_crd

Obj = dict[str, Any]


@pytest_asyncio.fixture(loop_scope="session")
async def client(control_plane: Endpoint) -> AsyncIterator[Client]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as c:
        for kind in (KafkaCluster, KafkaTopic):
            await install_crd(c, kind, field_manager="kafka-tests")
        yield c


def topic(namespace: str, **spec: Any) -> Obj:
    return {
        "metadata": {"name": "orders", "namespace": namespace},
        "spec": {"cluster": "events", "partitions": 6} | spec,
    }


async def refused(write: Any) -> str:
    with pytest.raises(ApiError) as error:
        await write
    assert error.value.status == 422, error.value
    return str(error.value)


async def test_partitions_never_decrease_and_the_message_says_why(client: Client, namespace: str) -> None:
    created = await client.create(TOPIC_KIND, topic(namespace))
    assert created["spec"]["deletionPolicy"] == "Retain"
    grown = await client.patch(TOPIC_KIND, "orders", {"spec": {"partitions": 12}}, namespace)
    assert grown["spec"]["partitions"] == 12
    message = await refused(client.patch(TOPIC_KIND, "orders", {"spec": {"partitions": 8}}, namespace))
    assert "partitions may not decrease (from 12 to 8)" in message
    assert "cannot remove partitions" in message
    message = await refused(client.patch(TOPIC_KIND, "orders", {"spec": {"cluster": "other"}}, namespace))
    assert "cluster is fixed" in message
    message = await refused(client.patch(TOPIC_KIND, "orders", {"spec": {"topicName": "orders.v2"}}, namespace))
    assert "topicName is fixed" in message


async def test_unknown_and_operator_owned_topic_settings_are_refused(client: Client, namespace: str) -> None:
    message = await refused(client.create(TOPIC_KIND, topic(namespace, config={"retention.msec": "1", "a": "b"})))
    assert "config has a key Kafka topics do not have" in message
    owned = {"leader.replication.throttled.replicas": "*"}
    message = await refused(client.create(TOPIC_KIND, topic(namespace, config=owned)))
    assert "the operator sets them" in message
    ok = await client.create(TOPIC_KIND, topic(namespace, config={"retention.ms": "3600000"}))
    assert ok["spec"]["config"] == {"retention.ms": "3600000"}
    empty = topic(namespace, partitions=0) | {"metadata": {"name": "empty", "namespace": namespace}}
    message = await refused(client.create(TOPIC_KIND, empty))
    assert "partitions" in message


async def test_a_cluster_refuses_owned_broker_settings_and_a_shrinking_volume(client: Client, namespace: str) -> None:
    def cluster(**spec: Any) -> Obj:
        return {"metadata": {"name": "events", "namespace": namespace},
                "spec": {"storage": {"size": "1Gi"}} | spec}  # fmt: skip

    message = await refused(client.create(CLUSTER_KIND, cluster(config={"node.id": "7", "log.dirs": "/x"})))
    assert "config may not set " in message
    assert "the operator sets these" in message
    message = await refused(client.create(CLUSTER_KIND, cluster(config={"ssl.keystore.location": "/k"})))
    assert "TLS belong to the operator" in message
    created = await client.create(CLUSTER_KIND, cluster(config={"num.partitions": "3"}))
    assert created["spec"]["replicas"] == 3
    assert created["spec"]["version"] == "4.4.0"
    await client.patch(CLUSTER_KIND, "events", {"spec": {"storage": {"size": "2Gi"}}}, namespace)
    message = await refused(client.patch(CLUSTER_KIND, "events", {"spec": {"storage": {"size": "1Gi"}}}, namespace))
    assert "storage.size may not shrink (from 2Gi to 1Gi)" in message
    bad_name = cluster() | {"metadata": {"name": "Bad_Name", "namespace": namespace}}
    message = await refused(client.create(CLUSTER_KIND, bad_name))
    assert "name must start with a letter" in message


async def test_the_controller_voters_are_fixed_and_never_more_than_the_nodes(client: Client, namespace: str) -> None:
    def cluster(name: str, **spec: Any) -> Obj:
        return {"metadata": {"name": name, "namespace": namespace}, "spec": {"storage": {"size": "1Gi"}} | spec}

    message = await refused(client.create(CLUSTER_KIND, cluster("few", replicas=2, controllers=3)))
    assert "replicas may not be fewer than controllers" in message
    with pytest.raises(ApiError) as error:
        await client.create(CLUSTER_KIND, cluster("even", controllers=2))
    assert error.value.status == 422
    assert 'spec.controllers: Unsupported value: 2: supported values: "1", "3", "5"' in str(error.value.body), \
        error.value.body  # fmt: skip
    await client.create(CLUSTER_KIND, cluster("fixed", replicas=5, controllers=3))
    message = await refused(client.patch(CLUSTER_KIND, "fixed", {"spec": {"controllers": 5}}, namespace))
    assert "controllers is fixed" in message
    message = await refused(client.patch(CLUSTER_KIND, "fixed", {"spec": {"replicas": 2}}, namespace))
    assert "replicas may not be fewer than controllers" in message
    await client.patch(CLUSTER_KIND, "fixed", {"spec": {"replicas": 4}}, namespace)  # broker-only nodes go freely
    unset = await client.create(CLUSTER_KIND, cluster("later", replicas=3))
    assert "controllers" not in unset["spec"]
    message = await refused(client.patch(CLUSTER_KIND, "later", {"spec": {"controllers": 3}}, namespace))
    assert "controllers is fixed" in message
    message = await refused(client.patch(CLUSTER_KIND, "later", {"spec": {"dedicatedControllers": True}}, namespace))
    assert "dedicatedControllers is fixed" in message
    message = await refused(client.create(CLUSTER_KIND, cluster("small", replicas=2, dedicatedControllers=True)))
    assert "with dedicatedControllers, replicas (the brokers) is at least 3" in message
    # dedicated: the voters are pods of their own, so fewer brokers than controllers is no contradiction
    await client.create(CLUSTER_KIND, cluster("apart", replicas=3, controllers=5, dedicatedControllers=True))
