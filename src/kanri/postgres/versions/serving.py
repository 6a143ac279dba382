"""The operator's side of API versions: its conversion webhook, the CRDs naming it, and the storage migration.

Every replica serves the webhook (``Manager.add_server``: the API server calls whichever replica the Service
picks, leader or not) and is unready until a conversion went through; the leader alone runs one storage migration
per CRD (``Manager.add_runnable``), which waits for the webhook, does nothing while ``storedVersions`` already is the
storage version alone, and otherwise rewrites every object at ``rate`` writes a second and prunes it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kanri.runtime import (
    Client,
    Conversions,
    ConversionWebhook,
    EventRecorder,
    Manager,
    StorageMigration,
    StorageMigrationMetrics,
    WebhookOptions,
    crd_for,
)

__all__ = ["WEBHOOK_SERVICE_ENV", "VersionServing", "serve_versions", "versioned_crds", "webhook_from_environment"]

WEBHOOK_SERVICE_ENV = "KANRI_WEBHOOK_SERVICE"
"""The Service in front of every operator replica's port 9443 (the chart sets it): the operator then serves
conversion, and its certificates live in a Secret of the same name in its own namespace (``POD_NAMESPACE``)."""
Obj = dict[str, Any]


def webhook_from_environment(environ: Mapping[str, str] | None = None) -> WebhookOptions | None:
    """The webhook's options from ``KANRI_WEBHOOK_SERVICE`` and ``POD_NAMESPACE``; None when either is unset."""
    env = os.environ if environ is None else environ
    service, namespace = env.get(WEBHOOK_SERVICE_ENV), env.get("POD_NAMESPACE")
    if not service or not namespace:
        return None
    return WebhookOptions(namespace=namespace, secret=service, service=service)


def versioned_crds(versions: Conversions, webhook: WebhookOptions) -> list[Obj]:
    """One CRD per kind of ``versions``, every version served and converted by ``webhook`` (no ``caBundle``: the
    webhook writes it, and ``upgrade_crds`` keeps the one it finds)."""
    return [crd_for(*conversion.resources, webhook=webhook.client_config()) for conversion in versions]


@dataclass(frozen=True)
class VersionServing:
    """What ``serve_versions`` added to a manager: the webhook and one migration per CRD."""

    webhook: ConversionWebhook
    migrations: tuple[StorageMigration, ...]


def serve_versions(
    manager: Manager,
    client: Client,
    versions: Conversions,
    webhook: WebhookOptions,
    *,
    events: EventRecorder,
    rate: float = 20.0,
) -> VersionServing:
    """Add the conversion webhook for ``versions`` (every replica; /readyz waits for it) and a storage migration
    for each of their CRDs (leader only, once conversion works) to ``manager``."""
    server = ConversionWebhook(client, versions, webhook, registry=manager.registry)
    manager.add_server("conversion", server.run, ready=server.ready)
    metrics = StorageMigrationMetrics(manager.registry)
    migrations = []
    for conversion in versions:
        crd = conversion.hub.resource.crd_name
        migration = StorageMigration(client, crd, metrics=metrics, events=events, rate=rate, ready=server.ready)
        manager.add_runnable(f"storage-migration/{crd}", migration.run)
        migrations.append(migration)
    return VersionServing(server, tuple(migrations))
