"""The PostgreSQL operator inside a test: its Manager on a client of its own, whose requests and reconciles are
counted (for "a converged cluster costs zero writes"); and the CRD it serves."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from datetime import datetime

from prometheus_client import CollectorRegistry

from kanri.local.controlplane import Endpoint
from kanri.postgres.api.v1alpha1 import PostgresBackup, PostgresCluster
from kanri.postgres.api.v1alpha1.backup import S3Repository
from kanri.postgres.api.v1alpha1.postgres_pooler import PostgresPooler
from kanri.postgres.backup.archiving import utc_now
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.operator import OperatorOptions, build_manager
from kanri.postgres.tls.rotation import TlsSettings
from kanri.runtime import Client, ClientMetrics, Conversions, Manager, WebhookOptions, crd_for, get_condition
from kanri.runtime._crd_upgrade import DIGEST_ANNOTATION, VERSION_ANNOTATION
from kanri.runtime.kinds import CRD
from tests.support import eventually


async def install_postgres_crd(client: Client) -> None:
    """Apply the PostgresCluster, PostgresBackup and PostgresPooler CRDs and wait until the API server serves them."""
    for resource in (PostgresCluster, PostgresBackup, PostgresPooler):
        await client.apply(CRD, crd_for(resource), field_manager="kanri-tests")

    async def established() -> bool:
        for resource in (PostgresCluster, PostgresBackup, PostgresPooler):
            crd = await client.get(CRD, resource.resource.crd_name)
            found = get_condition((crd.get("status") or {}).get("conditions"), "Established")
            if found is None or found["status"] != "True":
                return False
        return True

    await eventually(established, timeout=30)


WRITES = ("POST", "PUT", "PATCH", "DELETE")


@dataclasses.dataclass(frozen=True)
class VersionedRelease:
    """An operator release that serves ``versions`` through a conversion webhook on this machine (``webhook``: a
    URL the API server reaches) and brings its CRDs up to them (``OperatorOptions.upgrade_crds``)."""

    webhook: WebhookOptions
    versions: Conversions


class Operator:
    """The operator's Manager on its own client, whose requests are counted."""

    def __init__(
        self,
        control_plane: Endpoint,
        namespace: str,
        *,
        instances: HttpInstanceClient | None = None,
        default_backup_repository: S3Repository | None = None,
        backup_now: Callable[[], datetime] | None = None,
        also_watch: tuple[str, ...] = (),
        allowed_backup_endpoints: tuple[str, ...] = (),
        allowed_priority_classes: tuple[str, ...] = (),
        versions: VersionedRelease | None = None,
        poolers: bool = False,
        finalizer_timeout: float | None = None,
        tls: TlsSettings | None = None,
    ) -> None:
        self.tls = tls
        """The CA's lifetime and the pace of its rotation (None: the operator's defaults)."""
        self.finalizer_timeout = finalizer_timeout
        """The deleted cluster's wait for its backups' deletion (None: the operator's default)."""
        self.poolers = poolers
        """Run the PostgresPooler controller too (its CRD comes with install_postgres_crd)."""
        self.versions = versions
        """The release's API versions served through a conversion webhook (issue 28); None: v1alpha1 alone."""
        self.allowed_priority_classes = allowed_priority_classes
        """``kanri run --allowed-priority-class`` (empty: any class the API accepts)."""
        self.backup_now = backup_now
        self.also_watch = also_watch
        """Further namespaces the operator watches (a second tenant's)."""
        self.allowed_backup_endpoints = allowed_backup_endpoints
        """``kanri run --allowed-backup-endpoint`` (empty: any endpoint)."""
        self.control_plane = control_plane
        self.namespace = namespace
        self.instances = instances
        self.default_backup_repository = default_backup_repository
        self.registry = CollectorRegistry()
        self.client_registry = CollectorRegistry()

    @contextlib.asynccontextmanager
    async def running(self, refresh: float = 1.0) -> AsyncIterator[Manager]:
        kubeconfig = str(self.control_plane.kubeconfig)
        self.registry, self.client_registry = CollectorRegistry(), CollectorRegistry()  # fresh counts per run
        async with await Client.from_kubeconfig(kubeconfig, metrics=ClientMetrics(self.client_registry)) as own:
            self.host = own.host.split("://", 1)[-1]
            options = OperatorOptions(namespace=self.namespace, leader_election=False, health_port=None,
                                      refresh=refresh, leader_election_namespace=self.namespace,
                                      default_backup_repository=self.default_backup_repository,
                                      backup_now=self.backup_now or utc_now, namespaces=self.also_watch,
                                      allowed_backup_endpoints=self.allowed_backup_endpoints,
                                      allowed_priority_classes=self.allowed_priority_classes,
                                      poolers=self.poolers)  # fmt: skip
            if self.tls is not None:
                options = dataclasses.replace(options, tls=self.tls)
            if self.finalizer_timeout is not None:
                options = dataclasses.replace(options, finalizer_timeout=self.finalizer_timeout)
            if self.versions is not None:
                options = dataclasses.replace(options, webhook=self.versions.webhook, versions=self.versions.versions,
                                              upgrade_crds=True)  # fmt: skip
            manager = build_manager(own, options, instances=self.instances, registry=self.registry)
            task = asyncio.create_task(manager.run(handle_signals=False))
            try:
                yield manager
            finally:
                manager.stop()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(task, 20)
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()  # type: ignore[misc]

    def writes(self) -> float:
        total = 0.0
        for metric in self.client_registry.collect():
            for sample in metric.samples:
                if sample.name == "rest_client_requests_total" and sample.labels["method"] in WRITES:
                    total += sample.value
        return total

    def reconciles(self) -> float:
        total = 0.0
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name == "controller_runtime_reconcile_total":
                    total += sample.value
        return total

    def errors(self) -> float:
        return self.registry.get_sample_value("controller_runtime_reconcile_errors_total",
                                              {"controller": "postgrescluster"}) or 0.0  # fmt: skip


async def put_back_single_version_crds(client: Client) -> None:
    """The PostgresCluster, PostgresBackup and PostgresPooler CRDs as the other modules of the session install them:
    v1alpha1 alone, no conversion webhook in the way, no operator version stamp. The stored objects must be in
    v1alpha1 already."""
    for model in (PostgresCluster, PostgresBackup, PostgresPooler):
        crd = await client.get(CRD, model.resource.crd_name)
        crd["spec"] = crd_for(model)["spec"]
        annotations = crd["metadata"].get("annotations") or {}
        for stamp in (VERSION_ANNOTATION, DIGEST_ANNOTATION):
            annotations.pop(stamp, None)
        await client.replace(CRD, crd)
