"""The real kube-proxy (nftables mode) behind the local node's ClusterIPs, with real pods on the test pod network:
Services reached from a pod and from the host, the ``kubernetes`` Service and DNS from a pod, endpoints that change,
the guard that drops traffic leaving the pod network, the fallback, and nothing left after the node stops."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import secrets
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from structlog.testing import capture_logs

from kanri.local import Endpoint
from kanri.local.node import LocalNode, NodeOptions, log_path
from kanri.local.node.kubeproxy import BRIDGE_NF_CALL, IP_FORWARD, guard_table, leftovers
from kanri.local.node.services import ServiceProxy
from kanri.runtime import ApiError, Client, Manager, ManagerOptions, get_condition
from kanri.runtime.kinds import POD, SERVICE
from tests.local_node_support import running_node, with_kube_proxy, with_test_network
from tests.support import eventually

Obj = dict[str, Any]

PYTHON = "/usr/bin/python3"  # containers run as other users, who cannot enter /root (where pyenv lives)
HTTP = "kanri.dev/test/http:1"
SHELL = "kanri.dev/test/sh:1"
IMAGES = [
    # Serves the pod's own /etc: /hostname names the pod that answered.
    {"image": HTTP, "command": [PYTHON, "-m", "http.server", "8080", "--directory", "/etc"]},
    {"image": SHELL, "command": ["/bin/sh", "-c"]},
]


def node_options(tmp_path: Path) -> NodeOptions:
    return with_test_network(
        NodeOptions(data_dir=tmp_path / "node", name=f"test-kp-{secrets.token_hex(3)}", images=IMAGES)
    )


@pytest_asyncio.fixture(loop_scope="session")
async def node(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[LocalNode]:
    async with running_node(control_plane.kubeconfig, node_options(tmp_path)) as local:
        yield local


def web_pod(namespace: str, name: str) -> Obj:
    return {
        "metadata": {"name": name, "namespace": namespace, "labels": {"app": "web"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsUser": 65534},
            "containers": [
                {
                    "name": "web",
                    "image": HTTP,
                    "ports": [{"name": "http", "containerPort": 8080}],
                    "readinessProbe": {"tcpSocket": {"port": "http"}, "periodSeconds": 1},
                }
            ],
        },
    }


def web_service(namespace: str) -> Obj:
    return {
        "metadata": {"name": "web", "namespace": namespace},
        "spec": {"selector": {"app": "web"}, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }


def script_pod(namespace: str, name: str, code: str) -> Obj:
    """A pod that runs ``code`` with Python once and exits; its output is in its log."""
    quoted = "'" + code.replace("'", "'\"'\"'") + "'"
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "main", "image": SHELL, "args": [f"{PYTHON} -c {quoted}"]}],
        },
    }


async def run_in_pod(client: Client, node: LocalNode, namespace: str, name: str, code: str) -> tuple[str, str]:
    """Run ``code`` in a new pod; its phase (Succeeded or Failed) and output."""
    await client.create(POD, script_pod(namespace, name, code))

    async def finished() -> Obj | None:
        pod = await client.get(POD, name, namespace)
        return pod if pod.get("status", {}).get("phase") in ("Succeeded", "Failed") else None

    pod = await eventually(finished, timeout=60)
    meta = pod["metadata"]
    output = log_path(node.options.data_dir, namespace, name, meta["uid"], "main", 0).read_text()
    return pod["status"]["phase"], output


async def ready_pod_ips(client: Client, namespace: str) -> dict[str, str]:
    pods = (await client.list(POD, namespace, label_selector="app=web"))[0]
    return {
        p["status"]["podIP"]: p["metadata"]["name"]
        for p in pods
        if (c := get_condition(p.get("status", {}).get("conditions"), "Ready")) and c["status"] == "True"
    }


async def http_get(ip: str, port: int, path: str) -> str:
    """The body of ``GET path`` from the host (raises on a refused or hung connection)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), 5)
    try:
        writer.write(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        response = (await asyncio.wait_for(reader.read(), 10)).decode()
    finally:
        writer.close()
    head, _, body = response.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.0 200"), head
    return body.strip()


async def answering(ip: str, port: int, tries: int = 12) -> Counter[str] | None:
    """Which pods answer ``tries`` requests to the ClusterIP (None while a request fails)."""
    seen: Counter[str] = Counter()
    for _ in range(tries):
        try:
            seen[await http_get(ip, port, "/hostname")] += 1
        except (OSError, TimeoutError, AssertionError):
            return None
    return seen


def nft_list(*args: str) -> str:
    return subprocess.run(["nft", *args], capture_output=True, text=True, check=False).stdout


async def test_service_is_reached_through_kube_proxy_from_the_host_and_a_pod_and_follows_its_endpoints(
    client: Client, node: LocalNode, namespace: str
) -> None:
    assert node.host.proxy is not None
    assert node.host.proxy.mode == "nftables"
    await client.create(POD, web_pod(namespace, "web-a"))
    await client.create(POD, web_pod(namespace, "web-b"))
    service = await client.create(SERVICE, web_service(namespace))
    ip = service["spec"]["clusterIP"]
    pods = await eventually(lambda: _two(ready_pod_ips(client, namespace)), timeout=90, interval=0.5)

    # kube-proxy programmed the ClusterIP (no address on any link, no userspace listener: the DNAT does it).
    await eventually(lambda: asyncio.sleep(0, ip in nft_list("list", "map", "ip", "kube-proxy", "service-ips")))
    assert not node.host.proxy.listening()
    # From the host: both pods answer, in turn.
    seen = await eventually(lambda: _both(answering(ip, 80)), timeout=30)
    assert set(seen) == {"web-a", "web-b"}, seen

    # From a pod, by name (the cluster DNS through its ClusterIP, then the Service's ClusterIP).
    fetch = "import urllib.request; print(urllib.request.urlopen('http://web/hostname', timeout=5).read().decode())"
    phase, output = await run_in_pod(client, node, namespace, "fetch", fetch)
    assert phase == "Succeeded", output
    assert output.strip() in {"web-a", "web-b"}, output

    # One pod deleted: once its endpoint is gone, every new connection goes to the other.
    await client.delete(POD, "web-a", namespace)
    await eventually(lambda: _gone(client, namespace, "web-a"), timeout=30)
    assert set(pods.values()) == {"web-a", "web-b"}

    async def only_b() -> bool:
        seen = await answering(ip, 80)
        return seen is not None and set(seen) == {"web-b"}

    await eventually(only_b, timeout=30)


async def _gone(client: Client, namespace: str, name: str) -> bool:
    try:
        await client.get(POD, name, namespace)
    except ApiError as exc:
        if exc.status == 404:
            return True
        raise
    return False


async def _two(found: Any) -> dict[str, str] | None:
    pods: dict[str, str] = await found
    return pods if len(pods) == 2 else None


async def _both(found: Any) -> Counter[str] | None:
    seen: Counter[str] | None = await found
    return seen if seen is not None and len(seen) == 2 else None


async def test_a_pod_reaches_the_api_server_through_the_kubernetes_service_and_resolves_names(
    client: Client, node: LocalNode, namespace: str
) -> None:
    api_ip = (await client.get(SERVICE, "kubernetes", "default"))["spec"]["clusterIP"]
    code = (
        "import socket, ssl, urllib.request\n"
        "print(socket.gethostbyname('kubernetes.default.svc.cluster.local'))\n"
        "print(socket.gethostbyname('kube-dns.kube-system'))\n"
        "context = ssl.create_default_context(); context.check_hostname = False; context.verify_mode = ssl.CERT_NONE\n"
        "print(urllib.request.urlopen('https://kubernetes.default.svc/readyz', timeout=10, context=context).read()"
        ".decode())\n"
    )
    phase, output = await run_in_pod(client, node, namespace, "api", code)
    assert phase == "Succeeded", output
    assert output.split() == [api_ip, node.options.cluster_dns_ip, "ok"], output
    # The kubernetes Service's endpoint is the bridge's address (a forwarder passes it on to 127.0.0.1).
    assert node.host.dns is not None
    assert node.host.dns.bound == (node.host.options.internal_ip, 53)


async def test_forwarded_traffic_leaving_the_pod_network_is_dropped(
    client: Client, node: LocalNode, namespace: str
) -> None:
    table = guard_table(node.options)

    def drops() -> int:
        listing = nft_list("list", "table", "ip", table)
        line = next(line for line in listing.splitlines() if "pods reach only pods and services" in line)
        return int(line.split("packets ")[1].split()[0])

    before = drops()
    # TEST-NET-2: an address outside the machine; without our rule the packet would be routed out of the host.
    code = (
        "import socket\n"
        "try:\n"
        "    socket.create_connection(('198.51.100.7', 80), timeout=3)\n"
        "    print('connected')\n"
        "except OSError as exc:\n"
        "    print('refused', type(exc).__name__)\n"
    )
    phase, output = await run_in_pod(client, node, namespace, "escape", code)
    assert phase == "Succeeded", output
    assert output.startswith("refused"), output
    assert drops() > before


async def test_kube_proxy_leaves_nothing_and_puts_the_sysctls_back(control_plane: Endpoint, tmp_path: Path) -> None:
    options = node_options(tmp_path)
    forward_before = IP_FORWARD.read_text().strip()
    async with running_node(control_plane.kubeconfig, options) as local:
        assert local.host.proxy is not None
        assert local.host.proxy.kube_proxy is not None
        pid = local.host.proxy.kube_proxy.pid
        assert pid is not None
        assert set(leftovers(options)) == {
            "nft table ip kube-proxy",
            f"nft table ip {guard_table(options)}",
            f"kube-proxy process {pid}",
        } | ({"nft table ip6 kube-proxy"} if "ip6 kube-proxy" in nft_list("list", "tables") else set())
        assert IP_FORWARD.read_text().strip() == "1"
        assert BRIDGE_NF_CALL.read_text().strip() == "1"
    assert leftovers(options) == []
    assert IP_FORWARD.read_text().strip() == forward_before
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_without_nft_the_userspace_proxy_serves_and_says_so_once(
    control_plane: Endpoint, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    options = with_kube_proxy(node_options(tmp_path), control_plane.kubeconfig)
    options = dataclasses.replace(options, service_link="kanri-svcf")
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        manager = Manager(client, ManagerOptions(name="kp-fallback", leader_election=False, health_port=None))
        proxy = ServiceProxy(manager.cache, options, client)
        with capture_logs() as logs, monkeypatch.context() as patch:
            patch.setenv("PATH", "/nonexistent")  # no nft: the kernel side cannot be programmed
            await proxy.start()
        try:
            assert proxy.mode == "userspace"
            refusals = [e for e in logs if e["log_level"] == "warning"]
            assert len(refusals) == 1, logs
            assert "falling back to the userspace service proxy" in refusals[0]["event"]
            assert "nft is not installed" in refusals[0]["reason"]
            assert leftovers(options) == []
        finally:
            await proxy.close()
