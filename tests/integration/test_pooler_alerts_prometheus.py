"""deploy/monitoring/pooler-alerts.yaml in a real Prometheus server (Debian's, on 127.0.0.1) scraping the pooler
agent's collector over a real PgBouncer (tests/pgbouncer_support.py: the operator's configuration, PostgreSQL
unreachable, no cluster), with the target labels the chart's PodMonitor gives (job ``kanri-pgbouncer``,
``namespace``, ``pod``, ``pooler``). Every ``for`` is shortened to 2 s in a copy (the durations are the promtool
tests' job); the alerts fire from what PgBouncer really reports:

- PoolerDown for a pod whose agent cannot read its console and for one that cannot be scraped, not for the live one;
- PoolerNoServerConnections once applications' clients, reconnecting when refused ("server login has been
  failing"), wait to log in while PgBouncer cannot reach PostgreSQL (they queue in the lookup role's pool:
  ``user="kanri_pooler"``); PoolerClientsWaiting stays quiet (no server connection at all is the other alert's case);
- PoolerClientConnectionsNearLimit once the connections reach ``max_client_conn``.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack
from http.server import ThreadingHTTPServer
from pathlib import Path

import psycopg
import pytest
import pytest_asyncio
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler
from prometheus_client.registry import Collector

from kanri.local.ports import free_port
from kanri.postgres.pooler.agent.metrics import PoolerCollector, console_reader
from tests.integration.test_monitoring_prometheus import api, running_prometheus
from tests.pgbouncer_support import PGBOUNCER, Bouncer, running
from tests.support import eventually
from tests.unit.test_pooler_alerts import ALERTS, JOB

MAX_CLIENTS = 6
Labels = dict[str, str]

pytestmark = [
    pytest.mark.skipif(not PGBOUNCER.exists(), reason=f"no {PGBOUNCER} (make system installs Debian's pgbouncer)"),
    pytest.mark.timeout(180),
    pytest.mark.asyncio(loop_scope="session"),
]


@pytest.fixture(scope="module")
def bouncer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bouncer]:
    with running(tmp_path_factory.mktemp("pgbouncer"), {"max_client_conn": str(MAX_CLIENTS)}) as started:
        yield started


def serve(collector: Collector, stack: ExitStack) -> str:
    """A /metrics endpoint of one collector (as the agent's start_http_server serves it); host:port."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler.factory(registry))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stack.callback(server.server_close)
    stack.callback(server.shutdown)
    return f"127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="module")
def targets(bouncer: Bouncer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """pod name -> scrape address: the live pod, one whose console does not answer, one nothing listens for."""
    mute = console_reader(free_port(), bouncer.auth_file, bouncer.ca_file)  # no PgBouncer on that port
    with ExitStack() as stack:
        yield {
            "orders-pool-live": serve(bouncer.collector(), stack),
            "orders-pool-mute": serve(PoolerCollector(mute), stack),
            "orders-pool-gone": f"127.0.0.1:{free_port()}",
        }


def shortened_rules(path: Path) -> Path:
    """The shipped rules with every ``for`` at 2 s."""
    text, count = re.subn(r"(?m)^(\s+for: )\d+[smh]$", r"\g<1>2s", ALERTS.read_text())
    assert count == len([1 for group in yaml.safe_load(text)["groups"] for _ in group["rules"]]), "a rule without for"
    path.write_text(text)
    return path


@contextlib.asynccontextmanager
async def scraping(targets: dict[str, str], home: Path) -> AsyncIterator[str]:
    """A Prometheus server with the shortened pooler rules, scraping ``targets`` (pod name -> address) every second
    with the labels the PodMonitor and pod discovery give them; its base URL."""
    binary = shutil.which("prometheus")
    assert binary, "prometheus not found: run `make system` (Debian's prometheus package)"
    static = [{"targets": [address], "labels": {"namespace": "shop", "pod": pod, "pooler": "orders-pool"}}
              for pod, address in targets.items()]  # fmt: skip
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "rule_files": [str(shortened_rules(home / "pooler-alerts.yaml"))],
        "scrape_configs": [{"job_name": JOB, "static_configs": static}],
    }
    (home / "prometheus.yml").write_text(yaml.safe_dump(config))
    async with running_prometheus(binary, home) as url:
        yield url


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def prometheus(targets: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[str]:
    async with scraping(targets, tmp_path_factory.mktemp("prometheus")) as url:
        yield url


async def firing(url: str) -> dict[str, list[Labels]]:
    """The firing alerts by name, each alert's labels without alertname and severity."""
    found: dict[str, list[Labels]] = {}
    for alert in (await api(url, "alerts"))["alerts"]:
        if alert["state"] == "firing":
            labels = {k: v for k, v in alert["labels"].items() if k not in {"alertname", "severity"}}
            found.setdefault(alert["labels"]["alertname"], []).append(labels)
    return found


async def until_firing(url: str, alert: str, bouncer: Bouncer, on: list[str] | None = None) -> dict[str, list[Labels]]:
    """Waits until ``alert`` fires (on exactly the pods ``on``, when given); the last alerts, the live scrape and
    PgBouncer's log in the failure."""
    last: dict[str, list[Labels]] = {}

    async def check() -> dict[str, list[Labels]] | None:
        nonlocal last
        last = await firing(url)
        if alert not in last or (on is not None and sorted(a["pod"] for a in last[alert]) != on):
            return None
        return last

    try:
        return await eventually(check, timeout=60)
    except TimeoutError as exc:
        scrape = await asyncio.to_thread(bouncer.scrape)
        raise AssertionError(f"{alert} not firing on {on}; firing: {last}; scrape: {scrape}\n{bouncer.log()}") from exc


async def test_pooler_down_fires_for_the_mute_and_the_unscraped_pod_only(prometheus: str, bouncer: Bouncer) -> None:
    found = await until_firing(prometheus, "PoolerDown", bouncer, on=["orders-pool-gone", "orders-pool-mute"])
    assert all(alert["namespace"] == "shop" and alert["pooler"] == "orders-pool" for alert in found["PoolerDown"])
    assert "PoolerNoServerConnections" not in found, "no client waits yet"
    assert "PoolerClientConnectionsNearLimit" not in found


async def keep_connecting(bouncer: Bouncer, refusals: list[str]) -> None:
    """An application that reconnects: PgBouncer refuses a newcomer while its last server login failed ("server
    login has been failing"), and queues one that arrives while it tries again."""
    while True:
        try:
            await (await bouncer.client()).close()
        except psycopg.OperationalError as exc:
            refusals.append(str(exc))
            await asyncio.sleep(0.2)  # an application's reconnect delay


async def test_clients_waiting_to_log_in_without_postgresql_fire_no_server_connections(
    prometheus: str, bouncer: Bouncer
) -> None:
    refusals: list[str] = []
    clients = [asyncio.create_task(keep_connecting(bouncer, refusals)) for _ in range(3)]
    try:
        found = await until_firing(prometheus, "PoolerNoServerConnections", bouncer)
        (alert,) = found["PoolerNoServerConnections"]
        assert alert == {"namespace": "shop", "pooler": "orders-pool", "pod": "orders-pool-live",
                         "database": "app", "user": "kanri_pooler"}  # fmt: skip
        assert "PoolerClientsWaiting" not in found, "no server connection at all is not a busy pool"
        assert all("server login" in refusal for refusal in refusals), refusals[:3]
    finally:
        for task in clients:
            task.cancel()
        await asyncio.gather(*clients, return_exceptions=True)


async def test_connections_at_max_client_conn_fire_near_limit(prometheus: str, bouncer: Bouncer) -> None:
    with ExitStack() as held:
        for _ in range(MAX_CLIENTS):
            held.enter_context(bouncer.console())
        found = await until_firing(prometheus, "PoolerClientConnectionsNearLimit", bouncer)
        assert [a["pod"] for a in found["PoolerClientConnectionsNearLimit"]] == ["orders-pool-live"]
