"""``kanri local up --real-nodes`` end to end (docs/real-nodes.md, issue 27): the control plane, three real nodes
in three zones and the local-path provisioner come up and keep running after the command returns; a claim that
names no StorageClass gets a local-path volume a pod writes to, and ``kanri local port-forward`` reaches a pod's
HTTP server from the host through the real kubelet; after every process of the cluster is SIGKILLed (a host
crash, leaving namespaces, links and cgroups behind) the next ``up --real-nodes`` cleans up by name and brings all
three nodes back Ready and the provisioner back; ``down`` stops them and leaves nothing of them on the machine.

Serialized with the other tests that use the machine's pod networks:
``flock /tmp/kanri-e2e.lock .venv/bin/pytest tests/integration/test_real_local_up.py -q``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from kanri.cli.main import app
from kanri.local import ControlPlane
from kanri.local.realnode import ZONES, cgroups, network
from kanri.local.realnode import local as realnode_local
from kanri.local.realnode.addons import LocalPathProvisioner, NetworkPolicyAgent, cluster_dns_ip
from kanri.local.realnode.addons.localpath import STORAGE_CLASS
from kanri.local.realnode.spec import HOST_BRIDGE
from kanri.local.registry import LocalRegistry
from tests.integration.realnode_support import http_get
from tests.support import eventually

pytestmark = pytest.mark.timeout(360)

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
        LocalRegistry(home / "clusters" / CLUSTER).stop()
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
    service_cidr = json.loads((cluster_dir / "config.json").read_text())["serviceCIDR"]  # make test: 10.97.0.0/16
    assert {node.cluster_dns for node in nodes} == {cluster_dns_ip(service_cidr)}  # the range's tenth address
    assert all(NetworkPolicyAgent(node).listening() for node in nodes)


def assert_nodes_pull_from_the_registry(cluster_dir: Path) -> None:
    """The cluster's registry runs, and every node's containerd is told to pull ``kanri.local`` images from its port
    (the pull itself: tests/integration/test_real_node.py)."""
    registry = LocalRegistry(cluster_dir)
    assert registry.is_ready(), registry.log_tail()
    port = int(registry.address.rsplit(":", 1)[1])
    for node in realnode_local.saved_nodes(cluster_dir):
        assert node.registry is not None, node.spec.name
        assert node.registry.port == port, (node.registry, port)
        hosts = (node.layout.registry_hosts / "kanri.local" / "hosts.toml").read_text()
        assert f"https://10.250.0.1:{port}/v2/kanri" in hosts, hosts


def provisioner(cluster_dir: Path) -> LocalPathProvisioner:
    return realnode_local.provisioner(cluster_dir, cluster_dir)


def kubectl(cluster_dir: Path, *args: str, stdin: str | None = None) -> str:
    admin = cluster_dir / "admin.kubeconfig"
    done = subprocess.run(["kubectl", f"--kubeconfig={admin}", *args], input=stdin, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


WEB = {"app": "web"}


def web_objects(image: str) -> list[dict[str, Any]]:
    """A claim naming no StorageClass, a pod that writes a file into it and serves it over HTTP (8080), and a
    Service for the pod (port 80)."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "16Mi"}}},
    }
    serve = "echo written through local-path > /data/proof && exec python3 -m http.server 8080 --directory /data"
    container = {
        "name": "web",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["bash", "-c", serve],
        "ports": [{"containerPort": 8080}],
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "web", "labels": WEB},
        "spec": {
            "containers": [container],
            "terminationGracePeriodSeconds": 1,
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": WEB, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    return [claim, pod, service]


def assert_volume_bound_and_written(cluster_dir: Path) -> None:
    """The claim got the default class, a volume in its node's directory, and the pod's file is in it."""
    image = realnode_local.saved_nodes(cluster_dir)[0].image("kanri-tools").ref
    for manifest in web_objects(image):
        kubectl(cluster_dir, "create", "-f", "-", stdin=json.dumps(manifest))

    async def serving() -> dict[str, Any] | None:
        pod = json.loads(await asyncio.to_thread(kubectl, cluster_dir, "get", "pod", "web", "-o", "json"))
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))
        return pod if ready else None

    pod = asyncio.run(eventually(serving, timeout=90))
    claim = json.loads(kubectl(cluster_dir, "get", "pvc", "data", "-o", "json"))
    assert claim["status"]["phase"] == "Bound", claim["status"]
    assert claim["spec"]["storageClassName"] == STORAGE_CLASS, claim["spec"]  # the default class, given at create
    volume = json.loads(kubectl(cluster_dir, "get", "pv", claim["spec"]["volumeName"], "-o", "json"))
    path = Path(volume["spec"]["hostPath"]["path"])
    nodes = {node.spec.name: node for node in realnode_local.saved_nodes(cluster_dir)}
    node_dir = nodes[pod["spec"]["nodeName"]].layout.root
    assert path.parent == node_dir / realnode_local.VOLUMES_DIR, (path, node_dir)
    assert (path / "proof").read_text() == "written through local-path\n"


