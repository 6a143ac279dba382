"""The Kafka operator's process: the KafkaCluster and KafkaTopic controllers in one manager (``kanri kafka run``, or
``python -m kanri.kafka.operator`` as the Helm chart's Deployment runs it; docs/kafka.md, "Installing")."""

from __future__ import annotations

import asyncio

from kanri import kit
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


async def run(
    kubeconfig: str | None,
    *,
    install_crds: bool,
    health_port: int,
    namespace: str | None = None,
    namespaces: tuple[str, ...] = (),
    health_host: str = "127.0.0.1",
    metrics_auth: bool = False,
) -> None:
    """Run both controllers until cancelled, for KafkaClusters and KafkaTopics in ``namespace`` or ``namespaces``
    (neither: every namespace). Further replicas stand by: the Lease lives in ``POD_NAMESPACE`` (the chart sets it),
    else ``default``."""
    async with await kr.Client.auto(kubeconfig) as client:
        if install_crds:
            for kind in (KafkaCluster, KafkaTopic):
                await kr.install_crd(client, kind, field_manager=FIELD_MANAGER)
        options = kit.manager_options(
            FIELD_MANAGER,
            health_port=health_port,
            namespace=namespace,
            namespaces=namespaces,
            health_host=health_host,
            metrics_auth=metrics_auth,
        )
        manager = kr.Manager(client, options)
        build(manager)
        await manager.run()


def main() -> None:
    args = kit.operator_parser(__doc__, install_flag="--install-crds", health_port=8084).parse_args()
    kr.configure_logging(args.log_level)
    asyncio.run(run(args.kubeconfig, install_crds=args.install_crds, health_port=args.health_port,
                    namespaces=tuple(args.namespace), health_host=args.health_host,
                    metrics_auth=args.metrics_auth))  # fmt: skip


if __name__ == "__main__":
    main()
