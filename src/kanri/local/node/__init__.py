"""The local node: a Node that stays Ready, a scheduler that binds pods to it, a local volume provisioner, a
kubelet-lite that runs pods' containers as local processes in namespaces, roots and cgroups of their own, a
service proxy for ClusterIPs and the cluster DNS (see docs/local-node.md).

Run it next to a control plane::

    async with await Client.from_kubeconfig(endpoint.kubeconfig) as client:
        await run_node(client, NodeOptions(data_dir=Path("/var/lib/kanri/node")))   # until cancelled

or keep a handle to stop it gracefully: ``node = LocalNode(client, options)``, ``await node.run()``,
``node.stop()``.
"""

from __future__ import annotations

import asyncio

from kanri.local.node.dns import ClusterDNS, reserve_dns_service
from kanri.local.node.kubelet import Kubelet, log_path
from kanri.local.node.kubeletapi import KubeletAPI, start_kubelet_api
from kanri.local.node.network import NodeLock, PodNetwork
from kanri.local.node.node import NodeAgent
from kanri.local.node.options import NodeOptions
from kanri.local.node.provisioner import PROVISIONER, VolumeProvisioner, VolumeReclaimer, ensure_storage_class
from kanri.local.node.scheduler import Scheduler
from kanri.local.node.services import ServiceProxy
from kanri.local.node.sessions import forget_sessions
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
        self.network = PodNetwork(options) if options.pod_network else None
        self.kubelet = Kubelet(cache, client, options, self.network)
        self.manager.add(self.kubelet.controller())
        self.proxy: ServiceProxy | None = None
        self.dns: ClusterDNS | None = None
        self.kubelet_api: KubeletAPI | None = None
        if options.pod_network:
            self.proxy = ServiceProxy(cache, options, client)
            self.manager.add(self.proxy.controller())
            self.dns = ClusterDNS(cache, options, self.proxy)

    async def run(self) -> None:
        """Register the node and run everything until :meth:`stop` (or cancellation)."""
        lock = NodeLock() if self.network is not None else None
        if lock is not None:
            lock.acquire()  # before anything is made: a refused node must not tear down the running one's network
        try:
            if self.network is not None:
                await self.network.start()
            await asyncio.to_thread(self.kubelet.cgroups.start)
            # On the node's address, which the network has by now; its port goes into the first heartbeat.
            self.kubelet_api = await start_kubelet_api(self.kubelet, self.manager.cache, self.client, self.options)
            self.agent.kubelet_port = self.kubelet_api.port if self.kubelet_api is not None else 0
            await self.agent.heartbeat()  # the node exists before the scheduler looks for it
            await ensure_storage_class(self.client, self.options)
            if self.proxy is not None:
                await self.proxy.start()  # kube-proxy, or the userspace proxy: before DNS, which asks it where to bind
            if self.dns is not None:
                await reserve_dns_service(self.client, self.options)
                await self.dns.start()
            async with asyncio.TaskGroup() as group:
                heartbeat = group.create_task(self.agent.run(), name=f"heartbeat {self.options.name}")
                try:
                    await self.manager.run(handle_signals=False)
                finally:
                    heartbeat.cancel()
                    await self.kubelet.shutdown(self.options.shutdown_grace)
        finally:
            # Shielded: a cancelled node must still leave no namespace, link or mountpoint behind.
            try:
                await asyncio.shield(self._clean_up())
            finally:
                if lock is not None:
                    lock.release()

    async def _clean_up(self) -> None:
        if self.kubelet_api is not None:
            await self.kubelet_api.close()
        if self.dns is not None:
            await self.dns.close()
        if self.proxy is not None:
            await self.proxy.close()
        if self.network is not None:
            await self.network.close()
        await asyncio.to_thread(self.kubelet.mountpoints.remove_all)
        await asyncio.to_thread(self.kubelet.cgroups.close)
        await asyncio.to_thread(forget_sessions, self.options.data_dir)

    def stop(self) -> None:
        """Stop gracefully: reconciles in flight finish, heartbeats stop. The Node object stays (as a kubelet's
        does); the node-lifecycle controller will mark it NotReady once the grace period passes."""
        self.manager.stop()


async def run_node(client: Client, options: NodeOptions) -> None:
    """Run the local node until cancelled."""
    await LocalNode(client, options).run()
