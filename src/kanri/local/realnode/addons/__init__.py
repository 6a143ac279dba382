"""Cluster add-ons for real nodes, built from pinned Go modules by nodes/build.sh (docs/real-nodes.md, "Add-ons"):
cluster DNS (CoreDNS as the ``kube-dns`` Service), NetworkPolicy enforcement (kube-network-policies, one per node) and
node-local volumes (rancher's local-path-provisioner and its StorageClass).
"""

from kanri.local.realnode.addons.coredns import ClusterDNS, cluster_dns_ip, coredns_image, install_coredns
from kanri.local.realnode.addons.kube import AddonError
from kanri.local.realnode.addons.localpath import LocalPathProvisioner
from kanri.local.realnode.addons.netpol import NetworkPolicyAgent

__all__ = [
    "AddonError",
    "ClusterDNS",
    "LocalPathProvisioner",
    "NetworkPolicyAgent",
    "cluster_dns_ip",
    "coredns_image",
    "install_coredns",
]
