"""The Kafka operator's process: the KafkaCluster and KafkaTopic controllers in one manager (``kanri kafka run``)."""

from __future__ import annotations

from kanri import runtime as kr
from kanri.kafka.api import FIELD_MANAGER, KafkaCluster, KafkaTopic
from kanri.kafka.cluster.reconciler import controller as cluster_controller
from kanri.kafka.topics.context import Admins
from kanri.kafka.topics.reconciler import controller as topic_controller


def build(manager: kr.Manager) -> None:
    """Add both controllers to ``manager``, sharing one admin client per Kafka cluster; their metrics go to the
    manager's registry, the one its /metrics serves."""
    admins = Admins()
    manager.add(cluster_controller(manager, admins=admins, registry=manager.registry))
    manager.add(topic_controller(manager, admins=admins, registry=manager.registry))


async def run(kubeconfig: str | None, *, install_crds: bool, health_port: int, namespace: str | None = None) -> None:
    """Run both controllers until cancelled."""
    async with await kr.Client.auto(kubeconfig) as client:
        if install_crds:
            for kind in (KafkaCluster, KafkaTopic):
                await kr.install_crd(client, kind, field_manager=FIELD_MANAGER)
        options = kr.ManagerOptions(name=FIELD_MANAGER, health_port=health_port, namespace=namespace)
        manager = kr.Manager(client, options)
        build(manager)
        await manager.run()
