"""The local nodes: a node host process running the pod network, the service proxy and the cluster DNS, and N nodes,
each with its Node kept Ready (own zone, heartbeats, capacity share), a kubelet-lite that runs its pods' containers as
local processes in namespaces, roots and cgroups of their own, and a provisioner for volumes on its own disk; plus
chaos verbs that stop, freeze or partition one node (see docs/local-node.md). Pods are placed by the control plane's
kube-scheduler.

Run it next to a control plane::

    async with await Client.from_kubeconfig(endpoint.kubeconfig) as client:
        await run_nodes(client, NodeOptions(data_dir=Path("/var/lib/kanri/nodes")), count=3)   # until cancelled

or keep a handle: ``host = NodeHost(client, options, count=3)``, ``await host.run()``, ``await host.chaos("stop",
"kanri-2")``, ``host.stop()``.
"""

from __future__ import annotations

from kanri.local.node.host import VERBS, LocalNode, NodeHost, node_options
from kanri.local.node.kubelet import log_path
from kanri.local.node.options import NodeOptions
from kanri.local.node.provisioner import PROVISIONER
from kanri.runtime import Client

__all__ = ["PROVISIONER", "VERBS", "LocalNode", "NodeHost", "NodeOptions", "log_path", "node_options", "run_nodes"]


async def run_nodes(client: Client, options: NodeOptions, count: int = 1) -> None:
    """Run a node host with ``count`` nodes until cancelled."""
    await NodeHost(client, options, count).run()
