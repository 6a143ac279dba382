"""Wiring the PostgreSQL operator: one Controller on a Manager, watching everything the reconciler reads.

``build_manager`` is what ``kanri run`` calls; tests call it too, with their own client, namespace and instance
client.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import structlog
from prometheus_client import CollectorRegistry

from kanri import __version__
from kanri.kit import Permission, grant
from kanri.postgres.api import CUSTOM_RESOURCES
from kanri.postgres.api.served import SERVED  # issue 28: the versions this release serves
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.backup.archiving import BackupMetrics, BackupSettings, identities_for, utc_now
from kanri.postgres.backup.cleanup import FINALIZER_TIMEOUT
from kanri.postgres.backup.controller import BackupClient, PostgresBackupReconciler
from kanri.postgres.children.images import PostgresImages
from kanri.postgres.cluster.instances import HttpInstanceClient, InstanceClient
from kanri.postgres.cluster.reconciler import PostgresClusterReconciler
from kanri.postgres.ha.position import NODE_GRACE
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.postgres.labels import CLUSTER, foreign
from kanri.postgres.metrics import PostgresMetrics
from kanri.postgres.pooler.controller import POSTGRES_POOLER, PostgresPoolerReconciler, pooler_controller
from kanri.postgres.pooler.steps import PoolerRoleClient
from kanri.postgres.tls.rotation import TlsSettings
from kanri.postgres.versions import (  # issue 28
    check_single_version,
    serve_versions,
    versioned_crds,
    versions_from_environment,
    webhook_from_environment,
)
from kanri.runtime import (
    ApiError,
    Cache,
    Client,
    Controller,
    ControllerOptions,
    Conversions,
    EventRecorder,
    Kind,
    Manager,
    ManagerOptions,
    Request,
    WebhookOptions,
    crd_for,
    upgrade_crds,
)
from kanri.runtime.kinds import (
    CONFIG_MAP,
    CRD,
    DEPLOYMENT,
    ENDPOINT_SLICE,
    EVENT,
    LEASE,
    NETWORK_POLICY,
    NODE,
    POD,
    POD_DISRUPTION_BUDGET,
    PVC,
    SECRET,
    SERVICE,
    SERVICE_ACCOUNT,
    STATEFUL_SET,
    STORAGE_CLASS,
)

__all__ = [
    "CONVERSION",
    "CRD_UPGRADE",
    "LEADER_ELECTION",
    "READS",
    "UPGRADE_CRDS_ENV",
    "WRITES",
    "OperatorOptions",
    "Permission",
    "build_manager",
    "operator_crds",
    "permissions",
]

Obj = dict[str, Any]
NAME = "kanri-postgres"
UPGRADE_CRDS_ENV = "KANRI_UPGRADE_CRDS"
"""``true`` (the chart sets it): the operator brings its CRDs up to date before it starts (docs/helm.md)."""
log = structlog.get_logger("kanri.postgres")

# What the controller watches: owned children (by owner reference), children found by the cluster label, and the
# StorageClasses every cluster's claims depend on. The informers need list + watch on each.
OWNED: tuple[Kind, ...] = (STATEFUL_SET, SERVICE, CONFIG_MAP, SERVICE_ACCOUNT, POD_DISRUPTION_BUDGET, NETWORK_POLICY)
LABELLED: tuple[Kind, ...] = (PVC, SECRET, POD)
CLUSTER_WIDE: tuple[Kind, ...] = (STORAGE_CLASS,)


# Every write the operator sends, per kind: the one list the chart's RBAC rules are checked against
# (tests/unit/test_operator_permissions.py also checks it against the client calls in kanri.postgres).
# Server-side apply is a PATCH that creates a missing object, so an applied kind needs create and patch.
WRITES: tuple[Permission, ...] = (
    # Finalizer and annotation patches; the controller re-reads the object it reconciles with a GET.
    grant(POSTGRES_CLUSTER, "get", "patch"),
    grant(POSTGRES_CLUSTER, "patch", subresource="status"),
    # Setting blockOwnerDeletion on a child's owner reference needs update on the owner's finalizers where the
    # OwnerReferencesPermissionEnforcement admission plugin is on (OpenShift, hardened clusters).
    grant(POSTGRES_CLUSTER, "update", subresource="finalizers"),
    grant(STATEFUL_SET, "create", "patch", "delete"),  # applied; a removed replica's set is deleted
    grant(SERVICE, "create", "patch"),  # applied
    grant(CONFIG_MAP, "create", "patch"),  # applied
    grant(SERVICE_ACCOUNT, "create", "patch"),  # applied (the instances' identity; no Role: children/rbac.py)
    grant(POD_DISRUPTION_BUDGET, "create", "patch", "delete"),  # applied; dropped below two instances
    grant(NETWORK_POLICY, "create", "patch"),  # applied
    grant(PVC, "create", "patch", "delete"),  # created once, annotated, resized; deleted on scale-down or Delete
    # generated once, never overwritten (a renewed managed TLS certificate is replaced whole); Retain/Delete at deletion
    # get: the platform's default backup repository key pair, read from the operator's namespace (backup.py)
    grant(SECRET, "get", "create", "update", "patch", "delete"),
    # role labels that steer the Services (primary, replica, fenced); the restore rehearsal's throwaway pod
    grant(POD, "create", "patch", "delete"),
    grant(EVENT, "create", "patch"),  # the runtime's EventRecorder: a new Event, then its count
    # the first and the scheduled base backups are PostgresBackups the operator creates; retention deletes them
    grant(POSTGRES_BACKUP, "create", "delete"),
    grant(POSTGRES_BACKUP, "patch", subresource="status"),  # the backup's state machine
    # a read, not a write: is the primary's Node cordoned? Then a planned switchover first (ha/maintenance.py)
    grant(NODE, "get"),
    # PostgresPooler (pooler/): its status, and PgBouncer's Deployment (applied; Services, ConfigMaps and Secrets
    # are granted above)
    grant(POSTGRES_POOLER, "get"),  # kit's status ledger re-reads it after a conflict
    grant(POSTGRES_POOLER, "patch", subresource="status"),
    grant(DEPLOYMENT, "create", "patch"),
)
# Reads beyond the informers' list + watch: -rw's EndpointSlices, listed while Ready waits until -rw routes to the
# primary (cluster/routed.py).
READS: tuple[Permission, ...] = (grant(ENDPOINT_SLICE, "list"),)
# Leader election (the runtime's LeaderElector): only in the operator's own namespace, so a Role of its own.
LEADER_ELECTION: tuple[Permission, ...] = (grant(LEASE, "get", "create", "update"),)
# Bringing its own CRDs up to date at start (kanri.runtime.upgrade_crds): read and replace, the chart names the two
# CRDs (resourceNames); the chart's crds/ creates them, so no create.
CRD_UPGRADE: tuple[Permission, ...] = (grant(CRD, "get", "update"),)
# issue 28, conversion and storage migration (OperatorOptions.webhook): not in permissions() until the chart serves
# the webhook. The certificate Secret lives in the operator's own namespace; the webhook patches the CRDs'
# spec.conversion; the migration lists and rewrites every object, prunes storedVersions and records an Event on the
# CRD (namespace default). get: the webhook is ready only once the API server converted one stored object for a GET
# in v1beta1 (without it every replica stayed unready on a cluster: the chart granted list alone).
CONVERSION: tuple[Permission, ...] = (
    grant(SECRET, "get", "create", "update"),
    grant(CRD, "get", "patch"),
    grant(CRD, "patch", subresource="status"),
    grant(POSTGRES_CLUSTER, "get", "list", "update"),
    grant(POSTGRES_BACKUP, "get", "list", "update"),
    grant(POSTGRES_POOLER, "get", "list", "update"),
    grant(EVENT, "create", "patch"),
)


def permissions() -> dict[tuple[Kind, str], frozenset[str]]:
    """Everything the operator needs outside leader election: list + watch on what it watches, plus WRITES, READS
    and CRD_UPGRADE."""
    needed: dict[tuple[Kind, str], frozenset[str]] = {}
    for kind in (POSTGRES_CLUSTER, POSTGRES_BACKUP, POSTGRES_POOLER, DEPLOYMENT, *OWNED, *LABELLED, *CLUSTER_WIDE):
        needed[(kind, "")] = frozenset({"list", "watch"})
    for permission in (*WRITES, *READS, *CRD_UPGRADE):
        key = (permission.kind, permission.subresource)
        needed[key] = needed.get(key, frozenset()) | permission.verbs
    return needed


@dataclass(frozen=True)
class OperatorOptions:
    """How ``kanri run`` runs the operator."""

    namespace: str | None = None
    """Watch only this namespace (None: every namespace, or those of ``namespaces``)."""
    namespaces: tuple[str, ...] = ()
    """Watch only these namespaces (``kanri run --namespace a --namespace b``); empty and no ``namespace``: all."""
    leader_election: bool = True
    leader_election_namespace: str = "default"
    """Where the Lease lives: the operator's own namespace."""
    operator_namespace: str | None = None
    """The namespace the operator's pods run in (``kanri run``: ``POD_NAMESPACE``): the clusters' NetworkPolicies
    admit the operator to the instance API from there, and the default backup repository's credentials Secret is
    read there. None: ``leader_election_namespace``."""
    health_port: int | None = 8081
    refresh: float = 10.0
    """How often each cluster's instances are asked for their state."""
    max_concurrent_reconciles: int = 4
    default_backup_repository: S3Repository | None = None
    """The platform's default backup repository, its credentials Secret in ``leader_election_namespace`` (the
    operator's own namespace); see docs/backups.md."""
    allowed_backup_endpoints: tuple[str, ...] = ()
    """The S3 endpoints clusters may name in their own repositories (``kanri run --allowed-backup-endpoint``): URLs
    or hosts (``host[:port]``); empty: any. The default repository's endpoint is always allowed (docs/backups.md,
    "Untrusted endpoints")."""
    allowed_priority_classes: tuple[str, ...] = ()
    """The PriorityClasses a cluster's pod template may name (``kanri run --allowed-priority-class``); empty: any the
    API accepts (never the system- ones). See :mod:`kanri.postgres.pods.policy`."""
    node_monitor_grace: float = NODE_GRACE
    """Seconds the cluster's node lifecycle controller waits before it marks a silent node ``Ready=Unknown``
    (kube-controller-manager ``--node-monitor-grace-period``): a failover after an operator outage anchors the
    replicas' evidence on it (:mod:`kanri.postgres.ha.position`). Never set it above the real value."""
    postgres_images: PostgresImages = field(default_factory=PostgresImages.from_environment)
    """The PostgreSQL images per major, from ``KANRI_POSTGRES_IMAGES`` (the chart sets it on the operator's pod;
    unset: ``kanri.dev/postgres:<major>``, the local cluster's names). See :mod:`kanri.postgres.children.images`."""
    backup_now: Callable[[], datetime] = utc_now
    """"Now" for base backups' schedule and retention: a test hook (``kanri run --backup-clock-offset-file``, tests) to
    age backups without skewing the clock the object store checks requests against."""
    upgrade_crds: bool = field(default_factory=lambda: os.environ.get(UPGRADE_CRDS_ENV) == "true")
    """Bring the PostgreSQL CRDs up to this operator's version before the manager starts, refusing to run against
    a newer operator's different CRDs (``KANRI_UPGRADE_CRDS=true``, set by the chart; see docs/helm.md, "Upgrades
    and the CRDs"). Off by default: tests and ``kanri run`` on a laptop install the CRDs themselves."""
    manager: dict[str, Any] = field(default_factory=dict)
    """Further ManagerOptions fields (lease timings, graceful shutdown), for tests."""
    # issue 28: conversion and storage migration
    webhook: WebhookOptions | None = field(default_factory=webhook_from_environment)
    """Serve the conversion webhook in every replica and bring the two-version CRDs (``versions``) naming it
    (``KANRI_WEBHOOK_SERVICE`` + ``POD_NAMESPACE``). None: the CRDs serve v1alpha1 alone, no webhook, no migration.
    Without ``upgrade_crds`` the two-version CRDs (``operator_crds(webhook)``) must be applied by hand: until they
    serve v1beta1 the webhook's readiness check cannot read through it, and the operator stays unready."""
    versions: Conversions = field(default_factory=versions_from_environment)
    """The versions the CRDs serve and the webhook converts, chosen by ``KANRI_STORAGE_VERSION`` (the chart's
    ``conversionWebhook.storageVersion``): ``v1alpha1`` (the default: v1alpha1 stored, v1beta1 served,
    ``kanri.postgres.api.served.SERVED``) or ``v1beta1`` (stored, ``kanri.postgres.api.conversion.POSTGRES``; the
    leader's storage migration rewrites every object). Only used with ``webhook``."""
    storage_migration_rate: float = 20.0
    """Objects the storage migration rewrites per second at most."""
    tls: TlsSettings = field(default_factory=TlsSettings)
    """The CA's lifetime and how long each phase of its rotation lasts (kanri.postgres.tls.rotation)."""
    finalizer_timeout: float = FINALIZER_TIMEOUT
    """Seconds a deleted cluster's finalizer waits for its backups' deletion (deletionPolicy Delete) before it goes
    anyway, naming what was left (kanri.postgres.backup.cleanup)."""
    poolers: bool = False
    """Run the PostgresPooler controller (``kanri run`` does; docs/pooler.md). Its CRD must be installed: every
    controller waits for every informer's first list, so an unserved kind would hold the whole operator."""


