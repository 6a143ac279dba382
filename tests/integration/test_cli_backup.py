"""``kanri backup`` against the real API server: it creates the PostgresBackup a kubectl user would (the API
server's schema accepts it), refuses a cluster without spec.backup, and with --wait follows the status to the end
(here written by the test, as the operator would)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest_asyncio
from typer.testing import CliRunner

from kanri.cli.backup import plan
from kanri.cli.main import app
from kanri.cli.operations import Refused
from kanri.local.controlplane import Endpoint
from kanri.postgres.kinds import POSTGRES_BACKUP, POSTGRES_CLUSTER
from kanri.runtime import Client
from tests.postgres_support import install_postgres_crd
from tests.support import eventually


@pytest_asyncio.fixture(loop_scope="session")
async def client(client: Client) -> Client:
    await install_postgres_crd(client)
    return client


async def kanri(control_plane: Endpoint, namespace: str, *args: str) -> tuple[int, str]:
    argv = [*args, "-n", namespace, "--kubeconfig", str(control_plane.kubeconfig)]
    result = await asyncio.to_thread(CliRunner().invoke, app, argv)
    return result.exit_code, result.output


def test_the_plan_names_the_backup_after_the_cluster_and_the_time_and_refuses_a_cluster_without_backups() -> None:
    cluster = {"metadata": {"name": "shop", "namespace": "prod"}, "spec": {"backup": {"retentionDays": 7}}}
    made = plan(cluster, datetime(2026, 12, 2, 15, 4, 5, tzinfo=UTC))
    assert not isinstance(made, Refused)
    assert made["metadata"] == {"name": "shop-20261202150405", "namespace": "prod"}
    assert made["spec"] == {"cluster": "shop"}
    refused = plan({"metadata": {"name": "shop", "namespace": "prod"}, "spec": {}}, datetime.now(UTC))
    assert isinstance(refused, Refused)
    assert "no spec.backup" in refused.reason


async def test_kanri_backup_creates_a_postgres_backup_and_wait_follows_it_to_completed(
    client: Client, namespace: str, control_plane: Endpoint
) -> None:
    spec = {"version": 16, "replicas": 1, "storage": {"size": "1Gi"}, "backup": {"retentionDays": 7}}
    await client.create(POSTGRES_CLUSTER, {"metadata": {"name": "shop", "namespace": namespace}, "spec": spec})
    bare = {"version": 16, "replicas": 1, "storage": {"size": "1Gi"}}
    await client.create(POSTGRES_CLUSTER, {"metadata": {"name": "bare", "namespace": namespace}, "spec": bare})

    code, output = await kanri(control_plane, namespace, "backup", "shop", "--name", "now")
    assert code == 0, output
    assert f"created PostgresBackup {namespace}/now" in output
    assert (await client.get(POSTGRES_BACKUP, "now", namespace))["spec"] == {"cluster": "shop"}

    code, output = await kanri(control_plane, namespace, "backup", "bare")
    assert code == 1
    assert "bare has no spec.backup" in output
    code, output = await kanri(control_plane, namespace, "backup", "ghost")
    assert code == 1
    assert "not found" in output

    waiting = asyncio.create_task(kanri(control_plane, namespace, "backup", "shop", "--name", "waited", "--wait"))

    async def created() -> bool:
        items, _ = await client.list(POSTGRES_BACKUP, namespace)
        return "waited" in {i["metadata"]["name"] for i in items}

    await eventually(created, timeout=20)
    await client.patch_status(POSTGRES_BACKUP, "waited", {"status": {"phase": "Running", "reason": "Started",
                              "message": "asking shop-1 to take the backup"}}, namespace)  # fmt: skip
    await asyncio.sleep(1.5)
    done = {"phase": "Completed", "reason": "Completed", "backupId": "20261202T150500", "sizeBytes": 31457280}
    await client.patch_status(POSTGRES_BACKUP, "waited", {"status": done}, namespace)
    code, output = await asyncio.wait_for(waiting, 30)
    assert code == 0, output
    assert "Running: asking shop-1 to take the backup" in output
    assert "backup 20261202T150500 completed (30.0 MiB)" in output
