"""The cloud operator's process: one Manager running the DatabaseInstance controller (``kanri cloud run``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from kanri import runtime as kr
from kanri.cloud.api import DatabaseClass, DatabaseInstance
from kanri.cloud.names import FIELD_MANAGER
from kanri.cloud.reconciler import controller

__all__ = ["build_manager", "run"]


def build_manager(client: kr.Client, *, namespace: str | None = None, health_port: int = 8083,
                  leader_election: bool = False, leader_election_namespace: str | None = None,
                  registry: CollectorRegistry | None = None) -> kr.Manager:  # fmt: skip
    """A Manager running the DatabaseInstance controller (its metrics in the Manager's registry)."""
    options = kr.ManagerOptions(name=FIELD_MANAGER, namespace=namespace, health_port=health_port,
                                leader_election=leader_election,
                                leader_election_namespace=leader_election_namespace or "default")  # fmt: skip
    manager = kr.Manager(client, options, registry=registry)
    manager.add(controller(manager, registry=manager.registry))
    return manager


async def run(kubeconfig: str | None, *, namespace: str | None = None, health_port: int = 8083,
              install_crds: bool = False, leader_election: bool = False) -> None:  # fmt: skip
    """Run until SIGTERM or SIGINT; ``install_crds`` applies both CRDs first (development clusters)."""
    registry = CollectorRegistry()
    async with await kr.Client.auto(kubeconfig, metrics=kr.ClientMetrics(registry)) as client:
        if install_crds:
            for kind in (DatabaseInstance, DatabaseClass):
                await kr.install_crd(client, kind, field_manager=FIELD_MANAGER)
        manager = build_manager(client, namespace=namespace, health_port=health_port,
                                leader_election=leader_election, registry=registry)  # fmt: skip
        await manager.run()
