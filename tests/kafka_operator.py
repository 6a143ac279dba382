"""The Kafka operator's two controllers in the test's own process, for the tests that run broker pods (the local
node, the real nodes): both CRDs installed, one manager watching the test's namespace, stopped at the end."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from kanri.kafka.api import KafkaCluster, KafkaTopic
from kanri.kafka.cluster.reconciler import controller as cluster_controller
from kanri.kafka.topics.reconciler import controller as topic_controller
from kanri.runtime import Client, Manager, ManagerOptions, install_crd


@contextlib.asynccontextmanager
async def kafka_operator(kubeconfig: Path, namespace: str) -> AsyncIterator[Client]:
    """A client of the cluster at ``kubeconfig`` while both controllers run, watching ``namespace``."""
    async with await Client.from_kubeconfig(str(kubeconfig)) as client:
        for kind in (KafkaCluster, KafkaTopic):
            await install_crd(client, kind, field_manager="kanri-tests")
        options = ManagerOptions(name="kafka-operator", namespace=namespace, leader_election=False, health_port=None)
        manager = Manager(client, options)
        manager.add(cluster_controller(manager))
        manager.add(topic_controller(manager))
        task = asyncio.create_task(manager.run(handle_signals=False))
        try:
            yield client
        finally:
            manager.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 20)
