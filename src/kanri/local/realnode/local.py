"""The real nodes of a ``kanri local`` cluster (``kanri local up --real-nodes``): three nodes in three zones under
``<cluster dir>/real-nodes/``, started and stopped by name. A node is no child of the process that starts it (its
processes run in a session and cgroup of their own), so the nodes keep running after ``up`` returns; the cgroup
is what a pid file is for the home-made node: :meth:`RealNode.pids` finds every process of the node by name, and a
start first removes whatever a crash left (namespace, links, cgroups) by name.

The cluster's local-path provisioner (its default StorageClass) is a machine process of the same kind: its own
session, found by name (:meth:`LocalPathProvisioner.pids`), started by ``up`` when it does not run and stopped by
``down``. Each node's volumes are directories in the node's own directory (``<node dir>/local-path``).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kanri.local.realnode import chaos, network
from kanri.local.realnode.addons import (
    LocalPathProvisioner,
    NetworkPolicyAgent,
    cluster_dns_ip,
    coredns_image,
    install_coredns,
)
from kanri.local.realnode.cluster import RealCluster
from kanri.local.realnode.node import NodeRegistry, RealNode, node_bin_dir
from kanri.local.realnode.spec import HOST_BRIDGE

#: Node ``i`` is ``real-<i>`` (zones kanri-a, kanri-b, kanri-c): short, since the kubelet's socket paths are bounded.
PREFIX = "real"
COUNT = 3
#: What each node imports at its start (cheap once imported); other images would make every start slower.
IMAGES = ("kanri-tools", "kanri-operator")
#: The local-path provisioner's helper pods make and remove volume directories: a shell as root is all they need.
HELPER_IMAGE = "kanri-tools"
PROVISIONER_DIR = "local-path-provisioner"
VOLUMES_DIR = "local-path"


@dataclass(frozen=True)
class NodeRow:
    """One real node as ``kanri local status`` and ``kanri local node list`` show it."""

    name: str
    zone: str
    state: str
    ip: str
    pod_cidr: str


def local_cluster(
    cluster_dir: Path,
    control_plane_dir: Path,
    *,
    extra_layouts: tuple[tuple[Path, str], ...] = (),
    cluster_dns: str | None = None,
    registry: NodeRegistry | None = None,
) -> RealCluster:
    """The cluster's three real nodes (not started)."""
    return RealCluster(
        control_plane_dir,
        chaos.real_nodes_dir(cluster_dir),
        count=COUNT,
        prefix=PREFIX,
        images=IMAGES,
        extra_layouts=extra_layouts,
        cluster_dns=cluster_dns,
        registry=registry,
    )


def start(cluster_dir: Path, control_plane_dir: Path, registry: NodeRegistry | None = None) -> dict[str, float]:
    """Start every node that has no process (a crashed one is cleaned by name first), all at once, with the
    add-ons when they are built: CoreDNS (the nodes' ``clusterDNS``) and a NetworkPolicy agent in each started
    node (it dies with its node). The seconds each started node took. Nodes with processes are left alone, chaos
    and all (``up`` is idempotent). ``registry``: the cluster's local registry, which the nodes pull what they do
    not hold from."""
    names = {node.spec.name for node in local_cluster(cluster_dir, control_plane_dir).nodes if not node.pids()}
    if not names:
        return {}
    bin_dir = node_bin_dir()
    addons = chaos.addons_built(bin_dir)
    extra: tuple[tuple[Path, str], ...] = ()
    dns = None
    if addons:
        extra = (coredns_image(bin_dir, chaos.real_nodes_dir(cluster_dir) / "coredns-image"),)
        config = json.loads((control_plane_dir / "config.json").read_text())
        dns = cluster_dns_ip(str(config["serviceCIDR"]))
    cluster = local_cluster(cluster_dir, control_plane_dir, extra_layouts=extra, cluster_dns=dns, registry=registry)
    todo = [node for node in cluster.nodes if node.spec.name in names]
    with ThreadPoolExecutor(max_workers=len(todo)) as pool:
        futures = {node.spec.name: pool.submit(node.start) for node in todo}
    seconds = {name: future.result() for name, future in futures.items()}
    if addons:
        install_coredns(control_plane_dir, bin_dir)
        for node in todo:
            NetworkPolicyAgent(node).start()
    return seconds


