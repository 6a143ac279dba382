"""The alert rules and the dashboard in a real Prometheus server (Debian's, bound to 127.0.0.1, started by the test)
scraping kanri's real metric classes over HTTP with ``honor_labels`` as docs/observability.md says to: the rules load
and evaluate, alerts go pending with the cluster's own labels, and every dashboard query returns series.

The metric values are set through the classes the operator uses (``PostgresMetrics.observe`` with instance reports,
the controller, queue, client and leader-election metrics); the operator itself scraped in a local cluster is the
e2e's job (issue 15).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

from kanri.instance.exporter import METRICS, Snapshot, SnapshotCollector
from kanri.local.ports import free_port
from kanri.postgres.backup.archiving import BackupMetrics
from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.metrics import PostgresMetrics
from kanri.postgres.pooler.agent.metrics import Console, PoolerCollector
from kanri.runtime import Client, FakeClock, LeaderElector
from kanri.runtime._client import ClientMetrics
from kanri.runtime._connection import Connection
from kanri.runtime._controller_metrics import ControllerMetrics
from kanri.runtime._queue_metrics import WorkQueueMetrics
from kanri.runtime._store import Store
from tests.support import eventually
from tests.unit.test_monitoring import ALERTS, dashboard_exprs, registered, used_metrics

Obj = dict[str, Any]


def cluster(name: str, ready: bool, degraded: bool, generation: int = 1) -> Obj:
    conditions = [
        {"type": "Ready", "status": str(ready)},
        {"type": "Progressing", "status": "False"},
        {"type": "Degraded", "status": str(degraded)},
    ]
    return {
        "metadata": {"namespace": "shop", "name": name, "generation": generation},
        "spec": {"replicas": 3},
        "status": {"readyReplicas": 3 if ready else 1, "observedGeneration": 1, "conditions": conditions},
    }


def reports(prefix: str) -> dict[str, InstanceReport]:
    return {
        f"{prefix}-1": InstanceReport(
            name=f"{prefix}-1", role="primary", ready=True, running=True, timeline=2, write_lsn="0/5000148"
        ),
        f"{prefix}-2": InstanceReport(
            name=f"{prefix}-2",
            role="replica",
            ready=True,
            running=True,
            timeline=2,
            receive_lsn="0/5000100",
            lag_bytes=4096,
        ),
    }


HEALTHY = {"kanri_instance_wal_bytes": 1e9, "kanri_instance_volume_size_bytes": 10e9,
           "kanri_instance_volume_free_bytes": 5e9}  # fmt: skip


def fill(registry: CollectorRegistry) -> None:
    """Every family kanri registers, with a value, through the classes the operator uses."""
    postgres = PostgresMetrics(registry)
    failed_over = cluster("orders", ready=False, degraded=True, generation=2)
    failed_over["status"]["lastFailover"] = {"time": "2026-12-02T04:00:00Z", "from": "orders-1", "to": "orders-2",
                                             "reason": "PrimaryUnreachable", "lsnGapBytes": 4096,
                                             "dataLossPossible": True, "durationSeconds": 2.5}  # fmt: skip
    postgres.observe(failed_over, reports("orders"))
    postgres.promoted("shop", "orders", "PrimaryUnreachable")
    upgraded = cluster("carts", ready=True, degraded=False)
    upgraded["status"]["upgrade"] = {"phase": "Succeeded", "from": 14, "to": 15, "downtimeSeconds": 15.0}
    postgres.observe(upgraded, reports("carts"))
    postgres.deleting(cluster("carts", ready=True, degraded=False), since=1.0)
    # Backups, WAL archiving and the last restore rehearsal, as the backup and rehearsal steps set them.
    postgres.backups("shop", "orders", {"success": 1.7e9, "failure": 1.7e9 + 60, "succeeded": 0.0,
                                        "recoverability": 1.6e9})  # fmt: skip
    postgres.backup_failed("shop", "orders")
    postgres.restore_tested("shop", "orders", datetime(2026, 11, 29, 5, tzinfo=UTC), succeeded=False)
    archiving = BackupMetrics(registry)
    archiving.failing.labels("shop", "orders").set(1)
    archiving.last_archived.labels("shop", "orders").set(1.7e9)
    controller = ControllerMetrics(registry)
    controller.reconcile_total.labels("postgrescluster", "success").inc(5)
    controller.reconcile_total.labels("postgrescluster", "error").inc()
    controller.reconcile_errors.labels("postgrescluster").inc()
    controller.terminal_errors.labels("postgrescluster").inc()
    controller.reconcile_time.labels("postgrescluster").observe(0.02)
    controller.active_workers.labels("postgrescluster").set(1)
    controller.max_concurrent.labels("postgrescluster").set(4)
    store = Store()
    deleted = {"namespace": "shop", "name": "old", "deletionTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x"]}
    store.upsert({"apiVersion": "v1", "kind": "Thing", "metadata": deleted})
    controller.watch_deletions("postgrescluster", store)
    queue = WorkQueueMetrics(registry).for_queue("postgrescluster", FakeClock())
    queue.added()
    queue.retried()
    queue.set_depth(1)
    queue.set_namespace_depth("shop", 1)
    queue.started("shop/orders", 0.01)
    queue.finished("shop/orders")
    client = ClientMetrics(registry)
    client.requests.labels("200", "GET", "10.0.0.1:6443").inc(10)
    client.requests.labels("429", "PATCH", "10.0.0.1:6443").inc()
    client.latency.labels("GET", "10.0.0.1:6443").observe(0.01)
    # The instance exporter's series, healthy values (no instance alert may go pending), as a primary reports them.
    exporter = SnapshotCollector(("shop", "orders", "orders-1"))
    exporter.snapshot = Snapshot({
        name: [(tuple("orders-2" if label == "standby" else "idle" if label == "state" else "x" for label in extra),
                HEALTHY.get(name, 1.0))]
        for name, (_, _, extra) in METRICS.items()
    })  # fmt: skip
    registry.register(exporter)
    # A PgBouncer pod's agent, as it renders one scrape of a busy pool (kanri.postgres.pooler.agent.metrics).
    pools = [{"database": "app", "user": "app", "cl_active": 30, "cl_waiting": 2, "sv_active": 20, "sv_idle": 0,
              "sv_used": 0, "sv_login": 0, "maxwait": 1, "maxwait_us": 0}]  # fmt: skip
    stats = [{"database": "app", "total_xact_count": 100, "total_query_count": 150, "total_wait_time": 500_000,
              "total_received": 10_000, "total_sent": 20_000}]  # fmt: skip
    console = Console(
        pools, stats, [{"list": "used_clients", "items": 33}], [{"key": "max_client_conn", "value": "1000"}]
    )
    registry.register(PoolerCollector(lambda: console))
    # A standby: the gauge is 0 until it leads, so KanriOperatorNoLeader goes pending.
    LeaderElector(Client(Connection(host="http://127.0.0.1:1")), namespace="kanri-system", name="kanri-postgres",
                  identity="standby", registry=registry)  # fmt: skip


@pytest.fixture(scope="module")
def exporter() -> Iterator[str]:
    """kanri's metrics on a local HTTP server, as the operator's /metrics serves them."""
    registry = CollectorRegistry()
    fill(registry)
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler.factory(registry))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def prometheus(exporter: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    """A Prometheus server scraping the exporter every second with the alert rules loaded; its base URL."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus not found: run `make system` (Debian's prometheus package)"
    home = tmp_path_factory.mktemp("prometheus")
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(ALERTS)],
        "scrape_configs": [
            {
                "job_name": "kanri-operator",
                "honor_labels": True,
                "static_configs": [{"targets": [exporter]}],
                # As a PodMonitor (or kubernetes_sd relabelling) labels every target with the pod's namespace.
                "relabel_configs": [{"target_label": "namespace", "replacement": "kanri-system"}],
            }
        ],
    }
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    async with running_prometheus(binary, home) as url:
        yield url


