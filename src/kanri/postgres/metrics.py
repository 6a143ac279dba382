"""Prometheus metrics of the PostgreSQL operator, per cluster and instance, next to the runtime's reconcile, queue
and client metrics on the same ``/metrics``.

Values that move all the time (WAL positions, exact lag) live here and not in ``status``: a converged cluster must
not rewrite its status every time PostgreSQL writes a byte. Labels are ``namespace``, ``cluster`` and, per
instance, ``instance``; a deleted cluster's series are removed. Alert examples: ``docs/postgres-operator.md``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

from kanri.postgres.cluster.instances import InstanceReport
from kanri.runtime import parse_time

__all__ = ["PostgresMetrics", "lsn_bytes"]

Obj = dict[str, Any]
_CONDITIONS = ("Ready", "Progressing", "Degraded")


def lsn_bytes(lsn: str | None) -> int | None:
    """A PostgreSQL LSN (``16/B374D848``) as a byte position."""
    if not lsn or "/" not in lsn:
        return None
    high, low = lsn.split("/", 1)
    try:
        return (int(high, 16) << 32) + int(low, 16)
    except ValueError:
        return None


def _timestamp(raw: Any) -> float:
    """An RFC 3339 time as written by the API server (``2026-12-02T04:00:00Z``) as Unix time."""
    return parse_time(str(raw)).timestamp()


class PostgresMetrics:
    """The operator's gauges; :meth:`observe` after each pass, :meth:`forget` when a cluster is gone."""

    def __init__(self, registry: CollectorRegistry) -> None:
        cluster = ["namespace", "cluster"]
        self._cluster_gauges(registry, cluster)
        self._instance_gauges(registry, [*cluster, "instance"])
        self._failover_metrics(registry, cluster)
        self._certificate_and_backup_metrics(registry, cluster)
        self._backed_up: dict[tuple[str, str], set[Gauge]] = {}  # clusters with base backup series
        self._restore_tested: set[tuple[str, str]] = set()  # clusters with restore rehearsal series
        self._tls: set[tuple[str, str]] = set()  # clusters with a certificate expiry series
        self._series: dict[tuple[str, str], set[tuple[Gauge, tuple[str, ...]]]] = {}

    def _cluster_gauges(self, registry: CollectorRegistry, cluster: list[str]) -> None:
        self.desired = Gauge("kanri_postgres_cluster_instances", "Instances the spec asks for.", cluster,
                             registry=registry)  # fmt: skip
        self.ready = Gauge("kanri_postgres_cluster_ready_instances", "Instances that are ready.", cluster,
                           registry=registry)  # fmt: skip
        self.condition = Gauge("kanri_postgres_cluster_condition",
                               "1 when the condition of this type is True, else 0.", [*cluster, "type"],
                               registry=registry)  # fmt: skip
        self.generation_lag = Gauge("kanri_postgres_cluster_generation_unobserved",
                                    "metadata.generation minus status.observedGeneration (spec changes not yet "
                                    "acted on).", cluster, registry=registry)  # fmt: skip
        self.last_reconcile = Gauge("kanri_postgres_cluster_last_reconcile_timestamp_seconds", "Unix time the "
                                    "operator last finished a pass over the cluster (observed its instances and "
                                    "computed its status).", cluster, registry=registry)  # fmt: skip
        self.created = Gauge("kanri_postgres_cluster_creation_timestamp_seconds", "Unix time the PostgresCluster "
                             "was created (metadata.creationTimestamp).", cluster, registry=registry)  # fmt: skip
        self.restore_test_enabled = Gauge("kanri_postgres_restore_test_enabled", "1 when scheduled restore "
                                          "rehearsals are on (spec.backup.restoreTest.enabled), 0 when turned off; "
                                          "absent without spec.backup.", cluster, registry=registry)  # fmt: skip
        self.upgrade_failed = Gauge("kanri_postgres_upgrade_failed", "1 when the last major upgrade asked for "
                                    "failed (status.upgrade.phase Failed: the cluster serves on the old major), 0 "
                                    "while one is recorded in any other phase; absent when none was asked for.",
                                    cluster, registry=registry)  # fmt: skip
        self.upgrade_downtime = Gauge("kanri_postgres_upgrade_downtime_seconds", "The downtime of the last "
                                      "major upgrade that succeeded (status.upgrade.downtimeSeconds).", cluster,
                                      registry=registry)  # fmt: skip
        self.deleting_since = Gauge("kanri_postgres_cluster_deletion_timestamp_seconds",
                                    "Unix time the cluster was asked to be deleted (present only while its "
                                    "finalizer holds it).", cluster, registry=registry)  # fmt: skip

    def _instance_gauges(self, registry: CollectorRegistry, instance: list[str]) -> None:
        self.instance_ready = Gauge("kanri_postgres_instance_ready", "1 when the instance reports ready.",
                                    [*instance, "role"], registry=registry)  # fmt: skip
        self.lag = Gauge("kanri_postgres_instance_replication_lag_bytes",
                         "WAL a replica has received but not replayed.", instance, registry=registry)  # fmt: skip
        self.position = Gauge("kanri_postgres_instance_wal_position_bytes",
                              "The primary's WAL write position, or a replica's receive position.", instance,
                              registry=registry)  # fmt: skip
        self.timeline = Gauge("kanri_postgres_instance_timeline", "The instance's timeline.", instance,
                              registry=registry)  # fmt: skip

    def _failover_metrics(self, registry: CollectorRegistry, cluster: list[str]) -> None:
        self.failovers = Counter("kanri_postgres_failovers", "Promotions carried out by this operator process "
                                 "(failovers and switchovers), by reason.", [*cluster, "reason"],
                                 registry=registry)  # fmt: skip
        self.failover_blocked = Gauge("kanri_postgres_failover_blocked", "1 while a failover waits for approval "
                                      "(FailoverBlocked=True).", cluster, registry=registry)  # fmt: skip
        self.last_gap = Gauge("kanri_postgres_last_failover_lsn_gap_bytes", "WAL the last failover's promoted replica "
                              "lacked compared with the old primary as last seen.", cluster,
                              registry=registry)  # fmt: skip
        self.last_loss = Gauge("kanri_postgres_last_failover_data_loss_possible", "1 when the last failover may have "
                               "lost acknowledged commits.", cluster, registry=registry)  # fmt: skip
        self.last_time = Gauge("kanri_postgres_last_failover_timestamp_seconds", "Unix time of the last promotion.",
                               cluster, registry=registry)  # fmt: skip
        self.last_duration = Gauge("kanri_postgres_last_failover_duration_seconds", "From the start of the last "
                                   "failover (detection window passed) to the promotion.", cluster,
                                   registry=registry)  # fmt: skip

    def _certificate_and_backup_metrics(self, registry: CollectorRegistry, cluster: list[str]) -> None:
        self.tls_expiry = Gauge("kanri_postgres_tls_certificate_expiry_timestamp_seconds", "Unix time the cluster's "
                                "server certificate expires.", cluster, registry=registry)  # fmt: skip
        self.restore_test_time = Gauge("kanri_postgres_last_restore_test_timestamp_seconds", "Unix time the last "
                                       "restore rehearsal finished.", cluster, registry=registry)  # fmt: skip
        self.restore_test_ok = Gauge("kanri_postgres_last_restore_test_succeeded", "1 when the last restore "
                                     "rehearsal passed every check, 0 when it failed.", cluster,
                                     registry=registry)  # fmt: skip
        self.backup_success = Gauge("kanri_postgres_backup_last_success_timestamp_seconds", "Unix time the newest "
                                    "completed base backup ended.", cluster, registry=registry)  # fmt: skip
        self.backup_failure = Gauge("kanri_postgres_backup_last_failure_timestamp_seconds", "Unix time the last "
                                    "failed base backup failed.", cluster, registry=registry)  # fmt: skip
        self.backup_succeeded = Gauge("kanri_postgres_backup_last_succeeded", "1 when the last base backup that "
                                      "finished completed, 0 when it failed (condition LastBackupSucceeded).",
                                      cluster, registry=registry)  # fmt: skip
        self.recoverability = Gauge("kanri_postgres_backup_first_recoverability_point_timestamp_seconds", "The "
                                    "earliest moment the cluster can be restored to (the end of the oldest "
                                    "completed backup kept).", cluster, registry=registry)  # fmt: skip
        self.backup_failures = Counter("kanri_postgres_backup_failures", "Base backups that failed, counted by "
                                       "this operator process.", cluster, registry=registry)  # fmt: skip

    def _set(self, key: tuple[str, str], gauge: Gauge, labels: tuple[str, ...], value: float) -> None:
        gauge.labels(*labels).set(value)
        self._series.setdefault(key, set()).add((gauge, labels))

    def observe(self, cluster: Obj, reports: Mapping[str, InstanceReport]) -> None:
        """Record what one pass saw of ``cluster`` (as written, with its status) and its instances."""
        meta, spec, status = cluster["metadata"], cluster.get("spec") or {}, cluster.get("status") or {}
        key = (meta["namespace"], meta["name"])
        old = self._series.pop(key, set())
        self._set(key, self.desired, key, float(spec.get("replicas", 0)))
        self._set(key, self.ready, key, float(status.get("readyReplicas", 0)))
        for condition in status.get("conditions") or []:
            if condition["type"] in _CONDITIONS:
                self._set(key, self.condition, (*key, condition["type"]), float(condition["status"] == "True"))
        if meta.get("creationTimestamp"):
            self._set(key, self.created, key, _timestamp(meta["creationTimestamp"]))
        backup = spec.get("backup")
        if isinstance(backup, Mapping):  # the rehearsal alerts stay quiet where they were turned off
            enabled = (backup.get("restoreTest") or {}).get("enabled", True)
            self._set(key, self.restore_test_enabled, key, float(enabled is not False))
        upgrade = status.get("upgrade") or {}
        if upgrade.get("phase"):
            self._set(key, self.upgrade_failed, key, float(upgrade["phase"] == "Failed"))
            if upgrade["phase"] == "Succeeded" and upgrade.get("downtimeSeconds") is not None:
                self._set(key, self.upgrade_downtime, key, float(upgrade["downtimeSeconds"]))
        unobserved = int(meta.get("generation", 0)) - int(status.get("observedGeneration", 0))
        self._set(key, self.generation_lag, key, float(max(unobserved, 0)))
        self._set(key, self.last_reconcile, key, time.time())
        self._set(key, self.failover_blocked, key, float((status.get("failover") or {}).get("phase") == "Blocked"))
        last = status.get("lastFailover") or {}
        if last.get("time"):
            self._set(key, self.last_time, key, _timestamp(last["time"]))
            self._set(key, self.last_loss, key, float(bool(last.get("dataLossPossible"))))
            if last.get("durationSeconds") is not None:
                self._set(key, self.last_duration, key, float(last["durationSeconds"]))
            if last.get("lsnGapBytes") is not None:
                self._set(key, self.last_gap, key, float(last["lsnGapBytes"]))
        for name, report in reports.items():
            labels: tuple[str, ...] = (*key, name)
            self._set(key, self.instance_ready, (*labels, report.role), float(report.ready))
            if report.timeline is not None:
                self._set(key, self.timeline, labels, float(report.timeline))
            position = lsn_bytes(report.write_lsn if report.role == "primary" else report.receive_lsn)
            if position is not None:
                self._set(key, self.position, labels, float(position))
            if report.role == "replica" and report.lag_bytes is not None:
                self._set(key, self.lag, labels, float(report.lag_bytes))
        for gauge, labels in old - self._series.get(key, set()):
            gauge.remove(*labels)  # an instance that went away, a condition no longer reported

    def promoted(self, namespace: str, cluster: str, reason: str) -> None:
        """Count one promotion."""
        self.failovers.labels(namespace, cluster, reason).inc()

    def deleting(self, cluster: Obj, since: float) -> None:
        meta = cluster["metadata"]
        key = (meta["namespace"], meta["name"])
        self._set(key, self.deleting_since, key, since)

    def certificate_expires(self, namespace: str, cluster: str, when: datetime) -> None:
        """The TLS step's reading of the server certificate (kept apart from :meth:`observe`'s series, which a pass
        replaces; dropped by :meth:`forget`)."""
        self.tls_expiry.labels(namespace, cluster).set(when.timestamp())
        self._tls.add((namespace, cluster))

    def restore_tested(self, namespace: str, cluster: str, when: datetime, succeeded: bool) -> None:
        """The last restore rehearsal (from status, by the rehearsal step; dropped by :meth:`forget`)."""
        self.restore_test_time.labels(namespace, cluster).set(when.timestamp())
        self.restore_test_ok.labels(namespace, cluster).set(float(succeeded))
        self._restore_tested.add((namespace, cluster))

    def backups(self, namespace: str, cluster: str, values: Mapping[str, float | None]) -> None:
        """The cluster's base backup summary (keys ``success``, ``failure``, ``succeeded``, ``recoverability``;
        None drops the series), by the cluster's backup step."""
        key = (namespace, cluster)
        gauges = {"success": self.backup_success, "failure": self.backup_failure, "succeeded": self.backup_succeeded,
                  "recoverability": self.recoverability}  # fmt: skip
        present = self._backed_up.setdefault(key, set())
        for name, gauge in gauges.items():
            value = values.get(name)
            if value is not None:
                gauge.labels(*key).set(value)
                present.add(gauge)
            elif gauge in present:
                gauge.remove(*key)
                present.discard(gauge)

    def backup_failed(self, namespace: str, cluster: str) -> None:
        """Count one failed base backup."""
        self.backup_failures.labels(namespace, cluster).inc()

    def forget(self, namespace: str, name: str) -> None:
        """Drop every series of a cluster that is gone."""
        for gauge in self._backed_up.pop((namespace, name), set()):
            gauge.remove(namespace, name)
        for gauge, labels in self._series.pop((namespace, name), set()):
            gauge.remove(*labels)
        if (namespace, name) in self._restore_tested:
            self._restore_tested.discard((namespace, name))
            self.restore_test_time.remove(namespace, name)
            self.restore_test_ok.remove(namespace, name)
        if (namespace, name) in self._tls:
            self._tls.discard((namespace, name))
            self.tls_expiry.remove(namespace, name)
