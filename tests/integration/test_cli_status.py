"""``kanri status`` against the real API server: a PostgresCluster whose status (written through ``/status``), pods,
Nodes and Events are real objects, rendered as the command prints it — as ``kanri status``, as ``kubectl kanri
status`` through kubectl's plugin mechanism, and with ``--watch``."""

from __future__ import annotations

import asyncio
import io
import os
import re
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from rich.console import Console
from typer.testing import CliRunner

from kanri.cli.main import app
from kanri.cli.status import follow
from kanri.local.controlplane import Endpoint
from kanri.postgres.api.v1alpha1 import PostgresCluster
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.runtime import Client, crd_for, format_time
from kanri.runtime.kinds import CRD, EVENT, NODE, POD
from tests.support import eventually

ROOT = Path(__file__).resolve().parents[2]
KUBECTL = Path(sys.executable).parent / "kubectl"
INFO = PostgresCluster.resource
NAME = "orders"


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def installed(control_plane: Endpoint) -> AsyncIterator[None]:
    """The PostgresCluster CRD, applied (idempotent: other modules apply the same) and Established."""
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        await client.apply(CRD, crd_for(PostgresCluster), field_manager="kanri-tests")

        async def established() -> bool:
            crd = await client.get(CRD, INFO.crd_name)
            conditions = {c["type"]: c["status"] for c in (crd.get("status") or {}).get("conditions") or []}
            return conditions.get("Established") == "True"

        await eventually(established, timeout=30)
        yield


def ago(minutes: float) -> str:
    return format_time(datetime.now(UTC) - timedelta(minutes=minutes))


def pod(name: str, namespace: str, node: str, role: str) -> dict[str, Any]:
    labels = {"kanri.dev/cluster": NAME, "kanri.dev/instance": name, "kanri.dev/role": role}
    container = {"name": "postgres", "image": "kanri.dev/postgres:17"}
    # Named as the StatefulSet names its one pod: the instance name is the label, not the pod's name.
    meta = {"name": f"{name}-0", "namespace": namespace, "labels": labels}
    return {"metadata": meta, "spec": {"nodeName": node, "containers": [container]}}


def running(ready: bool, restarts: int = 0) -> dict[str, Any]:
    state = {"running": {"startedAt": ago(30)}}
    container = {"name": "postgres", "image": "kanri.dev/postgres:17", "imageID": "", "ready": ready,
                 "restartCount": restarts, "state": state}  # fmt: skip
    condition = {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": ago(30)}
    return {"status": {"phase": "Running", "conditions": [condition], "containerStatuses": [container]}}


def crash_looping() -> dict[str, Any]:
    waiting = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 5m0s restarting failed container"}}
    container = {"name": "postgres", "image": "kanri.dev/postgres:17", "imageID": "", "ready": False,
                 "restartCount": 7, "state": waiting}  # fmt: skip
    return {"status": {"phase": "Running", "containerStatuses": [container]}}


def cluster_status(failover_time: str) -> dict[str, Any]:
    condition = {"lastTransitionTime": ago(12), "observedGeneration": 1}
    return {
        "status": {
            "phase": "Degraded",
            "observedGeneration": 1,
            "currentPrimary": "orders-2",
            "timeline": 3,
            "readyReplicas": 2,
            "postgresMajor": 17,
            "instances": [
                {"name": "orders-1", "role": "Replica", "ready": False},
                {"name": "orders-2", "role": "Primary", "ready": True, "receivedLSN": "0/5000148"},
                {
                    "name": "orders-3",
                    "role": "Replica",
                    "ready": True,
                    "receivedLSN": "0/5000148",
                    "replayedLSN": "0/5000060",
                    "lagBytes": 3 * 1024 * 1024,
                },
            ],
            "lastFailover": {
                "time": failover_time,
                "from": "orders-1",
                "to": "orders-2",
                "timeline": 3,
                "lsnGapBytes": 8192,
                "dataLossPossible": True,
                "reason": "PrimaryUnreachable",
            },
            "conditions": [
                {
                    **condition,
                    "type": "Ready",
                    "status": "False",
                    "reason": "ReplicasNotReady",
                    "message": "orders-1: instance manager not answering",
                },
                {**condition, "type": "Progressing", "status": "False", "reason": "Converged", "message": "converged"},
                {
                    **condition,
                    "type": "Degraded",
                    "status": "True",
                    "reason": "InstanceErrors",
                    "message": "orders-1 crash-loops",
                },
            ],
        }
    }


def event(name: str, kind: str, involved: str, kind_of_event: str, reason: str, message: str,
          last_seen: float = 2) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": name},
        "involvedObject": {"kind": kind, "name": involved},
        "type": kind_of_event,
        "reason": reason,
        "message": message,
        "count": 4,
        "firstTimestamp": ago(20),
        "lastTimestamp": ago(last_seen),
        "source": {"component": "kanri-postgres"},
    }


