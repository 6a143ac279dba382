"""What this release of the PostgreSQL operator serves (kanri.postgres.api.served, kanri.postgres.versions): both
versions with v1alpha1 still the storage version, converted exactly as the target shape converts them, and the
operator's wiring of its conversion webhook and storage migration."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings

from kanri.postgres.api.conversion import POSTGRES, POSTGRES_BACKUPS, POSTGRES_CLUSTERS, POSTGRES_POOLERS
from kanri.postgres.api.served import (
    SERVED,
    SERVED_BACKUPS,
    SERVED_CLUSTERS,
    SERVED_POOLERS,
    STORAGE_VERSION,
    served_crds,
)
from kanri.postgres.operator import (
    CONVERSION,
    OperatorOptions,
    _CrdUpgradingManager,
    build_manager,
    operator_crds,
    permissions,
)
from kanri.postgres.versions import WEBHOOK_SERVICE_ENV, serve_versions, webhook_from_environment
from kanri.runtime import Client, EventRecorder, Manager, ManagerOptions, WebhookOptions, crd_for
from kanri.runtime._connection import Connection
from tests.unit.test_postgres_v1beta1 import (
    V1ALPHA1,
    V1BETA1,
    canonical_quantities,
    v1alpha1_clusters,
    v1beta1_clusters,
)

WEBHOOK = WebhookOptions(namespace="kanri-system", secret="kanri-operator-webhook", service="kanri-operator-webhook")


def _versions(crd: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {version["name"]: version for version in crd["spec"]["versions"]}


def test_this_release_stores_v1alpha1_and_serves_v1beta1_through_the_webhook() -> None:
    assert STORAGE_VERSION == "v1alpha1"
    for crd in served_crds(WEBHOOK.client_config()):
        versions = _versions(crd)
        assert (versions["v1alpha1"]["storage"], versions["v1beta1"]["storage"]) == (True, False)
        assert [versions["v1alpha1"]["served"], versions["v1beta1"]["served"]] == [True, True]
        assert versions["v1alpha1"]["deprecated"] is True  # announced with the first release serving v1beta1
        service = crd["spec"]["conversion"]["webhook"]["clientConfig"]["service"]
        assert service == {"name": "kanri-operator-webhook", "namespace": "kanri-system", "path": "/convert",
                           "port": 9443}  # fmt: skip
        assert "caBundle" not in crd["spec"]["conversion"]["webhook"]["clientConfig"]


@pytest.mark.parametrize(
    ("served", "target"),
    [(SERVED_CLUSTERS, POSTGRES_CLUSTERS), (SERVED_BACKUPS, POSTGRES_BACKUPS), (SERVED_POOLERS, POSTGRES_POOLERS)],
)
def test_each_version_is_served_as_the_target_shape_serves_it_but_for_the_storage_flag(
    served: Any, target: Any
) -> None:
    now, then = _versions(crd_for(*served.resources)), _versions(crd_for(*target.resources))
    assert now.keys() == then.keys() == {"v1alpha1", "v1beta1"}
    for name in now:
        assert {**now[name], "storage": None} == {**then[name], "storage": None}
    # The next release flips only the flag: storage moves to v1beta1 and the migration runs.
    assert (then["v1beta1"]["storage"], then["v1alpha1"]["storage"]) == (True, False)


@settings(max_examples=60, deadline=None)
@given(v1alpha1_clusters())
def test_a_v1alpha1_cluster_converts_as_the_target_shape_converts_it(cluster: dict[str, Any]) -> None:
    new = SERVED.convert(cluster, V1BETA1)
    assert new == POSTGRES.convert(cluster, V1BETA1)
    assert SERVED.convert(new, V1ALPHA1) == cluster


@settings(max_examples=60, deadline=None)
@given(v1beta1_clusters(canonical_quantities))
def test_a_v1beta1_cluster_converts_as_the_target_shape_converts_it(cluster: dict[str, Any]) -> None:
    old = SERVED.convert(cluster, V1ALPHA1)
    assert old == POSTGRES.convert(cluster, V1ALPHA1)
    assert SERVED.convert(old, V1BETA1) == cluster


def test_the_webhook_is_configured_from_the_pod_environment() -> None:
    assert webhook_from_environment({}) is None
    assert webhook_from_environment({WEBHOOK_SERVICE_ENV: "kanri-operator-webhook"}) is None  # no namespace
    found = webhook_from_environment({WEBHOOK_SERVICE_ENV: "kanri-operator-webhook", "POD_NAMESPACE": "kanri-system"})
    assert found == WEBHOOK


def test_without_a_webhook_the_operator_keeps_its_single_version_crds() -> None:
    assert [len(crd["spec"]["versions"]) for crd in operator_crds()] == [1, 1, 1]  # the pooler's too
    assert all("conversion" not in crd["spec"] for crd in operator_crds())
    # with the webhook, every kind in both versions: the PostgresPooler's CRD too (docs/pooler.md)
    assert operator_crds(WEBHOOK) == served_crds(WEBHOOK.client_config())
    assert [crd["metadata"]["name"] for crd in operator_crds(WEBHOOK)] == [
        "postgresclusters.kanri.dev", "postgresbackups.kanri.dev", "postgrespoolers.kanri.dev"]  # fmt: skip
    assert all(_versions(crd)["v1beta1"]["storage"] is True for crd in operator_crds(WEBHOOK, POSTGRES))


def test_conversion_rights_stay_out_of_the_default_grants() -> None:
    granted = permissions()
    crd_rights = {verbs for (kind, sub), verbs in granted.items() if kind.kind == "CustomResourceDefinition"}
    assert all("patch" not in verbs for verbs in crd_rights)
    assert any(p.subresource == "status" and p.kind.kind == "CustomResourceDefinition" for p in CONVERSION)


async def test_serving_adds_the_webhook_to_every_replica_and_a_migration_per_crd_to_the_leader() -> None:
    async with Client(Connection("http://127.0.0.1:1")) as client:
        manager = Manager(client, ManagerOptions(name="t", health_port=None))
        serving = serve_versions(manager, client, SERVED, WEBHOOK, events=EventRecorder(client, component="t"), rate=5)
        assert [m.crd_name for m in serving.migrations] == [
            "postgresclusters.kanri.dev", "postgresbackups.kanri.dev", "postgrespoolers.kanri.dev"]  # fmt: skip
        assert all(m.rate == 5 and m.ready == serving.webhook.ready for m in serving.migrations)
        assert not serving.webhook.ready()
        assert not manager.ready()  # /readyz waits for conversion


async def test_the_operator_with_a_webhook_brings_the_two_version_crds_and_is_unready_until_it_converts() -> None:
    async with Client(Connection("http://127.0.0.1:1")) as client:
        options = OperatorOptions(webhook=WEBHOOK, upgrade_crds=True, health_port=None, leader_election=False)
        manager = build_manager(client, options)
        assert isinstance(manager, _CrdUpgradingManager)
        assert manager.crds == served_crds(WEBHOOK.client_config())
        assert not manager.ready()
        plain = build_manager(client, OperatorOptions(upgrade_crds=True, health_port=None, webhook=None))
        assert isinstance(plain, _CrdUpgradingManager)
        assert [len(crd["spec"]["versions"]) for crd in plain.crds] == [1, 1, 1]