def route_services(cluster_dir: Path, control_plane_dir: Path) -> str | None:
    """Route the cluster's Service range from this machine through the first node that runs neither frozen nor
    partitioned (:func:`kanri.local.realnode.network.route_services`: the host has no kube-proxy of its own), so
    that ``kanri psql`` and clients on the machine reach ClusterIPs. The node's name; None when no node can carry
    it (the route is left as it was)."""
    cidr = str(json.loads((control_plane_dir / "config.json").read_text())["serviceCIDR"])
    for node in saved_nodes(cluster_dir):
        if node.pids() and not node.is_frozen() and not node.is_partitioned():
            with network.host_lock():
                network.route_services(cidr, node.spec)
            return node.spec.name
    return None


def import_images(cluster_dir: Path, names: tuple[str, ...]) -> None:
    """Import built images into every running node of the cluster, at once (what a pull from a registry would
    bring; cheap for images a node holds already)."""
    running = [node for node in saved_nodes(cluster_dir) if node.pids()]
    with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
        for done in [pool.submit(node.import_images, names) for node in running]:
            done.result()


def provisioner(cluster_dir: Path, control_plane_dir: Path) -> LocalPathProvisioner:
    """The cluster's local-path provisioner (its StorageClass the default one), not started."""
    nodes = local_cluster(cluster_dir, control_plane_dir).nodes
    return LocalPathProvisioner(
        control_plane_dir,
        chaos.real_nodes_dir(cluster_dir) / PROVISIONER_DIR,
        node_bin_dir(),
        {node.spec.name: str(node.layout.root / VOLUMES_DIR) for node in nodes},
        nodes[0].image(HELPER_IMAGE).ref,
        default_class=True,
    )


def start_provisioner(cluster_dir: Path, control_plane_dir: Path) -> str:
    """Start the cluster's local-path provisioner unless it runs (``up`` is idempotent); what happened:
    ``started``, ``already running`` or ``not built``."""
    local_path = provisioner(cluster_dir, control_plane_dir)
    if not local_path.binary.is_file():
        return "not built"
    return "started" if local_path.ensure_running() else "already running"


def saved_nodes(cluster_dir: Path) -> list[RealNode]:
    """Every real node ever started in the cluster (those with a ``node.json``), by name."""
    root = chaos.real_nodes_dir(cluster_dir)
    if not root.is_dir():
        return []
    return [RealNode.load(d) for d in sorted(root.iterdir()) if (d / "node.json").is_file()]


def stop(cluster_dir: Path) -> list[str]:
    """Stop every real node of the cluster (frozen and partitioned ones too: the kill goes through the freezer and
    the partition table dies with the node's namespace) and say what is left of them, by name: processes,
    cgroups, network namespaces, links, mounts, and the host's bridge and table once no node of any cluster
    uses them. Empty when nothing is left."""
    nodes = saved_nodes(cluster_dir)
    local_path = _saved_provisioner(cluster_dir)
    local_path.stop()
    for node in nodes:
        node.stop()
    left = [item for node in nodes for item in [*(f"process {pid}" for pid in node.pids()), *node.leftovers()]]
    left += local_path.leftovers()
    if nodes and not _other_real_nodes_run():
        left += network.host_leftovers()
    return left


def _saved_provisioner(cluster_dir: Path) -> LocalPathProvisioner:
    """The cluster's provisioner as far as finding and stopping it goes (by its directory: no control plane or
    image needed, so a crashed cluster's provisioner is found too)."""
    work_dir = chaos.real_nodes_dir(cluster_dir) / PROVISIONER_DIR
    return LocalPathProvisioner(cluster_dir, work_dir, node_bin_dir(), {}, "")


def real_nodes_run(cluster_dir: Path) -> bool:
    """Whether any real node of the cluster has processes (it is a real-node cluster now)."""
    return any(node.pids() for node in saved_nodes(cluster_dir))


def _other_real_nodes_run() -> bool:
    """Whether any real node's link (of another cluster or a test) is still on the host bridge."""
    ports = Path(f"/sys/class/net/{HOST_BRIDGE}/brif")
    return ports.is_dir() and any(ports.iterdir())


def rows(cluster_dir: Path) -> list[NodeRow]:
    """The cluster's real nodes with their state (``Running``, ``Running, Frozen, Partitioned``, ``Stopped``)."""
    return [
        NodeRow(node.spec.name, node.spec.zone, chaos.state(node), node.spec.ip, node.spec.pod_cidr)
        for node in saved_nodes(cluster_dir)
    ]