def _by_cluster_label(obj: Obj) -> list[Request]:
    # Children without an owner reference (claims, Secrets) and pods (owned by their StatefulSet) carry the label.
    # Another application's objects of a cluster of the same name are none of its business.
    cluster = (obj["metadata"].get("labels") or {}).get(CLUSTER)
    return [Request(obj["metadata"].get("namespace") or "", cluster)] if cluster and not foreign(obj) else []


def _backup_cluster(obj: Obj) -> list[Request]:
    # A PostgresBackup changed: its cluster's status summarises its backups.
    cluster = (obj.get("spec") or {}).get("cluster")
    return [Request(obj["metadata"].get("namespace") or "", cluster)] if cluster else []


def _backups_of(cache: Cache) -> Any:
    def mapper(obj: Obj) -> list[Request]:
        # A cluster (ready now?) or a backup (finished: the next may go) changed: every backup of that cluster.
        meta = obj["metadata"]
        cluster = meta["name"] if obj.get("kind") == POSTGRES_CLUSTER.kind else (obj.get("spec") or {}).get("cluster")
        return [Request(b["metadata"]["namespace"], b["metadata"]["name"])
                for b in cache.list(POSTGRES_BACKUP, meta.get("namespace"))
                if (b.get("spec") or {}).get("cluster") == cluster]  # fmt: skip

    return mapper


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
        namespaces=options.namespaces,
        leader_election=options.leader_election,
        leader_election_namespace=options.leader_election_namespace,
        health_port=options.health_port,
        **options.manager,
    )
    manager: Manager
    if options.upgrade_crds:
        manager = _CrdUpgradingManager(client, manager_options, registry=registry)
        manager.crds = operator_crds(options.webhook, options.versions)
        manager.single_version = options.webhook is None
    else:
        manager = Manager(client, manager_options, registry=registry)
    own_namespace = options.operator_namespace or options.leader_election_namespace
    reconciler = PostgresClusterReconciler(
        manager.cache,
        client,
        instances=instances or HttpInstanceClient(),
        events=EventRecorder(client, component=NAME),
        refresh=options.refresh,
        metrics=PostgresMetrics(manager.registry),
        operator_namespace=own_namespace,
    )
    reconciler.allowed_priority_classes = options.allowed_priority_classes
    reconciler.node_monitor_grace = options.node_monitor_grace
    reconciler.images = options.postgres_images
    reconciler.backup_cleanup.timeout = options.finalizer_timeout
    reconciler.tls = options.tls
    reconciler.backup = BackupSettings(
        options.default_backup_repository,
        own_namespace,
        BackupMetrics(manager.registry),
        now=options.backup_now,
        allowed_endpoints=options.allowed_backup_endpoints,
        identities=identities_for(options.default_backup_repository, own_namespace),
    )
    manager.add(_cluster_controller(manager, reconciler, options))
    if options.webhook is not None:  # issue 28: every replica converts; the leader migrates storage
        serve_versions(manager, client, options.versions, options.webhook, events=reconciler.events,
                       rate=options.storage_migration_rate)  # fmt: skip
    manager.add_runnable("postgres-background", reconciler.own_background)
    if isinstance(reconciler.instances, BackupClient):  # a test's stand-in without the backup endpoints: none
        manager.add(_backup_controller(manager, client, reconciler, options))
    if options.poolers:
        manager.add(_pooler_controller(manager, client, reconciler, options))
    return manager


