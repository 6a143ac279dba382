"""Real Kubernetes nodes on this machine: the upstream kubelet, containerd, runc and CNI plugins, built from their Go
modules (``nodes/build.sh``), each node in a network and mount namespace of its own (docs/real-nodes.md).

:class:`RealNode` starts one, registered with a local control plane; :meth:`RealNode.stop` kills every process of
the node at once, like a power loss, and leaves nothing behind. :class:`RealCluster` starts several at once, one
per zone.
"""

from kanri.local.realnode.cluster import ZONES, RealCluster
from kanri.local.realnode.node import NodeRegistry, RealNode, RealNodeError
from kanri.local.realnode.spec import NodeSpec

__all__ = ["ZONES", "NodeRegistry", "NodeSpec", "RealCluster", "RealNode", "RealNodeError"]
