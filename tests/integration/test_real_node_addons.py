"""The cluster add-ons on a real node (docs/real-nodes.md, "Add-ons"): CoreDNS from an image built here answers
Kubernetes names, and kube-network-policies enforces NetworkPolicies in the node's network namespace.

One node for the module on the session's control plane. Run it serialized with the other tests that use the
machine's pod networks: ``flock /tmp/kanri-e2e.lock .venv/bin/pytest tests/integration/test_real_node_addons.py -q``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kanri.local.controlplane import Endpoint
from kanri.local.realnode import NodeSpec, RealNode
from kanri.local.realnode.addons import ClusterDNS, NetworkPolicyAgent, coredns_image, install_coredns
from kanri.local.realnode.addons.coredns import NAMESPACE as DNS_NAMESPACE
from kanri.local.realnode.addons.coredns import cluster_dns_ip
from kanri.local.realnode.addons.localpath import STORAGE_CLASS, LocalPathProvisioner
from kanri.local.realnode.node import node_bin_dir
from tests.integration.realnode_support import kubectl, pod
from tests.support import NotYet, eventually

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="session")]

NODE = "addons-node-a"

#: A DNS client in the tools image's Python: one A query per name to SERVER:PORT, printed as JSON
#: ``{name: {"rcode": n, "addresses": [...]}}`` (rcode 3 is NXDOMAIN).
DNS_QUERY = r"""
import json, socket, struct, sys
def query(server, port, name):
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    packet = struct.pack(">6H", 0x4B41, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack(">2H", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(5)
        s.sendto(packet, (server, port))
        data = s.recv(4096)
    i = 12
    while data[i]:
        i += data[i] + 1
    i += 5
    addresses = []
    for _ in range(struct.unpack(">H", data[6:8])[0]):
        if data[i] & 0xC0 == 0xC0:
            i += 2
        else:
            while data[i]:
                i += data[i] + 1
            i += 1
        rtype, _, _, length = struct.unpack(">HHIH", data[i:i + 10])
        i += 10
        if rtype == 1:
            addresses.append(socket.inet_ntoa(data[i:i + length]))
        i += length
    return {"rcode": data[3] & 15, "addresses": addresses}
print(json.dumps({name: query(sys.argv[1], int(sys.argv[2]), name) for name in sys.argv[3:]}))
"""

#: Prints ``reached PORT`` when a TCP connection to HOST:PORT opens within 2 s (a traceback otherwise).
CONNECT = (
    "import socket, sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2); "
    "print('reached %s' % sys.argv[2])"
)


@pytest.fixture(scope="module")
def addons_node(control_plane: Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    """A real node with the tools image and the CoreDNS image built here."""
    work = tmp_path_factory.mktemp("addons-node")
    control_plane_config = json.loads((control_plane.kubeconfig.parent / "config.json").read_text())
    node = RealNode(
        NodeSpec(NODE, "zone-a", 0),
        work / "node",
        control_plane.kubeconfig.parent,
        images=("kanri-tools",),
        extra_layouts=(coredns_image(node_bin_dir(), work / "coredns"),),
        cluster_dns=cluster_dns_ip(control_plane_config["serviceCIDR"]),  # the kubelet's clusterDNS
    )
    print(f"real node {NODE}: start -> Ready in {node.start():.1f} s")
    try:
        yield node
    finally:
        node.stop()
        node.deregister()
        assert node.leftovers() == []


@pytest.fixture(scope="module")
def cluster_dns(addons_node: RealNode) -> Iterator[ClusterDNS]:
    yield install_coredns(addons_node.control_plane_dir, node_bin_dir(), {"kubernetes.io/hostname": NODE})
    # the session's control plane outlives the module: later tests (the home-made node's DNS) make their own kube-dns
    admin = addons_node.admin_kubeconfig
    for kind in ("deployment/coredns", "service/kube-dns", "configmap/coredns"):
        subprocess.run(["kubectl", f"--kubeconfig={admin}", "-n", DNS_NAMESPACE, "delete", kind], check=True)


@pytest.fixture(scope="module")
def policy_agent(addons_node: RealNode) -> Iterator[NetworkPolicyAgent]:
    agent = NetworkPolicyAgent(addons_node)
    agent.start()
    try:
        yield agent
    finally:
        agent.stop()
        assert not agent.chain_installed()
        assert not agent.listening()


@pytest.fixture(scope="module")
def volumes_dir(addons_node: RealNode) -> Path:
    return addons_node.layout.root / "local-path"


@pytest.fixture(scope="module")
def provisioner(addons_node: RealNode, volumes_dir: Path) -> Iterator[LocalPathProvisioner]:
    work = addons_node.layout.root.parent / "local-path-provisioner"
    paths = {NODE: str(volumes_dir)}
    provisioner = LocalPathProvisioner(addons_node.control_plane_dir, work, node_bin_dir(), paths, tools(addons_node))
    provisioner.start()
    try:
        yield provisioner
    finally:
        provisioner.stop()


@pytest.fixture
def kubeconfig(control_plane: Endpoint) -> Path:
    return control_plane.kubeconfig


def tools(node: RealNode) -> str:
    return node.image("kanri-tools").ref


async def create(kubeconfig: Path, namespace: str, manifest: dict[str, Any]) -> None:
    await kubectl(kubeconfig, "-n", namespace, "create", "-f", "-", "-o", "name", stdin=manifest)


async def get(kubeconfig: Path, namespace: str, kind: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(await kubectl(kubeconfig, "-n", namespace, "get", kind, name, "-o", "json"))
    return result


async def ready_pod_ip(kubeconfig: Path, namespace: str, selector: str) -> str:
    """The address of the Ready pod ``selector`` picks, once there is one (else the pods and Events seen last)."""

    async def check() -> str | None:
        pods = json.loads(await kubectl(kubeconfig, "-n", namespace, "get", "pods", "-l", selector, "-o", "json"))
        for item in pods["items"]:
            conditions = {c["type"]: c["status"] for c in item["status"].get("conditions", [])}
            if conditions.get("Ready") == "True":
                return str(item["status"]["podIP"])
        return None

    try:
        return await eventually(check, timeout=90)
    except NotYet as exc:
        pods = await kubectl(kubeconfig, "-n", namespace, "get", "pods", "-l", selector, "-o", "wide")
        events = await kubectl(kubeconfig, "-n", namespace, "get", "events", "--sort-by=.lastTimestamp")
        raise AssertionError(f"{exc}\n{pods}\n{events[-3000:]}") from None


async def logs_of_finished(kubeconfig: Path, namespace: str, name: str) -> str:
    async def check() -> dict[str, Any] | None:
        status = (await get(kubeconfig, namespace, "pod", name))["status"]
        return status if status.get("phase") in ("Succeeded", "Failed") else None

    status = await eventually(check, timeout=90)
    out = await kubectl(kubeconfig, "-n", namespace, "logs", name)
    assert status["phase"] == "Succeeded", (status, out)
    return out


async def test_coredns_answers_cluster_names_on_its_pod_address(
    addons_node: RealNode, cluster_dns: ClusterDNS, kubeconfig: Path, namespace: str
) -> None:
    server = await ready_pod_ip(kubeconfig, DNS_NAMESPACE, "k8s-app=kube-dns")
    assert ipaddress.ip_address(server) in ipaddress.ip_network(addons_node.spec.pod_cidr)  # the pod network
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }
    await create(kubeconfig, namespace, service)
    web_ip = (await get(kubeconfig, namespace, "service", "web"))["spec"]["clusterIP"]
    kubernetes_ip = (await get(kubeconfig, "default", "service", "kubernetes"))["spec"]["clusterIP"]
    dns_service = await get(kubeconfig, DNS_NAMESPACE, "service", "kube-dns")
    assert dns_service["spec"]["clusterIP"] == cluster_dns.cluster_ip

    names = [
        "kubernetes.default.svc.cluster.local",
        f"web.{namespace}.svc.cluster.local",
        "absent.default.svc.cluster.local",
    ]
    command = ["python3", "-c", DNS_QUERY, server, str(cluster_dns.pod_port), *names]
    await create(kubeconfig, namespace, pod("resolver", NODE, tools(addons_node), command))
    answers = json.loads(await logs_of_finished(kubeconfig, namespace, "resolver"))
    assert answers[names[0]] == {"rcode": 0, "addresses": [kubernetes_ip]}, answers
    assert answers[names[1]] == {"rcode": 0, "addresses": [web_ip]}, answers
    assert answers[names[2]]["rcode"] == 3, answers  # NXDOMAIN: the answers come from the API, not a wildcard


async def test_pods_resolve_names_through_the_kube_dns_cluster_ip(
    addons_node: RealNode, cluster_dns: ClusterDNS, kubeconfig: Path, namespace: str
) -> None:
    """The pod's resolv.conf (the kubelet's clusterDNS and search path) -> kube-proxy's DNAT of the ClusterIP's
    port 53 -> CoreDNS on its pod's port: glibc's resolver, as any program in a pod uses it."""
    await ready_pod_ip(kubeconfig, DNS_NAMESPACE, "k8s-app=kube-dns")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]},
    }
    await create(kubeconfig, namespace, service)
    web_ip = (await get(kubeconfig, namespace, "service", "web"))["spec"]["clusterIP"]
    kubernetes_ip = (await get(kubeconfig, "default", "service", "kubernetes"))["spec"]["clusterIP"]
    # Until kube-proxy has programmed the kube-dns ClusterIP the resolver fails: the pod asks again (45 s deadline).
    lookup = (
        "import socket, sys, time\n"
        "deadline = time.monotonic() + 45\n"
        "while True:\n"
        "    try:\n"
        "        print(' '.join(socket.gethostbyname(name) for name in sys.argv[1:]))\n"
        "        break\n"
        "    except socket.gaierror:\n"
        "        if time.monotonic() > deadline:\n"
        "            raise\n"
        "        time.sleep(0.5)\n"
    )
    names = ["kubernetes.default", "web"]  # completed by the search path the kubelet wrote
    resolver = pod("lookup", NODE, tools(addons_node), ["python3", "-c", lookup, *names])
    resolver["spec"]["dnsPolicy"] = "ClusterFirst"
    await create(kubeconfig, namespace, resolver)
    assert (await logs_of_finished(kubeconfig, namespace, "lookup")).split() == [kubernetes_ip, web_ip]


def policy(name: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    """A NetworkPolicy over every pod of its namespace admitting only ``ingress`` ([] denies all)."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name},
        "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": ingress},
    }


