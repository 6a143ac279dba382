"""Cluster add-ons for real nodes, built from pinned Go modules by nodes/build.sh (docs/real-nodes.md, "Add-ons"):
cluster DNS (CoreDNS as the ``kube-dns`` Service) and NetworkPolicy enforcement (kube-network-policies, one per node).
"""

from kanri.local.realnode.addons.coredns import ClusterDNS, coredns_image, install_coredns
from kanri.local.realnode.addons.kube import AddonError
from kanri.local.realnode.addons.netpol import NetworkPolicyAgent

__all__ = ["AddonError", "ClusterDNS", "NetworkPolicyAgent", "coredns_image", "install_coredns"]
