"""kanri.postgres.metrics: the series one pass of :meth:`PostgresMetrics.observe` leaves in a real registry, read back
as a scrape would (``get_sample_value``)."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from kanri.postgres.metrics import PostgresMetrics

LABELS = {"namespace": "shop", "cluster": "orders"}
CREATED = "2026-11-20T08:30:00Z"
ENABLED = "kanri_postgres_restore_test_enabled"
CREATION = "kanri_postgres_cluster_creation_timestamp_seconds"
LAST_RECONCILE = "kanri_postgres_cluster_last_reconcile_timestamp_seconds"


def cluster(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"namespace": "shop", "name": "orders", "creationTimestamp": CREATED}, "spec": spec}


def observed(spec: dict[str, Any]) -> tuple[CollectorRegistry, PostgresMetrics]:
    registry = CollectorRegistry()
    metrics = PostgresMetrics(registry)
    metrics.observe(cluster(spec), {})
    return registry, metrics


def test_creation_time_is_the_clusters_creation_timestamp() -> None:
    registry, _ = observed({"replicas": 1})
    assert registry.get_sample_value(CREATION, LABELS) == datetime(2026, 11, 20, 8, 30, tzinfo=UTC).timestamp()


def test_each_pass_records_when_it_ran() -> None:
    before = time.time()
    registry, metrics = observed({"replicas": 1})
    first = registry.get_sample_value(LAST_RECONCILE, LABELS)
    assert first is not None
    assert before <= first <= time.time()
    time.sleep(0.01)
    metrics.observe(cluster({"replicas": 1}), {})
    later = registry.get_sample_value(LAST_RECONCILE, LABELS)
    assert later is not None
    assert later > first
    metrics.forget("shop", "orders")
    assert registry.get_sample_value(LAST_RECONCILE, LABELS) is None


def test_rehearsals_count_as_enabled_by_default_once_the_cluster_has_backups() -> None:
    assert observed({"backup": {}})[0].get_sample_value(ENABLED, LABELS) == 1.0
    assert observed({"backup": {"restoreTest": {"schedule": "0 5 * * 1"}}})[0].get_sample_value(ENABLED, LABELS) == 1.0


def test_rehearsals_turned_off_read_zero() -> None:
    registry, _ = observed({"backup": {"restoreTest": {"enabled": False}}})
    assert registry.get_sample_value(ENABLED, LABELS) == 0.0


def test_no_rehearsal_series_without_backups() -> None:
    assert observed({"replicas": 1})[0].get_sample_value(ENABLED, LABELS) is None
    assert observed({"backup": None})[0].get_sample_value(ENABLED, LABELS) is None


def test_removing_backups_drops_the_series_and_forget_drops_all() -> None:
    registry, metrics = observed({"backup": {}})
    metrics.observe(cluster({"replicas": 1}), {})
    assert registry.get_sample_value(ENABLED, LABELS) is None
    assert registry.get_sample_value(CREATION, LABELS) is not None
    metrics.forget("shop", "orders")
    assert registry.get_sample_value(CREATION, LABELS) is None


def test_the_upgrade_series_follow_status_upgrade() -> None:
    registry = CollectorRegistry()
    metrics = PostgresMetrics(registry)
    base = cluster({"replicas": 3})
    metrics.observe(base, {})
    assert registry.get_sample_value("kanri_postgres_upgrade_failed", LABELS) is None  # never asked for
    metrics.observe({**base, "status": {"upgrade": {"phase": "Checking", "from": 14, "to": 15}}}, {})
    assert registry.get_sample_value("kanri_postgres_upgrade_failed", LABELS) == 0
    metrics.observe({**base, "status": {"upgrade": {"phase": "Failed", "from": 14, "to": 15}}}, {})
    assert registry.get_sample_value("kanri_postgres_upgrade_failed", LABELS) == 1
    assert registry.get_sample_value("kanri_postgres_upgrade_downtime_seconds", LABELS) is None
    done = {"phase": "Succeeded", "from": 14, "to": 15, "downtimeSeconds": 13.9}
    metrics.observe({**base, "status": {"upgrade": done}}, {})
    assert registry.get_sample_value("kanri_postgres_upgrade_failed", LABELS) == 0
    assert registry.get_sample_value("kanri_postgres_upgrade_downtime_seconds", LABELS) == 13.9