async def test_network_policy_denies_other_namespaces_and_admits_the_allowed_port(
    addons_node: RealNode, policy_agent: NetworkPolicyAgent, kubeconfig: Path, namespace: str
) -> None:
    client_namespace = f"{namespace[:50]}-client"
    await kubectl(kubeconfig, "create", "namespace", client_namespace)
    try:
        await _policy_scenario(addons_node, kubeconfig, namespace, client_namespace)
    finally:
        await kubectl(kubeconfig, "delete", "namespace", client_namespace, "--wait=false")


async def _policy_scenario(node: RealNode, kubeconfig: Path, namespace: str, client_namespace: str) -> None:
    serve = ["bash", "-c", "python3 -m http.server 8080 & python3 -m http.server 8081 & wait"]
    await create(kubeconfig, namespace, pod("server", NODE, tools(node), serve, restart="Always"))
    await create(kubeconfig, client_namespace, pod("client", NODE, tools(node), ["sleep", "3600"], restart="Always"))
    server_ip = await _running_ip(kubeconfig, namespace, "server")
    await _running_ip(kubeconfig, client_namespace, "client")

    async def reachable() -> dict[int, bool]:
        result = {}
        for port in (8080, 8081):
            out = await kubectl(
                kubeconfig, "-n", client_namespace, "exec", "client", "--",
                "python3", "-c", CONNECT, server_ip, str(port), check=False,
            )  # fmt: skip
            result[port] = f"reached {port}" in out
        return result

    async def until(expected: dict[int, bool]) -> None:
        async def check() -> dict[int, bool] | None:
            seen = await reachable()
            return seen if seen == expected else None

        await eventually(check, timeout=60, interval=0.5)

    await until({8080: True, 8081: True})  # no policy yet: both ports answer
    await create(kubeconfig, namespace, policy("deny-all", []))
    await until({8080: False, 8081: False})
    from_client = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": client_namespace}}}
    allow = policy("allow-8080", [{"from": [from_client], "ports": [{"protocol": "TCP", "port": 8080}]}])
    await create(kubeconfig, namespace, allow)
    await until({8080: True, 8081: False})