@pytest_asyncio.fixture(loop_scope="session")
async def cluster(installed: None, client: Client, namespace: str) -> AsyncIterator[str]:
    """A 3-instance PostgresCluster after a lossy failover, with one crash-looping replica: its pods on two zoned
    Nodes, a status, Warning Events (its own, a pod's) and a Normal Event and another cluster's Warning."""
    nodes = [f"{namespace}-a"[:63], f"{namespace}-b"[:63]]
    for node, zone in zip(nodes, ("zone-east", "zone-west"), strict=True):
        await client.create(NODE, {"metadata": {"name": node, "labels": {"topology.kubernetes.io/zone": zone}}})
    try:
        spec = {"version": 17, "replicas": 3, "storage": {"size": "1Gi"},
                "replication": {"mode": "Sync", "syncStandbys": 1}}  # fmt: skip
        meta = {"name": NAME, "namespace": namespace}
        await client.create(POSTGRES_CLUSTER, {"metadata": meta, "spec": spec})
        await client.patch_status(POSTGRES_CLUSTER, NAME, cluster_status(ago(7)), namespace)
        # A second cluster whose name starts with the first's: its Events are not the first's.
        await client.create(POSTGRES_CLUSTER, {"metadata": {**meta, "name": "orders-archive"}, "spec": spec})
        for name, node, role, status in (
            ("orders-1", nodes[0], "replica", crash_looping()),
            ("orders-2", nodes[1], "primary", running(True)),
            ("orders-3", nodes[0], "replica", running(True, restarts=2)),
        ):
            await client.create(POD, pod(name, namespace, node, role))
            await client.patch_status(POD, f"{name}-0", status, namespace)
        for item in (
            event("e1", "PostgresCluster", NAME, "Warning", "FailoverDataLoss", "promoted orders-2; 8192 bytes lost"),
            event("e2", "Pod", "orders-1-0", "Warning", "BackOff", "Back-off restarting failed container postgres", 5),
            event("e3", "PostgresCluster", NAME, "Normal", "CreatedInstance", "created instance orders-3"),
            event("e4", "PostgresCluster", "carts", "Warning", "SplitBrain", "another cluster's trouble"),
            event("e5", "Pod", "orders-archive-1-0", "Warning", "BackOff", "the archive cluster's pod trouble"),
        ):
            item["metadata"]["namespace"] = item["involvedObject"]["namespace"] = namespace
            await client.create(EVENT, item)
        yield namespace
    finally:
        # Pods bound to a Node go at once (no kubelet would finish a graceful deletion), then the Nodes, gone before
        # the next module (the scheduler's messages count every Node).
        for node in nodes:
            pods, _ = await client.list(POD, field_selector=f"spec.nodeName={node}")
            for item in pods:
                meta = item["metadata"]
                await client.delete(POD, meta["name"], meta["namespace"], grace_period_seconds=0)
            await client.delete(NODE, node)

        async def nodes_gone() -> bool:
            items, _ = await client.list(NODE)
            return not any(item["metadata"]["name"] in nodes for item in items)

        await eventually(nodes_gone, timeout=60)


def invoke(*args: str) -> str:
    """``kanri ARGS`` in this process (CliRunner), its output and exit code checked."""
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "220"})
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def row(output: str, first: str) -> list[str]:
    """The cells of the table row that starts with ``first``."""
    for line in output.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{output}")


