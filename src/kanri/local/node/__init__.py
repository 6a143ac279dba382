"""The local node: a Node that stays Ready, a scheduler that binds pods to it, a local volume provisioner and a
kubelet-lite that runs pods' containers as local processes. The pod network, volume mounts, probes, Services and
DNS come in later slices (see docs/local-node.md).

Run it next to a control plane::

    async with await Client.from_kubeconfig(endpoint.kubeconfig) as client:
        await run_node(client, NodeOptions(data_dir=Path("/var/lib/kanri/node")))   # until cancelled

or keep a handle to stop it gracefully: ``node = LocalNode(client, options)``, ``await node.run()``,
``node.stop()``.
"""

from __future__ import annotations

import asyncio

from kanri.local.node.kubelet import Kubelet, log_path
from kanri.local.node.node import NodeAgent
from kanri.local.node.options import NodeOptions
from kanri.local.node.provisioner import PROVISIONER, VolumeProvisioner, VolumeReclaimer, ensure_storage_class
from kanri.local.node.scheduler import Scheduler
from kanri.runtime import Client, Manager, ManagerOptions

__all__ = ["PROVISIONER", "LocalNode", "NodeOptions", "log_path", "run_node"]


class LocalNode:
    """One Manager (leader election off: there is one node) running the scheduler, the volume controllers and the
    kubelet, next to the heartbeat that keeps the Node Ready."""

    def __init__(self, client: Client, options: NodeOptions, *, health_port: int | None = None) -> None:
        self.options = options
        self.client = client
        self.manager = Manager(
            client,
            ManagerOptions(name=f"kanri-node-{options.name}", leader_election=False, health_port=health_port),
        )
        cache = self.manager.cache
        self.agent = NodeAgent(client, options)
        self.scheduler = Scheduler(cache, client, options.name, scheduler_name=options.scheduler_name)
        self.manager.add(self.scheduler.controller())
        self.manager.add(VolumeProvisioner(cache, client, options).controller())
        self.manager.add(VolumeReclaimer(cache, client, options).controller())
        self.kubelet = Kubelet(cache, client, options)
        self.manager.add(self.kubelet.controller())

    async def run(self) -> None:
        """Register the node and run everything until :meth:`stop` (or cancellation)."""
        await self.agent.heartbeat()  # the node exists before the scheduler looks for it
        await ensure_storage_class(self.client, self.options)
        async with asyncio.TaskGroup() as group:
            heartbeat = group.create_task(self.agent.run(), name=f"heartbeat {self.options.name}")
            try:
                await self.manager.run(handle_signals=False)
            finally:
                heartbeat.cancel()
                await self.kubelet.shutdown()

    def stop(self) -> None:
        """Stop gracefully: reconciles in flight finish, heartbeats stop. The Node object stays (as a kubelet's
        does); the node-lifecycle controller will mark it NotReady once the grace period passes."""
        self.manager.stop()


async def run_node(client: Client, options: NodeOptions) -> None:
    """Run the local node until cancelled."""
    await LocalNode(client, options).run()