async def _running_ip(kubeconfig: Path, namespace: str, name: str) -> str:
    async def check() -> str | None:
        status = (await get(kubeconfig, namespace, "pod", name))["status"]
        return str(status["podIP"]) if status.get("phase") == "Running" and status.get("podIP") else None

    return await eventually(check, timeout=60)


async def test_a_claim_is_provisioned_on_the_node_mounted_and_removed_with_its_claim(
    addons_node: RealNode, provisioner: LocalPathProvisioner, volumes_dir: Path, kubeconfig: Path, namespace: str
) -> None:
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "data"},
        "spec": {
            "storageClassName": STORAGE_CLASS,
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "16Mi"}},
        },
    }
    await create(kubeconfig, namespace, claim)
    writer = pod("writer", NODE, tools(addons_node), ["bash", "-c", "echo written on a real node > /data/proof"])
    # through the scheduler (not nodeName): a WaitForFirstConsumer claim is provisioned on the node it picks
    del writer["spec"]["nodeName"]
    writer["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    writer["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    writer["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]
    await create(kubeconfig, namespace, writer)
    await logs_of_finished(kubeconfig, namespace, "writer")

    volume_name = (await get(kubeconfig, namespace, "pvc", "data"))["spec"]["volumeName"]
    volume = json.loads(await kubectl(kubeconfig, "get", "pv", volume_name, "-o", "json"))
    path = Path(volume["spec"]["hostPath"]["path"])
    assert path.parent == volumes_dir, volume["spec"]
    assert (path / "proof").read_text() == "written on a real node\n"

    await kubectl(kubeconfig, "-n", namespace, "delete", "pod", "writer")
    await kubectl(kubeconfig, "-n", namespace, "delete", "pvc", "data", "--wait=false")

    async def removed() -> bool:
        gone = "NotFound" in await kubectl(kubeconfig, "get", "pv", volume_name, check=False)
        return gone and not await asyncio.to_thread(path.exists)

    await eventually(removed, timeout=60)