@contextlib.asynccontextmanager
async def running_prometheus(binary: str, home: Path) -> AsyncIterator[str]:
    """:func:`start_prometheus`, stopped (SIGTERM, then SIGKILL after 30 s) when the block ends; its URL."""
    process, url = await start_prometheus(binary, home)
    try:
        yield url
    finally:
        process.terminate()
        try:
            await asyncio.wait_for(process.wait(), timeout=30)
        except TimeoutError:
            process.kill()
            await process.wait()


async def start_prometheus(binary: str, home: Path) -> tuple[asyncio.subprocess.Process, str]:
    """Start it on a free port and wait until it is ready; another port if that one was taken meanwhile."""
    for attempt in range(3):
        port = free_port()
        log = home / f"prometheus-{attempt}.log"
        with log.open("w") as out:
            process = await asyncio.create_subprocess_exec(
                binary, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn", stdout=out, stderr=out,
            )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:
            if await eventually(functools.partial(readiness, session, process, url), timeout=60) == "ready":
                return process, url
        if "address already in use" not in log.read_text():
            break
    pytest.fail(f"prometheus did not start:\n{log.read_text()}")


async def readiness(session: aiohttp.ClientSession, process: asyncio.subprocess.Process, url: str) -> str | None:
    """ "ready", "exited", or None while it is starting."""
    if process.returncode is not None:
        return "exited"
    try:
        async with session.get(f"{url}/-/ready") as response:
            return "ready" if response.status == 200 else None
    except aiohttp.ClientError:
        return None


