"""How the local node is set up: one frozen value, handed to every part."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class NodeOptions:
    """Settings of the local node. Only ``data_dir`` is required."""

    data_dir: Path
    """Root of the node's state; volumes live in ``<data_dir>/volumes/<pv-name>``. Given to a
    :class:`~kanri.local.node.NodeHost`: the host's directory, each node's being ``<data_dir>/<node name>``."""
    name: str = "kanri"
    """The Node object's name (and ``kubernetes.io/hostname`` label). Given to a host: the prefix of its nodes'
    names (``kanri-1``, ``kanri-2``, …)."""
    internal_ip: str = "10.244.0.1"
    """The pod network's gateway (the bridge's address); a node of a host gets its own ``InternalIP`` instead, the
    first address of its ``pod_slice``. Never a loopback address — EndpointSlices and some clients refuse those."""
    labels: Mapping[str, str] = field(default_factory=dict)
    """Extra node labels, on top of ``kubernetes.io/hostname``/``os``/``arch`` (and the zone)."""
    zone: str | None = None
    """The ``topology.kubernetes.io/zone`` label (a host names its nodes' zones ``zone-a``, ``zone-b``, …)."""
    pod_slice: str | None = None
    """The part of ``pod_cidr`` this node's pods get their addresses from (a host gives node i
    ``10.244.<i>.0/24``); None: all of ``pod_cidr``."""
    machine_share: int = 1
    """The machine is split across this many nodes: capacity is every CPU (in millicores) and all memory, divided
    by it."""
    chaos_table: str = "kanri-chaos"
    """The nftables tables (families ``inet`` and ``bridge``) that partition nodes; see
    :mod:`kanri.local.node.chaos`."""
    max_pods: int = 110
    """``pods`` capacity, the kubelet's default."""
    heartbeat_interval: float = 10.0
    """How often the Ready condition's ``lastHeartbeatTime`` and the node Lease are renewed (the kubelet's
    ``nodeStatusUpdateFrequency`` and lease renew interval)."""
    lease_duration_seconds: int = 40
    """The node Lease's ``leaseDurationSeconds`` (the kubelet's ``nodeLeaseDurationSeconds``)."""
    storage_class: str = "kanri-local"
    """Name of the StorageClass the node creates for its provisioner."""
    default_storage_class: bool = True
    """Mark that StorageClass as the cluster's default (PVCs without a class get it)."""

    image_map_file: Path | None = None
    """The image map (YAML or JSON): which local program stands for which image; see
    :mod:`kanri.local.node.images`."""
    images: Sequence[Mapping[str, Any]] = ()
    """Image map entries given in code (``{"image": ..., "command": [...], "args": [...]}``), looked at before the
    file's."""
    restart_backoff_base: float = 10.0
    """Crash-loop back-off before the first restart; doubles per crash (the kubelet's 10 s)."""
    restart_backoff_max: float = 300.0
    """Cap of the crash-loop back-off (the kubelet's 300 s). A container that ran for twice this long starts over at
    the base."""

    shutdown_grace: float = 10.0
    """When the node stops, containers get SIGTERM and at most this long (or their pod's grace period, if shorter)
    before SIGKILL."""
    pod_network: bool = True
    """Give every pod a network namespace and address of its own (needs root). False: pods share the host's
    network and report ``internal_ip`` as their address."""
    pod_cidr: str = "10.244.0.0/16"
    """Pod addresses come from here; ``internal_ip`` (the bridge's address, the pods' gateway) must be inside it."""
    node_cidr_mask_size: int = 24
    """The prefix length of each node's slice of ``pod_cidr`` (the controller-manager's ``--node-cidr-mask-size``):
    a /24 gives a node 253 pod addresses; a smaller slice makes address exhaustion reachable in a test."""
    bridge: str = "kanri0"
    """The Linux bridge in the host's network namespace that every pod's veth joins (at most 15 characters)."""
    service_link: str = "kanri-svc"
    """A dummy link in the host's network namespace that carries every ClusterIP (as /32 addresses), so pods (via
    the bridge) and the host reach the node's service proxy on them."""
    netns_prefix: str = "kanri-"
    """Pod network namespaces are ``<prefix><first 8 of the pod uid>``; the node removes any left with this prefix."""
    cluster_dns_ip: str = "10.96.0.10"
    """Where the node's DNS server listens (and the ``kube-system/kube-dns`` Service's clusterIP)."""
    cluster_domain: str = "cluster.local"
    """The cluster's DNS domain."""
    apiserver: tuple[str, int] | None = None
    """Host and port the ``default/kubernetes`` Service proxies to (the control plane has no endpoints for it)."""
    kubeconfig: Path | None = None
    """The kubeconfig kube-proxy uses (the node's own). None: no kube-proxy; the userspace proxy serves."""
    proxy_mode: str = "nftables"
    """``nftables``: the real kube-proxy serves ClusterIPs (the userspace proxy only if it cannot run);
    ``userspace``: the node's userspace proxy does."""
    kubelet_pki_dir: Path | None = None
    """The control plane's ``pki`` dir (cluster CA, kubelet CA): with it the node serves the kubelet API on its
    ``internal_ip`` (``kubectl logs``; see :mod:`kanri.local.node.kubeletapi`). None: no kubelet API."""

    @property
    def volumes_dir(self) -> Path:
        return self.data_dir / "volumes"