async def _get_through(resource: str, ports: str) -> bytes:
    """``GET /proof`` through ``kanri local port-forward RESOURCE PORTS`` (a process of its own: it serves until
    interrupted); the forward is interrupted (Ctrl-C) afterwards."""
    forward = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kanri.cli.main", "local", "port-forward", resource, ports, "--name", CLUSTER,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, preexec_fn=_interruptible,
    )  # fmt: skip
    assert forward.stdout is not None
    assert forward.stderr is not None
    try:
        async with asyncio.timeout(60):
            line = (await forward.stdout.readline()).decode()  # kubectl's "Forwarding from 127.0.0.1:PORT -> 8080"
        if not line:  # it ended: say why
            raise AssertionError(f"the port-forward ended: {(await forward.stderr.read()).decode()}")
        port = int(line.split("127.0.0.1:")[1].split()[0])

        return await http_get(port, "/proof")
    finally:
        forward.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(forward.wait(), 60)
        except TimeoutError:
            ps = ["ps", "-o", "pid,ppid,stat,etime,args", "--ppid", str(forward.pid), "-p", str(forward.pid)]
            left = (await asyncio.to_thread(subprocess.run, ps, capture_output=True, text=True)).stdout
            forward.kill()
            raise AssertionError(f"the port-forward did not end within 60 s of Ctrl-C:\n{left}") from None


