"""The alerts against a real broken cluster (issue 15 item 4): a real Prometheus server (Debian's, on 127.0.0.1,
started by the test) scrapes the in-process operator's metrics and the instance exporter of a one-instance cluster on
a local node; fencing the primary through the instance API (PostgreSQL stopped, the cluster not Ready) fires the
instance's and the cluster's alerts with their own labels, and unfencing it resolves them. Before that, every
dashboard panel is evaluated over what this live cluster exports: all answer but those whose series need an event the
test does not cause (``NEEDS_AN_EVENT``, each with its reason).

The rules are the shipped ``deploy/monitoring/alerts.yaml`` with only their ``for`` durations shortened to 5 s (a copy
written by the test), so an alert fires within seconds; the durations themselves are what promtool's tests check.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
import shutil
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

from kanri.local import Endpoint
from kanri.local.node import LocalNode
from kanri.postgres import names
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from kanri.runtime.kinds import SECRET
from tests.e2e.postgres_helpers import cluster, pod_ips, ready
from tests.integration.test_monitoring_prometheus import api, start_prometheus
from tests.postgres_support import Operator
from tests.support import NotYet, eventually
from tests.unit.test_monitoring import ALERTS, DASHBOARD

pytestmark = pytest.mark.timeout(300)

Obj = dict[str, Any]
KUBECTL = Path(sys.executable).parent / "kubectl"
NAME = "watched"
INSTANCE = f"{NAME}-1"
POD = names.pod_name(INSTANCE)  # the StatefulSet INSTANCE's one pod


NEEDS_AN_EVENT = {
    "Terminating for": "a cluster being deleted",
    "Replication lag": "a replica",
    "Standby replay lag (seconds)": "a replica",
    "Failovers (last hour)": "a failover",
    "Last failover: WAL gap": "a failover",
    "Since last failover": "a failover",
    "Since last successful base backup": "spec.backup and a base backup",
    "Recoverable window": "spec.backup and a base backup",
    "Last base backup succeeded, WAL archiving failing": "spec.backup",
    "Failed base backups (last day)": "a failed base backup",
    "Since last archived WAL": "spec.backup and an archived segment",
    "Since last restore rehearsal": "a restore rehearsal",
    "Last restore rehearsal passed": "a restore rehearsal",
    "Last major upgrade failed": "a major upgrade",
    "Downtime of the last major upgrade": "a major upgrade",
    "Leader": "leader election (off for the test's in-process operator)",
    "API requests by code": "the operator's REST client metrics (registered by kanri run, not the test's operator)",
    "PgBouncer console answering (up)": "a PostgresPooler's PgBouncer pods (none in this test)",
    "Pooler clients: active and waiting": "a PostgresPooler's PgBouncer pods (none in this test)",
    "Pooler server connections by state": "a PostgresPooler's PgBouncer pods (none in this test)",
    "Pooler longest client wait": "a PostgresPooler's PgBouncer pods (none in this test)",
    "Pooler client connections / max_client_conn": "a PostgresPooler's PgBouncer pods (none in this test)",
    "Pooler transactions and wait per transaction": "a PostgresPooler's PgBouncer pods (none in this test)",
}
"""Dashboard panels whose series need something this test does not do; tests/integration/test_monitoring_prometheus.py
proves their queries against series the operator's own metric classes set."""


async def panels_answering(prometheus: str, namespace: str) -> tuple[set[str], set[str]] | None:
    """:func:`panels` once every panel not in :data:`NEEDS_AN_EVENT` has series (None before)."""
    answering, silent = await panels(prometheus, namespace)
    return (answering, silent) if not silent - set(NEEDS_AN_EVENT) else None


async def panels(prometheus: str, namespace: str) -> tuple[set[str], set[str]]:
    """The titles of the dashboard's panels with series for this test's cluster, and of those without."""
    dashboard = json.loads(DASHBOARD.read_text())
    answering: set[str] = set()
    silent: set[str] = set()
    for panel in dashboard["panels"]:
        exprs = [t["expr"].replace("$__rate_interval", "10s").replace("$namespace", namespace)
                 .replace("$cluster", NAME) for t in panel.get("targets", [])]  # fmt: skip
        if not exprs:
            continue
        results = [(await api(prometheus, "query", query=expr))["result"] for expr in exprs]
        (answering if any(results) else silent).add(panel["title"])
    return answering, silent


