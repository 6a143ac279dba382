"""The real nodes' pure parts (docs/real-nodes.md): the routing plan, kube-proxy's command line, the ``kubernetes``
Service's endpoint, and the state a saved node shows in ``kanri local node list``."""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path

from kanri.local.realnode import ZONES, RealNode
from kanri.local.realnode import local as realnode_local
from kanri.local.realnode.configs import containerd_config, kube_proxy_args, registry_hosts
from kanri.local.realnode.network import _pod_routes
from kanri.local.realnode.node import NodeRegistry, apiserver_endpoint_slice
from kanri.local.realnode.spec import MAX_NODES, POD_SUPERNET, NodeLayout, NodeSpec


def test_pod_routes_send_each_pod_network_to_its_node() -> None:
    lines = _pod_routes().format(dev="kanri-rn0").splitlines()
    assert len(lines) == MAX_NODES
    assert lines[0] == "route replace 10.251.0.0/24 via 10.250.0.10 dev kanri-rn0"
    assert lines[2] == "route replace 10.251.2.0/24 via 10.250.0.12 dev kanri-rn0"
    networks = [ipaddress.IPv4Network(line.split()[2]) for line in lines]
    assert len(set(networks)) == MAX_NODES
    assert all(network.subnet_of(POD_SUPERNET) for network in networks)


def test_pod_routes_skip_the_nodes_own_network() -> None:
    lines = _pod_routes(skip=1).format(dev="eth0").splitlines()
    assert len(lines) == MAX_NODES - 1
    assert not any(line.startswith("route replace 10.251.1.0/24") for line in lines)
    assert "route replace 10.251.0.0/24 via 10.250.0.10 dev eth0" in lines


def test_kube_proxy_args_bind_the_node_and_change_no_machine_sysctl() -> None:
    spec = NodeSpec("real-1", "kanri-b", 1)
    layout = NodeLayout(Path("/tmp/x/real-1"))
    args = kube_proxy_args(layout, spec)
    assert "--proxy-mode=nftables" in args
    assert f"--kubeconfig={layout.kube_proxy_kubeconfig}" in args
    assert "--hostname-override=real-1" in args
    assert "--bind-address=10.250.0.11" in args
    assert f"--cluster-cidr={POD_SUPERNET}" in args
    # 0 means "leave as it is": several conntrack sysctls are the machine's, not the node's
    assert {"--conntrack-max-per-core=0", "--conntrack-min=0"} <= set(args)
    assert "--healthz-bind-address=127.0.0.1:10256" in args
    assert "--metrics-bind-address=127.0.0.1:10249" in args


def test_apiserver_endpoint_slice_names_the_bridge_for_the_kubernetes_service() -> None:
    slice_ = apiserver_endpoint_slice("10.250.0.1", 6443)
    metadata = slice_["metadata"]
    assert isinstance(metadata, dict)
    assert metadata["name"] == "kubernetes-realnodes"
    assert metadata["namespace"] == "default"
    assert metadata["labels"]["kubernetes.io/service-name"] == "kubernetes"
    assert slice_["endpoints"] == [{"addresses": ["10.250.0.1"], "conditions": {"ready": True}}]
    assert slice_["ports"] == [{"name": "https", "port": 6443, "protocol": "TCP"}]


def test_local_cluster_is_three_nodes_in_three_zones(tmp_path: Path) -> None:
    nodes = realnode_local.local_cluster(tmp_path, tmp_path).nodes
    assert [(n.spec.name, n.spec.zone, n.spec.ip) for n in nodes] == [
        (f"real-{i}", ZONES[i], f"10.250.0.{10 + i}") for i in range(3)
    ]
    assert all(n.layout.root == tmp_path / "real-nodes" / n.spec.name for n in nodes)


def test_saved_nodes_that_never_ran_here_are_stopped(tmp_path: Path) -> None:
    """A node with a ``node.json`` but no cgroup (never started on this machine, or after a reboot) is listed as
    Stopped, by the name it was saved with."""
    for node in realnode_local.local_cluster(tmp_path, tmp_path).nodes:
        node.layout.root.mkdir(parents=True)
        node.save()
    (tmp_path / "real-nodes" / "not-a-node").mkdir()  # no node.json: not a node
    rows = realnode_local.rows(tmp_path)
    assert [(r.name, r.zone, r.state, r.pod_cidr) for r in rows] == [
        (f"real-{i}", ZONES[i], "Stopped", f"10.251.{i}.0/24") for i in range(3)
    ]
    loaded = RealNode.load(tmp_path / "real-nodes" / "real-0")
    assert loaded.spec == NodeSpec("real-0", "kanri-a", 0)


def test_no_real_nodes_no_rows(tmp_path: Path) -> None:
    assert realnode_local.rows(tmp_path) == []
    assert realnode_local.stop(tmp_path) == []


def test_containerd_pulls_kanri_local_from_the_local_registry_under_its_prefix() -> None:
    layout = NodeLayout(Path("/n"))
    config = containerd_config(layout, Path("/bin"), "kanri.local/kanri-pause:1")
    images = tomllib.loads(config)["plugins"]["io.containerd.cri.v1.images"]
    assert images["registry"] == {"config_path": "/n/certs.d"}
    hosts = tomllib.loads(registry_hosts(layout, 5000, "kanri"))
    # the gateway's port (DNAT to the machine's loopback), the prefix as the API root, the registry's own CA
    assert hosts == {"server": "https://10.250.0.1:5000/v2/kanri", "capabilities": ["pull", "resolve"],
                     "ca": "/n/pki/registry-ca.crt", "override_path": True}  # fmt: skip


def test_a_saved_node_keeps_its_registry() -> None:
    registry = NodeRegistry(5000, Path("/r/ca.crt"))
    assert NodeRegistry.loaded(registry.saved()) == registry
    assert NodeRegistry.loaded(None) is None
