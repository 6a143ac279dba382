"""The instance exporter's pure parts: what the manager contributes, the volume, rendering a snapshot, the port."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest
import structlog
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kanri.instance.exporter import (
    METRICS,
    ManagerState,
    Snapshot,
    SnapshotCollector,
    described,
    manager_samples,
    metrics_port,
    read_volume,
)


def render(snapshot: Snapshot) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    registry = CollectorRegistry(auto_describe=False)
    collector = SnapshotCollector(("shop", "orders", "orders-1"))
    collector.snapshot = snapshot
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_snapshot_renders_with_the_instances_labels_and_counters_get_total() -> None:
    series = render(Snapshot({"kanri_instance_up": [((), 1.0)], "kanri_instance_xact_commit": [(("orders",), 7.0)],
                              "kanri_instance_replication_lag_seconds": [(("orders-2",), 0.5)]}))  # fmt: skip
    base = (("cluster", "orders"), ("instance", "orders-1"), ("namespace", "shop"))
    assert series == {
        ("kanri_instance_up", base): 1.0,
        ("kanri_instance_xact_commit_total", tuple(sorted((*base, ("database", "orders"))))): 7.0,
        ("kanri_instance_replication_lag_seconds", tuple(sorted((*base, ("standby", "orders-2"))))): 0.5,
    }


def test_a_metric_without_samples_is_left_out_not_rendered_as_zero() -> None:
    assert render(Snapshot({})) == {}


def test_the_manager_part_says_fenced_paused_running_and_contact_only_when_known() -> None:
    fenced = manager_samples(ManagerState(running=False, fenced=True, paused=False))
    assert fenced == {"kanri_instance_postgres_running": [((), 0.0)], "kanri_instance_fenced": [((), 1.0)],
                      "kanri_instance_replication_paused": [((), 0.0)],
                      "kanri_instance_disk_full": [((), 0.0)]}  # fmt: skip  # kanri:disk-full
    assert manager_samples(ManagerState(False, False, False, disk_full=True))["kanri_instance_disk_full"] == [((), 1.0)]
    watched = manager_samples(ManagerState(running=True, fenced=False, paused=True, last_contact=1700000000.0))
    assert watched["kanri_instance_isolation_last_contact_timestamp_seconds"] == [((), 1700000000.0)]
    assert watched["kanri_instance_replication_paused"] == [((), 1.0)]


def test_the_volume_is_statvfs_of_pgdata_and_a_missing_one_is_left_out(tmp_path: Path) -> None:
    stat = os.statvfs(tmp_path)
    values = read_volume(tmp_path)
    assert values["kanri_instance_volume_size_bytes"] == [((), float(stat.f_blocks * stat.f_frsize))]
    assert 0 < values["kanri_instance_volume_free_bytes"][0][1] <= values["kanri_instance_volume_size_bytes"][0][1]
    assert read_volume(tmp_path / "not-yet") == {}


def test_metrics_port_defaults_to_9187_and_refuses_what_is_not_a_port() -> None:
    assert metrics_port({}) == 9187
    assert metrics_port({"KANRI_METRICS_PORT": "0"}) == 0
    assert metrics_port({"KANRI_METRICS_PORT": "9999"}) == 9999
    for bad in ("x", "-1", "65536"):
        with pytest.raises(ValueError, match="KANRI_METRICS_PORT"):
            metrics_port({"KANRI_METRICS_PORT": bad})


def test_described_lists_every_metric_as_scraped() -> None:
    names = {name for name, _, _ in described()}
    assert len(names) == len(METRICS)
    assert {"kanri_instance_up", "kanri_instance_archived_total", "kanri_instance_checkpoints_timed_total"} <= names
    assert all(labels[:3] == ("namespace", "cluster", "instance") for _, _, labels in described())


def test_a_bad_metrics_port_is_an_invalid_setting_logged_as_one_json_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from kanri.instance.__main__ import main

    for key, value in {"POD_NAME": "orders-1", "KANRI_CLUSTER": "orders", "KANRI_METRICS_PORT": "metrics"}.items():
        monkeypatch.setenv(key, value)
    handlers = list(logging.getLogger().handlers)
    try:
        assert main([]) == 2
    finally:  # main configured logging onto pytest's captured stdout: leave nothing pointing at it
        structlog.reset_defaults()
        logging.getLogger().handlers[:] = handlers
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["event"] == "invalid settings"
    assert line["level"] == "error"
    assert "KANRI_METRICS_PORT" in line["reason"]