def operator_crds(webhook: WebhookOptions | None = None, versions: Conversions = SERVED) -> list[Obj]:
    """The CRDs this operator serves: without a webhook v1alpha1 alone, as deploy/crds/ holds them; with one,
    every version of ``versions`` converted by it."""
    if webhook is not None:  # the PostgresPooler's too, since it is served in v1beta1 as well
        return versioned_crds(versions, webhook)
    return [crd_for(*kind_versions) for kind_versions in CUSTOM_RESOURCES]


class _CrdUpgradingManager(Manager):
    """A Manager that first brings the operator's CRDs up to its version: no informer, controller or webhook of
    this operator runs against an older schema, and none runs against a newer operator's different one."""

    crds: list[Obj]
    single_version: bool = False
    """The CRDs serve v1alpha1 alone (no webhook): refused while the API server lists another stored version."""

    async def run(self, *, handle_signals: bool = True) -> None:
        try:
            if self.single_version:
                check_single_version(await _installed(self.client, self.crds))
            done = await upgrade_crds(self.client, self.crds, operator_version=__version__)
        except Exception as exc:
            log.error("operator does not start: its CRDs", error=str(exc), operator_version=__version__)
            raise
        for crd in done:
            log.info("crd", name=crd.name, action=crd.action, was=crd.installed_version, now=__version__)
        await super().run(handle_signals=handle_signals)


