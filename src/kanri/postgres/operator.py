"""Wiring the PostgreSQL operator: one Controller on a Manager, watching everything the reconciler reads.

``build_manager`` is what ``kanri run`` calls; tests call it too, with their own client, namespace and instance
client.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.backup import BackupMetrics, BackupSettings
from kanri.postgres.instances import HttpInstanceClient, InstanceClient
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import CLUSTER
from kanri.postgres.metrics import PostgresMetrics
from kanri.postgres.reconciler import PostgresClusterReconciler
from kanri.runtime import Cache, Client, Controller, ControllerOptions, EventRecorder, Manager, ManagerOptions, Request
from kanri.runtime.kinds import (
    CONFIG_MAP,
    NETWORK_POLICY,
    POD,
    POD_DISRUPTION_BUDGET,
    PVC,
    ROLE,
    ROLE_BINDING,
    SECRET,
    SERVICE,
    SERVICE_ACCOUNT,
    STATEFUL_SET,
    STORAGE_CLASS,
)

__all__ = ["OperatorOptions", "build_manager"]

Obj = dict[str, Any]
NAME = "kanri-postgres"


@dataclass(frozen=True)
class OperatorOptions:
    """How ``kanri run`` runs the operator."""

    namespace: str | None = None
    """Watch only this namespace (None: every namespace)."""
    leader_election: bool = True
    leader_election_namespace: str = "default"
    """Where the Lease lives: the operator's own namespace."""
    health_port: int | None = 8081
    refresh: float = 10.0
    """How often each cluster's instances are asked for their state."""
    max_concurrent_reconciles: int = 4
    default_backup_repository: S3Repository | None = None
    """The platform's default backup repository, its credentials Secret in ``leader_election_namespace`` (the
    operator's own namespace); see docs/backups.md."""
    manager: dict[str, Any] = field(default_factory=dict)
    """Further ManagerOptions fields (lease timings, graceful shutdown), for tests."""


def _by_cluster_label(obj: Obj) -> list[Request]:
    # Children without an owner reference (claims, Secrets) and pods (owned by their StatefulSet) carry the label.
    cluster = (obj["metadata"].get("labels") or {}).get(CLUSTER)
    return [Request(obj["metadata"].get("namespace") or "", cluster)] if cluster else []


def _every_cluster(cache: Cache) -> Any:
    def mapper(_: Obj) -> list[Request]:
        return [Request(c["metadata"]["namespace"], c["metadata"]["name"]) for c in cache.list(POSTGRES_CLUSTER)]

    return mapper


def build_manager(
    client: Client,
    options: OperatorOptions,
    *,
    instances: InstanceClient | None = None,
    registry: CollectorRegistry | None = None,
) -> Manager:
    """A Manager running the PostgresCluster controller; ``instances`` defaults to HTTP on port 8008."""
    manager_options = ManagerOptions(
        name=NAME,
        namespace=options.namespace,
        leader_election=options.leader_election,
        leader_election_namespace=options.leader_election_namespace,
        health_port=options.health_port,
        **options.manager,
    )
    manager = Manager(client, manager_options, registry=registry)
    reconciler = PostgresClusterReconciler(
        manager.cache,
        client,
        instances=instances or HttpInstanceClient(),
        events=EventRecorder(client, component=NAME),
        refresh=options.refresh,
        metrics=PostgresMetrics(manager.registry),
    )
    reconciler.backup = BackupSettings(
        options.default_backup_repository, options.leader_election_namespace, BackupMetrics(manager.registry)
    )
    controller = Controller(
        "postgrescluster",
        reconciler,
        for_kind=POSTGRES_CLUSTER,
        options=ControllerOptions(max_concurrent_reconciles=options.max_concurrent_reconciles),
    )
    for kind in (STATEFUL_SET, SERVICE, CONFIG_MAP, SERVICE_ACCOUNT, ROLE, ROLE_BINDING, POD_DISRUPTION_BUDGET,
                 NETWORK_POLICY):  # fmt: skip
        controller.owns(kind)
    for kind in (PVC, SECRET, POD):
        controller.watches(kind, _by_cluster_label)
    controller.watches(STORAGE_CLASS, _every_cluster(manager.cache))
    manager.add(controller)
    return manager
