"""What one real node is: its name, zone, addresses and the files it keeps (one directory per node)."""

from __future__ import annotations

import hashlib
import ipaddress
from dataclasses import dataclass
from pathlib import Path

#: The host bridge every real node's ``eth0`` is joined to, and its network: the bridge holds the first address
#: (the nodes' gateway, and where they reach the API server), node ``i`` gets ``.10 + i``. Apart from the home-made
#: node's pod network (``kanri0``, 10.244.0.0/16) and the Service range (10.96.0.0/16).
HOST_BRIDGE = "kanri-rn0"
NODE_NETWORK = ipaddress.IPv4Network("10.250.0.0/24")
#: The host's address on the bridge: the nodes' gateway, where they reach the API server and the local registry.
GATEWAY = str(NODE_NETWORK.network_address + 1)
#: Node ``i``'s pods get ``10.251.i.0/24`` (the CNI bridge inside the node's network namespace).
POD_SUPERNET = ipaddress.IPv4Network("10.251.0.0/16")
MAX_NODES = 200


def node_ip(index: int) -> str:
    """Node ``index``'s address on the host bridge."""
    return str(NODE_NETWORK.network_address + 10 + index)


def pod_cidr(index: int) -> str:
    """Node ``index``'s pod network: every node and the host route it to :func:`node_ip` of the same index."""
    return str(ipaddress.IPv4Network((int(POD_SUPERNET.network_address) + (index << 8), 24)))


@dataclass(frozen=True)
class NodeSpec:
    """One node: its Kubernetes name, its zone label and its index on the host bridge (distinct per node)."""

    name: str
    zone: str
    index: int

    def __post_init__(self) -> None:
        if not 0 <= self.index < MAX_NODES:
            raise ValueError(f"node index {self.index} is outside 0..{MAX_NODES - 1}")

    @property
    def gateway(self) -> str:
        return GATEWAY

    @property
    def ip(self) -> str:
        return node_ip(self.index)

    @property
    def pod_cidr(self) -> str:
        return pod_cidr(self.index)

    @property
    def short_id(self) -> str:
        """Eight hex digits naming the node's links and cgroup (a link name has at most 15 characters)."""
        return hashlib.sha256(self.name.encode()).hexdigest()[:8]

    @property
    def netns(self) -> str:
        return f"kanri-rn-{self.short_id}"

    @property
    def host_link(self) -> str:
        return f"rnh{self.short_id}"

    @property
    def cgroup(self) -> str:
        """The node's cgroup (the same path in every hierarchy): kubelet's ``cgroupRoot`` and its daemons' home."""
        return f"kanri-rn-{self.short_id}"


@dataclass(frozen=True)
class NodeLayout:
    """The node's directory: configuration, certificates, state that survives a stop, and logs."""

    root: Path

    @property
    def pki(self) -> Path:
        return self.root / "pki"

    @property
    def containerd_config(self) -> Path:
        return self.root / "containerd.toml"

    @property
    def containerd_root(self) -> Path:
        return self.root / "containerd"

    @property
    def kubelet_config(self) -> Path:
        return self.root / "kubelet.yaml"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubelet.kubeconfig"

    @property
    def kubelet_root(self) -> Path:
        return self.root / "kubelet"

    @property
    def pod_logs(self) -> Path:
        return self.root / "pod-logs"

    @property
    def registry_hosts(self) -> Path:
        """containerd's ``config_path`` for registries: ``<registry host>/hosts.toml`` (:mod:`.configs`)."""
        return self.root / "certs.d"

    @property
    def registry_ca(self) -> Path:
        """The CA of the machine's local registry, as the node's containerd trusts it."""
        return self.pki / "registry-ca.crt"

    @property
    def cni_conf(self) -> Path:
        return self.root / "cni"

    @property
    def sysctl_dir(self) -> Path:
        return self.root / "sysctl"

    @property
    def state_file(self) -> Path:
        """What the node is made of (``RealNode.save``), for a later process that acts on it by name."""
        return self.root / "node.json"

    @property
    def launch_plan(self) -> Path:
        return self.root / "launch.json"

    @property
    def launch_log(self) -> Path:
        return self.root / "launch.log"

    @property
    def containerd_log(self) -> Path:
        return self.root / "containerd.log"

    @property
    def kubelet_log(self) -> Path:
        return self.root / "kubelet.log"

    @property
    def kube_proxy_kubeconfig(self) -> Path:
        return self.root / "kube-proxy.kubeconfig"

    @property
    def kube_proxy_log(self) -> Path:
        return self.root / "kube-proxy.log"


#: Inside the node's mount namespace ``/run`` is a tmpfs of its own: containerd's state (shim sockets, runc state,
#: the pods' network namespaces, CNI leases) lives there and vanishes with the node, as a machine's /run does.
CONTAINERD_STATE = Path("/run/containerd")
CONTAINERD_SOCKET = CONTAINERD_STATE / "containerd.sock"
CNI_LEASES = Path("/run/cni/networks")
