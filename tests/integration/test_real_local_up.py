"""``kanri local up --real-nodes`` end to end (docs/real-nodes.md, issue 27): the control plane and three real nodes
in three zones come up and keep running after the command returns; after every process of the cluster is
SIGKILLed (a host crash, leaving namespaces, links and cgroups behind) the next ``up --real-nodes`` cleans up by
name and brings all three back Ready; ``down`` stops them and leaves nothing of them on the machine.

Serialized with the other tests that use the machine's pod networks:
``flock /tmp/kanri-e2e.lock .venv/bin/pytest tests/integration/test_real_local_up.py -q``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from kanri.cli.main import app
from kanri.local import ControlPlane
from kanri.local.realnode import ZONES, cgroups, network
from kanri.local.realnode import local as realnode_local
from kanri.local.realnode.addons import NetworkPolicyAgent
from kanri.local.realnode.spec import HOST_BRIDGE
from tests.support import eventually

pytestmark = pytest.mark.timeout(180)

CLUSTER = "rl"


@pytest.fixture
def kanri_home(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short ``KANRI_HOME`` (the kubelet's socket paths are bounded); whatever the test leaves is stopped."""
    home = Path(tempfile.mkdtemp(prefix="krl-"))
    monkeypatch.setenv("KANRI_HOME", str(home))
    try:
        yield home
    finally:
        realnode_local.stop(home / "clusters" / CLUSTER)
        ControlPlane(home / "clusters" / CLUSTER).stop()
        shutil.rmtree(home, ignore_errors=True)


def kanri(*args: str) -> Result:
    return CliRunner().invoke(app, ["local", *args, "--name", CLUSTER])


def node_states(cluster_dir: Path) -> dict[str, tuple[str, str]]:
    return {row.name: (row.zone, row.state) for row in realnode_local.rows(cluster_dir)}


def assert_addons_run(cluster_dir: Path) -> None:
    """CoreDNS is applied and is the nodes' cluster DNS; every node's NetworkPolicy agent listens on its queue."""
    admin = cluster_dir / "admin.kubeconfig"
    deployment = subprocess.run(
        ["kubectl", f"--kubeconfig={admin}", "-n", "kube-system", "get", "deployment", "coredns", "-o", "name"],
        capture_output=True,
        text=True,
    )
    assert deployment.stdout.strip() == "deployment.apps/coredns", deployment.stderr
    nodes = realnode_local.saved_nodes(cluster_dir)
    assert {node.cluster_dns for node in nodes} == {"10.96.0.10"}
    assert all(NetworkPolicyAgent(node).listening() for node in nodes)


def crash(cluster_dir: Path) -> None:
    """SIGKILL every process of the cluster, as a power loss would; nothing is cleaned up."""
    pid = ControlPlane(cluster_dir).running_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    for node in realnode_local.saved_nodes(cluster_dir):
        cgroups.kill_all(node.spec.cgroup)

    async def control_plane_gone() -> bool:
        return ControlPlane(cluster_dir).running_pid() is None

    asyncio.run(eventually(control_plane_gone, timeout=20))


def test_up_crash_up_down(kanri_home: Path) -> None:
    cluster_dir = kanri_home / "clusters" / CLUSTER
    running = {f"real-{i}": (ZONES[i], "Running") for i in range(3)}

    up = kanri("up", "--real-nodes")
    assert up.exit_code == 0, up.output
    print(up.output)
    assert node_states(cluster_dir) == running  # still running after `up` returned
    assert_addons_run(cluster_dir)
    listed = kanri("node", "list")
    assert listed.exit_code == 0, listed.output
    assert all(f"real-{i}" in listed.output for i in range(3)), listed.output
    status = kanri("status")
    assert status.exit_code == 0, status.output
    assert "real node real-2 (kanri-c): Running" in status.output, status.output
    stopped = kanri("node", "stop", "real-1")
    assert "now Stopped" in stopped.output, stopped.output
    started = kanri("node", "start", "real-1")  # the node comes back with its NetworkPolicy agent
    assert "start done; now Running" in started.output, started.output
    assert_addons_run(cluster_dir)
    again = kanri("up", "--real-nodes")  # idempotent: nothing restarted
    assert again.exit_code == 0, again.output
    assert "all already running" in again.output, again.output

    crash(cluster_dir)
    assert {state for _, state in node_states(cluster_dir).values()} == {"Stopped"}
    stale = [item for node in realnode_local.saved_nodes(cluster_dir) for item in node.leftovers()]
    assert any(item.startswith("network namespace") for item in stale), stale  # the crash left these

    recovered = kanri("up", "--real-nodes")
    assert recovered.exit_code == 0, recovered.output
    print(recovered.output)
    assert node_states(cluster_dir) == running
    assert all(node.is_ready() for node in realnode_local.saved_nodes(cluster_dir))
    assert_addons_run(cluster_dir)

    down = kanri("down")
    assert down.exit_code == 0, down.output
    assert "left behind" not in down.output, down.output
    assert {state for _, state in node_states(cluster_dir).values()} == {"Stopped"}
    assert [item for node in realnode_local.saved_nodes(cluster_dir) for item in node.leftovers()] == []
    assert ControlPlane(cluster_dir).running_pid() is None
    if not any(Path(f"/sys/class/net/{HOST_BRIDGE}/brif").glob("*")):
        assert network.host_leftovers() == []