@contextlib.contextmanager
def serve(registry: CollectorRegistry) -> Iterator[str]:
    """``registry`` over HTTP on 127.0.0.1, as the operator's ``/metrics`` serves it; yields host:port."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler.factory(registry))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def quick_rules(directory: Path) -> Path:
    """The shipped rules with every ``for`` at 5 s."""
    path = directory / "alerts.yaml"
    path.write_text(re.sub(r"(?m)^(\s+for:) \d+[smh]$", r"\1 5s", ALERTS.read_text()))
    assert "for: 5s" in path.read_text()
    return path


async def kubectl_raw(kubeconfig: Path, path: str) -> str:
    process = await asyncio.create_subprocess_exec(
        str(KUBECTL), f"--kubeconfig={kubeconfig}", "get", "--raw", path,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await process.communicate()
    assert process.returncode == 0, err.decode()
    return out.decode()


async def instance_post(ip: str, path: str, token: str) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"https://{ip}:8008{path}", headers=headers, json={"reason": "monitoring e2e"}, ssl=False
        ) as response,
    ):  # fmt: skip (the API serves TLS)
        assert response.status == 200, await response.text()


async def alerts_of(prometheus: str, namespace: str) -> dict[str, list[Obj]]:
    """Active alerts of this test's namespace by name (state and labels)."""
    found: dict[str, list[Obj]] = {}
    for alert in (await api(prometheus, "alerts"))["alerts"]:
        if alert["labels"].get("namespace") == namespace:
            found.setdefault(alert["labels"]["alertname"], []).append(alert)
    return found


async def test_prometheus_fires_the_alerts_of_a_fenced_primary_and_resolves_them_once_unfenced(
    control_plane: Endpoint, client: Client, node: LocalNode, operator: Operator, namespace: str, tmp_path: Path
) -> None:
    binary = shutil.which("prometheus")
    assert binary, "prometheus not found: run `make system` (Debian's prometheus package)"
    await client.create(POSTGRES_CLUSTER, cluster(NAME, namespace, 1))
    async with operator.running(refresh=2.0):
        await eventually(lambda: ready(client, namespace, NAME, 1), timeout=120, interval=1)
        ip = (await pod_ips(client, namespace, NAME))[POD]
        secret = await client.get(SECRET, names.api_secret(NAME), namespace)
        token = base64.b64decode(secret["data"]["token"]).decode()

        # the exporter through the API server's pod proxy, as `kubectl get --raw` reaches it
        proxy = f"/api/v1/namespaces/{namespace}/pods/{POD}:9187/proxy/metrics"
        up = re.compile(rf'^kanri_instance_up\{{[^}}]*instance="{INSTANCE}"[^}}]*\}} 1\.0$', re.M)

        async def proxied() -> str | None:  # the snapshot is up to 5 s old: PostgreSQL may have started since
            text = await kubectl_raw(control_plane.kubeconfig, proxy)
            return text if up.search(text) else None

        assert 'kanri_instance_role{cluster="watched"' in await eventually(proxied, timeout=30)

        home = tmp_path / "prometheus"
        home.mkdir()
        with serve(operator.registry) as operator_target:
            config = {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(quick_rules(home))],
                "scrape_configs": [
                    {"job_name": "kanri-operator", "honor_labels": True,
                     "static_configs": [{"targets": [operator_target]}],
                     "relabel_configs": [{"target_label": "namespace", "replacement": "kanri-system"}]},
                    {"job_name": "kanri-instances", "honor_labels": True,
                     "static_configs": [{"targets": [f"{ip}:9187"]}]},
                ],
            }  # fmt: skip
            (home / "prometheus.yml").write_text(yaml.safe_dump(config))
            process, prometheus = await start_prometheus(binary, home)
            try:

                async def scraped() -> bool:
                    selector = f'namespace="{namespace}",cluster="{NAME}"'
                    up = await api(prometheus, "query", query=f"kanri_instance_up{{{selector}}} == 1")
                    ready_query = f'kanri_postgres_cluster_condition{{{selector},type="Ready"}} == 1'
                    return bool(up["result"]) and bool((await api(prometheus, "query", query=ready_query))["result"])

                await eventually(scraped, timeout=60, interval=0.5)
                # the dashboard over what this live cluster really exports: every panel answers but those whose
                # series only an event this test does not cause creates (the integration test feeds those)
                try:
                    answered = await eventually(lambda: panels_answering(prometheus, namespace), timeout=60, interval=2)
                except NotYet:
                    _, silent = await panels(prometheus, namespace)
                    pytest.fail(f"dashboard panels with no series: {sorted(silent - set(NEEDS_AN_EVENT))}")
                print(f"\ndashboard panels answering for a live cluster: {len(answered[0])}; waiting for an event: "
                      f"{sorted(answered[1])}")  # fmt: skip
                watched = {"PostgresInstanceDown", "PostgresClusterNotReady"}
                assert not watched & set(await alerts_of(prometheus, namespace))  # not for a healthy cluster

                await instance_post(ip, "/fence", token)

                async def firing() -> dict[str, list[Obj]] | None:
                    found = await alerts_of(prometheus, namespace)
                    done = all(any(a["state"] == "firing" for a in found.get(name, [])) for name in watched)
                    return found if done else None

                fired = await eventually(firing, timeout=90, interval=0.5)
                down = fired["PostgresInstanceDown"][0]["labels"]
                assert (down["namespace"], down["cluster"], down["instance"]) == (namespace, NAME, INSTANCE)
                assert fired["PostgresClusterNotReady"][0]["labels"]["cluster"] == NAME

                await instance_post(ip, "/unfence", token)

                async def resolved() -> bool:
                    found = await alerts_of(prometheus, namespace)
                    return not watched & set(found)

                await eventually(resolved, timeout=120, interval=0.5)
            finally:
                process.terminate()
                await process.wait()