async def api(url: str, path: str, **params: str) -> Any:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/api/v1/{path}", params=params) as response:
        body = await response.json()
        assert body["status"] == "success", body
        return body["data"]


async def test_every_rule_loads_and_evaluates(prometheus: str) -> None:
    expected = {rule["alert"] for group in yaml.safe_load(ALERTS.read_text())["groups"] for rule in group["rules"]}

    async def evaluated() -> dict[str, str] | None:
        groups = (await api(prometheus, "rules"))["groups"]
        health = {rule["name"]: rule["health"] for group in groups for rule in group["rules"]}
        return health if set(health) == expected and set(health.values()) == {"ok"} else None

    await eventually(evaluated, timeout=60)


async def test_alerts_go_pending_with_the_clusters_own_labels(prometheus: str) -> None:
    """honor_labels keeps ``namespace``/``cluster`` (and ``instance``) as the operator wrote them: the alerts match."""

    async def pending() -> dict[str, list[Obj]] | None:
        alerts = (await api(prometheus, "alerts"))["alerts"]
        by_name: dict[str, list[Obj]] = {}
        for alert in alerts:
            by_name.setdefault(alert["labels"]["alertname"], []).append(alert["labels"])
        wanted = {"PostgresClusterNotReady", "PostgresClusterDegraded", "PostgresClusterNotConverged",
                  "KanriOperatorNoLeader", "KanriFinalizerStuck"}  # fmt: skip
        return by_name if wanted <= set(by_name) else None

    found = await eventually(pending, timeout=60)
    for name in ("PostgresClusterNotReady", "PostgresClusterDegraded", "PostgresClusterNotConverged"):
        assert [(a["namespace"], a["cluster"]) for a in found[name]] == [("shop", "orders")], name
        assert "exported_namespace" not in found[name][0]
    assert [a["name"] for a in found["KanriOperatorNoLeader"]] == ["kanri-postgres"]
    assert [(a["namespace"], a["name"]) for a in found["KanriFinalizerStuck"]] == [("shop", "old")]
    # The healthy cluster raises nothing, and neither do alerts whose condition does not hold.
    assert not any(a.get("cluster") == "carts" for alerts in found.values() for a in alerts)
    assert "PostgresReplicationLagHigh" not in found
    assert "KanriApiThrottled" not in found


async def test_instance_and_namespace_labels_are_the_clusters(prometheus: str) -> None:
    """Without honor_labels the target's ``instance`` (host:port) and ``namespace`` would replace these."""

    async def lag() -> list[Obj] | None:
        result: list[Obj] = (await api(prometheus, "query", query="kanri_postgres_instance_replication_lag_bytes"))[
            "result"
        ]
        return result or None

    series = [item["metric"] for item in await eventually(lag, timeout=60)]
    assert sorted((s["namespace"], s["cluster"], s["instance"]) for s in series) == [
        ("shop", "carts", "carts-2"),
        ("shop", "orders", "orders-2"),
    ]


async def test_every_dashboard_query_returns_series(prometheus: str) -> None:
    queries = [
        expr.replace("$__rate_interval", "10s").replace("$namespace", ".*").replace("$cluster", ".*")
        for expr in dashboard_exprs()
    ]
    assert len(queries) >= 20

    async def answered() -> list[str] | None:
        empty = []
        for query in queries:
            if not (await api(prometheus, "query", query=query))["result"]:
                empty.append(query)
        return None if empty else queries

    try:
        await eventually(answered, timeout=60)
    except TimeoutError:
        empty = [q for q in queries if not (await api(prometheus, "query", query=q))["result"]]
        pytest.fail("dashboard queries with no series:\n" + json.dumps(empty, indent=1))


def test_every_metric_the_dashboard_uses_is_registered() -> None:
    known = registered()
    missing = {name for expr in dashboard_exprs() for name in used_metrics(expr)} - set(known)
    assert missing == set()