async def test_status_shows_instances_failover_conditions_and_warning_events(
    cluster: str, control_plane: Endpoint
) -> None:
    output = await asyncio.to_thread(
        invoke, "status", NAME, "-n", cluster, "--kubeconfig", str(control_plane.kubeconfig)
    )
    assert f"PostgresCluster {cluster}/{NAME}" in output
    # Instances: role, readiness, pod state, node, zone, LSNs, lag, timeline.
    assert row(output, "orders-1")[1:6] == ["Replica", "no", "CrashLoopBackOff", f"{cluster}-a", "zone-east"]
    assert row(output, "orders-2")[1:] == ["Primary", "yes", "Running, ready", f"{cluster}-b", "zone-west",
                                           "0/5000148", "-", "-", "3"]  # fmt: skip
    assert row(output, "orders-3")[1:] == ["Replica", "yes", "Running, ready, 2 restarts", f"{cluster}-a",
                                           "zone-east", "0/5000148", "0/5000060", "3.0 MiB", "-"]  # fmt: skip
    # Summary: replication mode and the synchronous standbys asked for.
    assert "Sync, 1 synchronous standby(s) required" in output
    assert "2/3 ready" in output
    # The last failover with its gap.
    failover = next(line for line in output.splitlines() if line.startswith("Last failover:"))
    assert "orders-1 -> orders-2" in failover
    assert "WAL gap 8.0 KiB" in failover
    assert "DATA LOSS POSSIBLE" in failover
    assert "reason PrimaryUnreachable" in failover
    assert re.search(r"\(\d+m\d+s ago\)", failover), failover
    # Conditions with reasons and messages.
    assert row(output, "Degraded")[1:3] == ["True", "InstanceErrors"]
    assert "orders-1: instance manager not answering" in output
    # Warning Events of the cluster and its pods only, newest first; no Normal ones, no other cluster's.
    newer = output.index("promoted orders-2; 8192 bytes lost")
    assert output.index("Back-off restarting failed container postgres") > newer
    assert re.search(r"PostgresCluster/orders +FailoverDataLoss +4 ", output)
    assert re.search(r"Pod/orders-1-0 +BackOff +4 ", output)
    assert "created instance orders-3" not in output
    assert "another cluster's trouble" not in output
    assert "the archive cluster's pod trouble" not in output
    assert "Backups: not configured" in output


async def test_status_of_a_missing_cluster_says_so(installed: None, namespace: str, control_plane: Endpoint) -> None:
    result = await asyncio.to_thread(
        CliRunner().invoke, app, ["status", "nope", "-n", namespace, "--kubeconfig", str(control_plane.kubeconfig)]
    )
    assert result.exit_code == 1
    assert f"PostgresCluster {namespace}/nope not found" in result.output


def declared_entry_point(script: str) -> str:
    scripts: dict[str, str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return scripts[script]


async def test_kubectl_kanri_status_runs_the_plugin(cluster: str, control_plane: Endpoint, tmp_path: Path) -> None:
    """kubectl finds ``kubectl-kanri`` on PATH and hands it the arguments: a launcher of the entry point that
    pyproject.toml declares (what pip installs into the venv's bin) is enough to prove both ends."""
    module, attribute = declared_entry_point("kubectl-kanri").split(":")
    assert declared_entry_point("kubectl-kanri") == declared_entry_point("kanri")
    launcher = tmp_path / "kubectl-kanri"
    launcher.write_text(f"#!{sys.executable}\nfrom {module} import {attribute}\n{attribute}()\n")
    launcher.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "KUBECONFIG": str(control_plane.kubeconfig),
           "COLUMNS": "220", "PYTHONPATH": os.pathsep.join(sys.path)}  # fmt: skip
    result = await asyncio.to_thread(
        subprocess.run, [str(KUBECTL), "kanri", "status", NAME, "-n", cluster], env=env, capture_output=True,
        text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert row(result.stdout, "orders-2")[1:3] == ["Primary", "yes"]
    assert "DATA LOSS POSSIBLE" in result.stdout


async def test_watch_prints_each_new_snapshot(cluster: str, client: Client) -> None:
    """Not on a terminal, ``--watch`` prints a snapshot per refresh, each showing what changed since the last."""
    out = io.StringIO()
    console = Console(file=out, width=220, force_terminal=False)

    async def promote_orders_3(frame: int) -> None:
        if frame == 1:
            later = {"status": {"lastFailover": {"time": ago(0.5), "from": "orders-2", "to": "orders-3", "timeline": 4,
                                                 "lsnGapBytes": 0, "dataLossPossible": False, "reason": "Switchover"},
                                "currentPrimary": "orders-3", "timeline": 4}}  # fmt: skip
            await client.patch_status(POSTGRES_CLUSTER, NAME, later, cluster)

    await asyncio.wait_for(follow(client, NAME, cluster, console, interval=0.1, frames=2, after_frame=promote_orders_3),
                           timeout=60)  # fmt: skip
    first, second = out.getvalue().split(f"PostgresCluster {cluster}/{NAME}")[1:]
    assert "orders-1 -> orders-2" in first
    assert "orders-2 -> orders-3" in second
    assert "no data lost, reason Switchover" in second
    assert row(second, "Primary")[1:] == ["orders-3 (timeline 4)"]


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "220")
