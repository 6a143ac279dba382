"""``kanri run``: run the PostgreSQL operator (it installs nothing: apply the CRDs and RBAC from deploy/ first)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import typer
from prometheus_client import CollectorRegistry
from rich.console import Console

from kanri.cli import _run_options as opts
from kanri.postgres.backup.archiving import DefaultRepository, load_repository, utc_now
from kanri.postgres.children.images import ENV as POSTGRES_IMAGES_ENV
from kanri.postgres.children.images import PostgresImages
from kanri.postgres.cluster.instances import HttpInstanceClient
from kanri.postgres.ha.position import NODE_GRACE
from kanri.postgres.operator import OperatorOptions, build_manager
from kanri.runtime import Client, ClientMetrics, CrdDowngradeRefused, configure_logging

err = Console(stderr=True, soft_wrap=True)
_SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def own_namespace() -> str:
    """The namespace the operator runs in: ``POD_NAMESPACE``, else the service account's, else ``default``."""
    if namespace := os.environ.get("POD_NAMESPACE"):
        return namespace
    try:
        return _SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def run(
    kubeconfig: opts.Kubeconfig = None,
    namespace: opts.Namespaces = None,
    health_port: opts.HealthPort = 8081,
    health_host: opts.HealthHost = "127.0.0.1",
    metrics_auth: opts.MetricsAuth = True,
    leader_election: opts.LeaderElection = True,
    leader_election_namespace: opts.LeaderElectionNamespace = None,
    log_level: opts.LogLevel = "info",
    default_backup_repository: opts.DefaultBackupRepository = None,
    allowed_backup_endpoint: opts.AllowedBackupEndpoints = None,
    allowed_priority_class: opts.AllowedPriorityClasses = None,
    backup_clock_offset_file: opts.BackupClockOffsetFile = None,
    node_monitor_grace: opts.NodeMonitorGrace = NODE_GRACE,
) -> None:
    """Run the PostgreSQL operator until SIGTERM or SIGINT."""
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise typer.BadParameter(f"unknown log level {log_level!r}", param_hint="--log-level")
    configure_logging(log_level)
    default = default_repository(default_backup_repository)
    # Outside a pod (a laptop) this is "default": no operator pod runs there, so where NetworkPolicy is enforced the
    # clusters' policies admit nothing to the instance API (networkpolicy.py); set POD_NAMESPACE to choose.
    home = own_namespace()
    options = OperatorOptions(
        postgres_images=postgres_images(),
        default_backup_repository=default,
        namespaces=tuple(namespace or ()),
        leader_election=leader_election,
        leader_election_namespace=leader_election_namespace or home,
        operator_namespace=home,
        health_port=health_port,
        manager={"health_host": health_host, "metrics_auth": metrics_auth},
        backup_now=offset_clock(backup_clock_offset_file) if backup_clock_offset_file else utc_now,
        allowed_backup_endpoints=tuple(e.strip() for e in allowed_backup_endpoint or () if e.strip()),
        allowed_priority_classes=tuple(c.strip() for c in allowed_priority_class or () if c.strip()),
        node_monitor_grace=node_monitor_grace,
        poolers=True,
    )
    try:
        asyncio.run(_run(str(kubeconfig) if kubeconfig else None, options))
    except CrdDowngradeRefused as exc:
        # An older operator started against CRDs a newer one wrote: one line that says which, no traceback.
        err.print(f"[red]{exc}[/red]")
        raise typer.Exit(1) from None


def default_repository(path: Path | None) -> DefaultRepository | None:
    """``--default-backup-repository``'s file, read; an unreadable or invalid one is a bad parameter."""
    try:
        return load_repository(path) if path else None
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--default-backup-repository") from None


def postgres_images() -> PostgresImages:
    """The PostgreSQL images from the environment the chart sets; a malformed value (a hand-edited Deployment) exits
    with a one-line reason instead of a traceback."""
    try:
        return PostgresImages.from_environment()
    except ValueError as exc:
        typer.echo(f"error: {POSTGRES_IMAGES_ENV}: {exc}", err=True)
        raise typer.Exit(2) from None


def offset_clock(path: Path) -> Callable[[], datetime]:
    """The test hook's clock: now plus the seconds in ``path`` (so an e2e can age backups of a running operator
    without skewing the clock of the object store's requests)."""

    def now() -> datetime:
        try:
            offset = float(path.read_text().strip() or 0)
        except (OSError, ValueError):
            offset = 0.0
        return datetime.now(UTC) + timedelta(seconds=offset)

    return now


async def _run(kubeconfig: str | None, options: OperatorOptions) -> None:
    instances = HttpInstanceClient()
    # One registry for the Manager's and the client's metrics, so /metrics shows API requests by method and code.
    registry = CollectorRegistry()
    try:
        async with await Client.auto(kubeconfig, metrics=ClientMetrics(registry)) as client:
            await build_manager(client, options, instances=instances, registry=registry).run()
    finally:
        await instances.close()