async def _installed(client: Client, crds: list[Obj]) -> list[Obj]:
    """``crds`` as the API server has them now; absent ones left out (``upgrade_crds`` reports other errors)."""
    found = []
    for crd in crds:
        try:
            found.append(await client.get(CRD, crd["metadata"]["name"]))
        except ApiError as exc:
            if exc.status != 404:
                raise
    return found


def _cluster_controller(manager: Manager, reconciler: PostgresClusterReconciler, options: OperatorOptions
                        ) -> Controller:  # fmt: skip
    """The PostgresCluster controller: woken by its children, the pods and claims labelled with its name, the
    cluster-wide kinds it reads and its PostgresBackups."""
    controller = Controller(
        "postgrescluster",
        reconciler,
        for_kind=POSTGRES_CLUSTER,
        options=ControllerOptions(max_concurrent_reconciles=options.max_concurrent_reconciles, log_name_key="cluster"),
    )
    for kind in OWNED:
        controller.owns(kind)
    for kind in LABELLED:
        controller.watches(kind, _by_cluster_label)
    for kind in CLUSTER_WIDE:
        controller.watches(kind, _every_cluster(manager.cache))
    controller.watches(POSTGRES_BACKUP, _backup_cluster)
    return controller


def _backup_controller(manager: Manager, client: Client, reconciler: PostgresClusterReconciler,
                       options: OperatorOptions) -> Controller:  # fmt: skip
    """The PostgresBackup controller, sharing the cluster reconciler's instance client, Events, settings and
    metrics."""
    assert isinstance(reconciler.instances, BackupClient)
    backups = PostgresBackupReconciler(
        manager.cache, client, instances=reconciler.instances, events=reconciler.events,
        settings=lambda: reconciler.backup, metrics=reconciler.metrics,
    )  # fmt: skip
    backup_controller = Controller(
        "postgresbackup",
        backups,
        for_kind=POSTGRES_BACKUP,
        options=ControllerOptions(max_concurrent_reconciles=options.max_concurrent_reconciles, log_name_key="backup"),
    )
    backup_controller.watches(POSTGRES_CLUSTER, _backups_of(manager.cache))
    backup_controller.watches(POSTGRES_BACKUP, _backups_of(manager.cache))
    return backup_controller


def _pooler_controller(manager: Manager, client: Client, reconciler: PostgresClusterReconciler,
                       options: OperatorOptions) -> Controller:  # fmt: skip
    """The PostgresPooler controller (docs/pooler.md), sharing the cluster reconciler's instance client (which asks
    the primary for the pooler's lookup role) and Events."""
    assert isinstance(reconciler.instances, PoolerRoleClient), "the instance client has no pooler action"
    poolers = PostgresPoolerReconciler(manager.cache, client, instances=reconciler.instances, events=reconciler.events)
    return pooler_controller(manager.cache, poolers, max_concurrent_reconciles=options.max_concurrent_reconciles)
