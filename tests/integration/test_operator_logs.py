"""``kanri run``'s log against the real API server: one JSON object per line on stderr, and the lines of a
PostgresCluster's reconcile carry the keys its metrics and conditions use (namespace, cluster, reconcile_id)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from kanri.local import Endpoint
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client
from tests.postgres_support import install_postgres_crd
from tests.support import eventually

pytestmark = [pytest.mark.timeout(120), pytest.mark.asyncio(loop_scope="session")]


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


def events(path: Path) -> list[dict[str, Any]]:
    """Every line of the log as JSON (a line that is not JSON fails the test)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_kanri_run_writes_one_json_event_per_line_with_the_clusters_keys(
    control_plane: Endpoint, client: Client, namespace: str, tmp_path: Path
) -> None:
    log_file = tmp_path / "operator.log"
    with log_file.open("wb") as sink:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kanri.cli.main", "run", f"--kubeconfig={control_plane.kubeconfig}",
            f"--namespace={namespace}", "--no-leader-election", "--health-port=0", "--log-level=debug",
            stdout=sink, stderr=sink,
        )  # fmt: skip
    try:
        body = {"version": 16, "replicas": 1, "storage": {"size": "1Gi"}}
        await client.create(POSTGRES_CLUSTER, {"apiVersion": POSTGRES_CLUSTER.api_version, "kind": "PostgresCluster",
                                               "metadata": {"name": "logged", "namespace": namespace},
                                               "spec": body})  # fmt: skip

        async def reconcile_lines() -> list[dict[str, Any]]:
            assert process.returncode is None, log_file.read_text()[-3000:]
            found = [e for e in events(log_file) if e.get("reconcile_id") and e.get("cluster") == "logged"]
            # until the first reconcile has ended: its closing "reconciled" line is written last
            return found if any(e["event"] == "reconciled" for e in found) else []

        lines = await eventually(reconcile_lines, timeout=60)
    finally:
        process.terminate()
        await process.wait()
    every = events(log_file)
    assert all({"event", "level", "timestamp"} <= set(e) for e in every), every[:3]
    line = lines[0]
    assert line["namespace"] == namespace
    assert line["name"] == "logged"
    assert line["controller"] == "postgrescluster"
    assert len(line["reconcile_id"]) == 16
    assert any(e["event"] == "reconciled" and e["result"] in ("success", "requeue_after") for e in lines), lines
    # a line of the same reconcile after it: the bound keys do not leak into the next object's lines
    assert all(e.get("cluster") in (None, "logged") for e in every)
