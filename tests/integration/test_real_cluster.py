"""Three real nodes in three zones on the session's control plane (docs/real-nodes.md): pods reach each other across
nodes by address and through a ClusterIP (kube-proxy in each node's namespace), pods reach the API server through the
``kubernetes`` Service, and the real node controller marks a stopped, a frozen and a partitioned node unreachable —
and Ready again once each is started, thawed and healed.

Run alone and serialized with the other tests that use the machine's pod networks:
``flock /tmp/kanri-e2e.lock .venv/bin/pytest tests/integration/test_real_cluster.py -q``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kanri.cli.main import app
from kanri.local.controlplane import Endpoint
from kanri.local.realnode import ZONES, RealCluster, RealNode, chaos, network
from tests.integration.realnode_support import kubectl, pod
from tests.support import NotYet, eventually

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="session")]

ECHO_PORT = 7007
#: A TCP echo server: each connection gets back the line it sent, after the server's host name.
ECHO_SERVER = f"""
import socket, socketserver
class Echo(socketserver.StreamRequestHandler):
    def handle(self):
        self.wfile.write(socket.gethostname().encode() + b" " + self.rfile.readline())
socketserver.ThreadingTCPServer.allow_reuse_address = True
socketserver.ThreadingTCPServer(("", {ECHO_PORT}), Echo).serve_forever()
"""
#: Never evicted from an unreachable node: the fault test checks the same pod before and after.
STAY = {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"}


CLUSTER = "rc"


@pytest.fixture(scope="module")
def kanri_home() -> Iterator[Path]:
    """The module's ``KANRI_HOME``: the nodes live in its cluster ``rc``, where the CLI finds them. Short, unlike
    pytest's temporary paths: the kubelet binds unix sockets (at most 107 bytes) deep in a node's directory."""
    home = Path(tempfile.mkdtemp(prefix="krc-"))
    yield home
    shutil.rmtree(home, ignore_errors=True)


@pytest.fixture(scope="module")
def cluster(control_plane: Endpoint, kanri_home: Path) -> Iterator[RealCluster]:
    data_dir = chaos.real_nodes_dir(kanri_home / "clusters" / CLUSTER)
    nodes = RealCluster(control_plane.kubeconfig.parent, data_dir, prefix="rc", images=("kanri-tools",))
    seconds = nodes.start()
    print(f"three real nodes: start -> Ready in {seconds}")
    try:
        yield nodes
    finally:
        for node in nodes.nodes:
            node.thaw()  # a failed fault test may leave one frozen: stop kills through the freezer anyway
        nodes.stop()
        nodes.deregister()
        assert nodes.leftovers() == []
        assert network.host_leftovers() == []


@pytest.fixture
def kubeconfig(control_plane: Endpoint) -> Path:
    return control_plane.kubeconfig


def image(cluster: RealCluster) -> str:
    return cluster.nodes[0].image("kanri-tools").ref


async def start_pods(kubeconfig: Path, namespace: str, *manifests: dict[str, Any]) -> dict[str, str]:
    """Create the pods and wait until every one runs; their pod IPs by name."""
    for manifest in manifests:
        await kubectl(kubeconfig, "-n", namespace, "create", "-f", "-", "-o", "name", stdin=manifest)

    async def ips() -> dict[str, str] | None:
        listed = json.loads(await kubectl(kubeconfig, "-n", namespace, "get", "pods", "-o", "json"))["items"]
        found = {p["metadata"]["name"]: p["status"].get("podIP") for p in listed if p["status"]["phase"] == "Running"}
        return found if len(found) == len(manifests) and all(found.values()) else None

    result: dict[str, str] = await eventually(ips, timeout=60)
    return result


def echo_pod(name: str, node: RealNode, cluster: RealCluster) -> dict[str, Any]:
    manifest = pod(name, node.spec.name, image(cluster), ["python3", "-c", ECHO_SERVER], restart="Always")
    manifest["metadata"]["labels"] = {"app": "echo"}
    manifest["spec"]["tolerations"] = [STAY]
    return manifest


def client_pod(name: str, node: RealNode, cluster: RealCluster) -> dict[str, Any]:
    return pod(name, node.spec.name, image(cluster), ["sleep", "3600"], restart="Always")


async def echo_through(kubeconfig: Path, namespace: str, client: str, address: str, *, check: bool = True) -> str:
    """What the echo server at ``address`` answers a connection from the pod ``client`` (bash's /dev/tcp) within
    3 s (with ``check`` off, what kubectl said when it did not)."""
    script = f"exec 3<>/dev/tcp/{address}/{ECHO_PORT} && echo hello >&3 && read -r -t 2 line <&3 && echo $line"
    command = ["exec", client, "--", "timeout", "3", "bash", "-c", script]
    return (await kubectl(kubeconfig, "-n", namespace, *command, check=check)).strip()


async def test_three_nodes_register_ready_one_per_zone(cluster: RealCluster, kubeconfig: Path) -> None:
    for node, zone in zip(cluster.nodes, ZONES, strict=True):
        described = json.loads(await kubectl(kubeconfig, "get", "node", node.spec.name, "-o", "json"))
        assert described["metadata"]["labels"]["topology.kubernetes.io/zone"] == zone
        addresses = {a["type"]: a["address"] for a in described["status"]["addresses"]}
        assert addresses["InternalIP"] == node.spec.ip
        ready = next(c for c in described["status"]["conditions"] if c["type"] == "Ready")
        assert ready["status"] == "True", ready
    assert len({node.spec.pod_cidr for node in cluster.nodes}) == 3


async def test_a_pod_reaches_a_pod_on_another_node_by_ip_and_through_a_cluster_ip(
    cluster: RealCluster, kubeconfig: Path, namespace: str
) -> None:
    first, _, last = cluster.nodes
    ips = await start_pods(kubeconfig, namespace, echo_pod("echo", last, cluster), client_pod("client", first, cluster))
    assert ipaddress.ip_address(ips["echo"]) in ipaddress.ip_network(last.spec.pod_cidr), ips
    assert ipaddress.ip_address(ips["client"]) in ipaddress.ip_network(first.spec.pod_cidr), ips
    assert await echo_through(kubeconfig, namespace, "client", ips["echo"]) == "echo hello"

    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "echo"},
        "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": ECHO_PORT}]},
    }
    await kubectl(kubeconfig, "-n", namespace, "create", "-f", "-", "-o", "name", stdin=service)
    cluster_ip = await kubectl(kubeconfig, "-n", namespace, "get", "svc", "echo", "-o", "jsonpath={.spec.clusterIP}")

    async def through_service() -> str | None:  # kube-proxy of node 0 programs the Service when it sees its slice
        out = await kubectl(
            kubeconfig, "-n", namespace, "exec", "client", "--", "timeout", "3", "bash", "-c",
            f"exec 3<>/dev/tcp/{cluster_ip}/80 && echo via-service >&3 && read -r -t 2 line <&3 && echo $line",
            check=False,
        )  # fmt: skip
        return out.strip() if out.strip() == "echo via-service" else None

    await eventually(through_service, timeout=30)


async def test_a_pod_reaches_the_api_server_through_the_kubernetes_service(
    cluster: RealCluster, kubeconfig: Path, namespace: str
) -> None:
    """The pod's own service account token, checked against the cluster CA for the Service's ClusterIP: the
    connection goes pod -> kube-proxy's DNAT in the node -> the host bridge -> the host's DNAT -> the API server."""
    script = """
import json, os, ssl, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
request = urllib.request.Request(f"https://{host}:{port}/version")
request.add_header("Authorization", "Bearer " + open(sa + "/token").read())
context = ssl.create_default_context(cafile=sa + "/ca.crt")
print(host, json.load(urllib.request.urlopen(request, context=context, timeout=5))["gitVersion"])
"""
    manifest = pod("api", cluster.nodes[1].spec.name, image(cluster), ["python3", "-c", script])

    async def answered() -> str | None:
        await kubectl(kubeconfig, "-n", namespace, "delete", "pod", "api", "--ignore-not-found", "--wait=true")
        await kubectl(kubeconfig, "-n", namespace, "create", "-f", "-", stdin=manifest)

        async def finished() -> str | None:
            status = json.loads(await kubectl(kubeconfig, "-n", namespace, "get", "pod", "api", "-o", "json"))
            return status["status"]["phase"] if status["status"]["phase"] in {"Succeeded", "Failed"} else None

        phase = await eventually(finished, timeout=30)
        logs = await kubectl(kubeconfig, "-n", namespace, "logs", "api")
        return logs if phase == "Succeeded" else None

    logs = await eventually(answered, timeout=60)
    service_ip, version = logs.split()
    kubernetes = await kubectl(
        kubeconfig, "-n", "default", "get", "svc", "kubernetes", "-o", "jsonpath={.spec.clusterIP}"
    )
    assert service_ip == kubernetes, logs
    assert version == json.loads(await kubectl(kubeconfig, "get", "--raw", "/version"))["gitVersion"], logs


def node_state(described: dict[str, Any]) -> tuple[str, bool]:
    """The Node's Ready status and whether it carries the ``unreachable`` NoExecute taint."""
    ready = next(c for c in described["status"]["conditions"] if c["type"] == "Ready")["status"]
    taints = described["spec"].get("taints") or []
    unreachable = any(t["key"] == "node.kubernetes.io/unreachable" and t["effect"] == "NoExecute" for t in taints)
    return ready, unreachable


async def wait_nodes(kubeconfig: Path, want: dict[str, tuple[str, bool]], timeout: float) -> None:
    """Wait until each node's (Ready status, unreachable taint) is the one ``want`` names; the failure says what
    was seen."""
    seen: dict[str, tuple[str, bool]] = {}

    async def check() -> bool:
        listed = json.loads(await kubectl(kubeconfig, "get", "nodes", "-o", "json"))["items"]
        seen.update({n["metadata"]["name"]: node_state(n) for n in listed if n["metadata"]["name"] in want})
        return seen == want

    try:
        await eventually(check, timeout=timeout, interval=0.5)
    except NotYet:
        raise AssertionError(f"nodes not {want} after {timeout} s: {seen}") from None


async def host_echo(address: str) -> str | None:
    """The echo server's answer to a connection from the host (None: unreachable within 2 s)."""
    try:
        async with asyncio.timeout(2):
            reader, writer = await asyncio.open_connection(address, ECHO_PORT)
            writer.write(b"from-host\n")
            line = await reader.readline()
            writer.close()
    except (OSError, TimeoutError):
        return None
    return line.decode().strip()


READY, UNREACHABLE = ("True", False), ("Unknown", True)


async def test_a_stopped_and_a_partitioned_node_are_unreachable_to_the_node_controller_until_they_recover(
    cluster: RealCluster, kubeconfig: Path, namespace: str
) -> None:
    """Two zones fail at once, one stays healthy: with every zone down the node controller would assume its own
    connectivity is broken and taint nothing (its "full disruption" mode)."""
    healthy, stopped, partitioned = cluster.nodes
    ips = await start_pods(
        kubeconfig, namespace, echo_pod("echo", partitioned, cluster), client_pod("client", healthy, cluster)
    )
    assert await echo_through(kubeconfig, namespace, "client", ips["echo"]) == "echo hello"
    assert await host_echo(ips["echo"]) == "echo from-host"  # the host routes to node 2's pods

    fault = time.monotonic()
    partitioned.partition()
    await asyncio.to_thread(stopped.stop)
    # cut from the other nodes and from the host, where the control plane runs
    assert await echo_through(kubeconfig, namespace, "client", ips["echo"], check=False) != "echo hello"
    assert await host_echo(ips["echo"]) is None
    names = [node.spec.name for node in cluster.nodes]
    try:
        await wait_nodes(kubeconfig, dict(zip(names, (READY, UNREACHABLE, UNREACHABLE), strict=True)), timeout=60)
    finally:
        partitioned.heal()
    print(f"stop and partition -> Unknown + unreachable taint: {time.monotonic() - fault:.1f} s")

    recovery = time.monotonic()
    await asyncio.to_thread(stopped.start)
    await wait_nodes(kubeconfig, dict.fromkeys(names, READY), timeout=90)
    print(f"heal and start -> Ready, untainted: {time.monotonic() - recovery:.1f} s")
    assert await echo_through(kubeconfig, namespace, "client", ips["echo"]) == "echo hello"


async def test_the_cli_chaos_verbs_find_a_real_node_by_name(
    cluster: RealCluster, kanri_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KANRI_HOME", str(kanri_home))
    node = cluster.nodes[0]

    async def cli(verb: str) -> str:
        argv = ["local", "node", verb, node.spec.name, "--name", CLUSTER]
        result = await asyncio.to_thread(CliRunner().invoke, app, argv)
        assert result.exit_code == 0, result.output
        return " ".join(result.output.split())

    assert await cli("partition") == "rc-0: partition done; now Running, Partitioned"
    assert node.is_partitioned()
    assert await cli("partition") == "rc-0: partition nothing to do; now Running, Partitioned"
    assert await cli("heal") == "rc-0: heal done; now Running"
    assert not node.is_partitioned()
    assert await cli("freeze") == "rc-0: freeze done; now Running, Frozen"
    assert node.is_frozen()
    assert await cli("thaw") == "rc-0: thaw done; now Running"
    assert await cli("stop") == "rc-0: stop done; now Stopped"
    assert node.pids() == set()
    assert await cli("stop") == "rc-0: stop nothing to do; now Stopped"
    assert await cli("start") == "rc-0: start done; now Running"  # returns once the kubelet reported Ready
    assert node.is_ready()