def _interruptible() -> None:
    """Ctrl-C as in a terminal: a test run in the background of a non-interactive shell (CI's `make test` runs its
    two pytest processes with `&`) has SIGINT ignored, which its children inherit — Python then installs no
    KeyboardInterrupt handler and the forward would never see the test's Ctrl-C (seen in a CI replica)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def assert_port_forward_reaches_the_pod(cluster_dir: Path) -> None:
    """Forwards to the Service (its port, 80, the default; kubectl maps it to the pod's 8080) and to the pod, and
    no kubectl is left once they are interrupted."""

    async def both() -> tuple[bytes, bytes]:  # at once: each forward's start is mostly the CLI's imports
        return await asyncio.gather(_get_through("svc/web", "0"), _get_through("pod/web", "0:8080"))

    for response in asyncio.run(both()):
        assert response.endswith(b"written through local-path\n"), response

    async def no_forward_left() -> bool:
        return not await asyncio.to_thread(_forwards, cluster_dir)

    asyncio.run(eventually(no_forward_left, timeout=20))


def _forwards(cluster_dir: Path) -> list[bytes]:
    """The command lines of the ``kubectl port-forward`` processes running against the cluster."""
    admin = f"--kubeconfig={cluster_dir / 'admin.kubeconfig'}".encode()
    found = []
    for path in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = path.read_bytes()
        except OSError:  # ended meanwhile
            continue
        if admin in argv and b"port-forward" in argv:
            found.append(argv)
    return found


def assert_main_job_runs(cluster_dir: Path) -> None:
    """``kanri up --real-nodes`` on the running nodes: the operator as a pod from its image, the object store, and
    ``examples/postgrescluster.yaml`` Ready with its WAL archived; ``kanri psql`` then sees both replicas stream."""
    main_job = CliRunner().invoke(app, ["up", "--real-nodes", "--name", CLUSTER, "--timeout", "240"])
    assert main_job.exit_code == 0, main_job.output
    assert "orders is Ready" in main_job.output, main_job.output
    assert "ContinuousArchiving=True" in main_job.output, main_job.output
    pods = json.loads(kubectl(cluster_dir, "get", "pods", "-A", "-o", "json"))["items"]
    images = {c["image"] for p in pods for c in p["spec"]["containers"]}
    assert {"kanri.local/kanri-operator:0.1.0", "kanri.local/kanri-postgres:15"} <= images, images
    psql = subprocess.run(
        [sys.executable, "-m", "kanri.cli.main", "psql", "orders", "-n", "default", "--kubeconfig",
         str(cluster_dir / "admin.kubeconfig"), "--superuser", "--", "-Atc",
         "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert psql.returncode == 0, psql.stdout + psql.stderr
    assert psql.stdout.split() == ["2"], psql.stdout + psql.stderr


def crash(cluster_dir: Path) -> None:
    """SIGKILL every process of the cluster, as a power loss would; nothing is cleaned up."""
    pid = ControlPlane(cluster_dir).running_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    for node in realnode_local.saved_nodes(cluster_dir):
        cgroups.kill_all(node.spec.cgroup)
    for provisioner_pid in provisioner(cluster_dir).pids():
        os.kill(provisioner_pid, signal.SIGKILL)
    registry = LocalRegistry(cluster_dir).running_pid()
    assert registry is not None
    os.kill(registry, signal.SIGKILL)

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
    assert_nodes_pull_from_the_registry(cluster_dir)
    assert "local-path provisioner (default StorageClass local-path): started" in up.output, up.output
    provisioner_pids = provisioner(cluster_dir).pids()
    assert len(provisioner_pids) == 1, provisioner_pids
    began = time.monotonic()
    assert_volume_bound_and_written(cluster_dir)
    print(f"claim with no class -> bound, pod serving: {time.monotonic() - began:.1f} s")
    began = time.monotonic()
    assert_port_forward_reaches_the_pod(cluster_dir)
    print(f"two port-forwards at once, each answered and interrupted: {time.monotonic() - began:.1f} s")
    began = time.monotonic()
    assert_main_job_runs(cluster_dir)
    print(f"kanri up --real-nodes (images imported, operator pod, object store, orders Ready, psql): "
          f"{time.monotonic() - began:.1f} s")  # fmt: skip
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
    assert "local-path provisioner (default StorageClass local-path): already running" in again.output
    assert provisioner(cluster_dir).pids() == provisioner_pids

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
    assert_nodes_pull_from_the_registry(cluster_dir)  # the registry back on its port: the nodes' hosts.toml holds
    assert "local-path provisioner (default StorageClass local-path): started" in recovered.output
    assert len(provisioner(cluster_dir).pids()) == 1

    down = kanri("down")
    assert down.exit_code == 0, down.output
    assert "left behind" not in down.output, down.output
    assert {state for _, state in node_states(cluster_dir).values()} == {"Stopped"}
    assert [item for node in realnode_local.saved_nodes(cluster_dir) for item in node.leftovers()] == []
    assert ControlPlane(cluster_dir).running_pid() is None
    assert LocalRegistry(cluster_dir).running_pid() is None
    assert provisioner(cluster_dir).leftovers() == []
    if not any(Path(f"/sys/class/net/{HOST_BRIDGE}/brif").glob("*")):
        assert network.host_leftovers() == []
