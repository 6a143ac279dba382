"""The node host: one process running the shared pod network (bridge, service proxy, DNS) and N local nodes.

Each node (:class:`LocalNode`) is what a kubelet machine is: its own Node object (zone label, its share of the
machine's capacity, its own heartbeats), its own kubelet for the pods bound to it, its own volume provisioner and
reclaimer for volumes on its disk (``<host data dir>/<node>/volumes``), its own cgroup subtree, its own slice of the
pod CIDR and its own address on the bridge. The nodes share one Manager (one watch per kind, one cache: the extra
nodes cost a few controllers, not a copy of the cluster). Each node talks to the API server through a
:class:`~kanri.local.node.state.GatedClient`, so the chaos verbs (:meth:`NodeHost.stop_node` and friends) can
silence one node without touching the others.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

from kanri.local.node import chaos as partitions
from kanri.local.node.dns import ClusterDNS, reserve_dns_service
from kanri.local.node.kubelet import Kubelet
from kanri.local.node.kubeletapi import KubeletAPI, start_kubelet_api
from kanri.local.node.network import NodeLock, PodNetwork
from kanri.local.node.node import NodeAgent
from kanri.local.node.options import NodeOptions
from kanri.local.node.provisioner import VolumeProvisioner, VolumeReclaimer, ensure_storage_class
from kanri.local.node.services import ServiceProxy
from kanri.local.node.sessions import forget_sessions
from kanri.local.node.state import GatedClient, NodeState
from kanri.runtime import Client, Manager, ManagerOptions

log = structlog.get_logger("kanri.local.node")

VERBS = ("stop", "start", "freeze", "thaw", "partition", "heal")


def zone_name(index: int) -> str:
    """``zone-a``, ``zone-b``, … ``zone-z``, ``zone-aa``, … for the node at ``index`` (0-based)."""
    letters = ""
    index += 1
    while index:
        index, rest = divmod(index - 1, 26)
        letters = chr(ord("a") + rest) + letters
    return f"zone-{letters}"


def node_options(host: NodeOptions, count: int) -> list[NodeOptions]:
    """The options of each of ``count`` nodes: ``<name>-<i>`` (from 1), zone ``zone-<letter>``, data dir
    ``<host data dir>/<node>``, pod slice number ``i`` of the pod CIDR (a ``/24`` unless ``node_cidr_mask_size``
    says otherwise) with its first address as the node's own, the machine split ``count`` ways."""
    network = ipaddress.IPv4Network(host.pod_cidr)
    prefix = host.node_cidr_mask_size
    if not network.prefixlen < prefix <= 29 or count < 1 or count >= 2 ** (prefix - network.prefixlen):
        raise ValueError(f"{count} node slices of /{prefix} do not fit into the pod CIDR {host.pod_cidr}")
    slices = network.subnets(new_prefix=prefix)
    next(slices)  # slice 0 holds the gateway
    nodes = []
    for index, pod_slice in zip(range(count), slices, strict=False):
        name = f"{host.name}-{index + 1}"
        nodes.append(
            dataclasses.replace(
                host,
                name=name,
                data_dir=host.data_dir / name,
                zone=zone_name(index),
                pod_slice=str(pod_slice),
                internal_ip=str(pod_slice.network_address + 1),
                machine_share=count,
            )
        )
    return nodes


class LocalNode:
    """One node of a host: agent, kubelet, volume controllers, added to the host's Manager."""

    def __init__(self, host: NodeHost, client: Client, options: NodeOptions, *, first: bool) -> None:
        self.host = host
        """The host it runs in (shared network, Manager, the chaos verbs)."""
        self.options = options
        manager, network = host.manager, host.network
        self.state = NodeState()
        self.client = GatedClient(client, self.state, user_agent=f"kanri-local-node/{options.name}")
        cache = manager.cache
        self.agent = NodeAgent(self.client, options, state=self.state)
        self.kubelet = Kubelet(cache, self.client, options, network, self.state)
        manager.add(self.kubelet.controller())
        # Claims of a user's Immediate class (no node chosen) go to the first node.
        provisioner = VolumeProvisioner(cache, self.client, options, self.state, serves_immediate=first)
        manager.add(provisioner.controller())
        manager.add(VolumeReclaimer(cache, self.client, options, self.state).controller())
        self.kubelet_api: KubeletAPI | None = None
        """The node's kubelet API (``kubectl logs``/``exec``), once the host has started it."""

    @property
    def name(self) -> str:
        return self.options.name

    def describe(self) -> dict[str, Any]:
        """What ``kanri local node list`` shows."""
        return {
            "name": self.name,
            "zone": self.options.zone,
            "state": self.state.describe(),
            "internalIP": self.options.internal_ip,
            "podCIDR": self.options.pod_slice or self.options.pod_cidr,
            "pods": len(self.kubelet.workers),
        }


class NodeHost:
    """The shared pod network, service proxy and DNS, and ``count`` :class:`LocalNode` s, in one Manager."""

    def __init__(self, client: Client, options: NodeOptions, count: int = 1, *, health_port: int | None = None) -> None:
        self.options = options
        self.client = client
        self.manager = Manager(
            client, ManagerOptions(name=f"kanri-node-{options.name}", leader_election=False, health_port=health_port)
        )
        cache = self.manager.cache
        self.network = PodNetwork(options) if options.pod_network else None
        self.nodes = [
            LocalNode(self, client, node, first=index == 0) for index, node in enumerate(node_options(options, count))
        ]
        self.proxy: ServiceProxy | None = None
        self.dns: ClusterDNS | None = None
        if options.pod_network:
            # One kube-proxy for the machine (every node shares its network namespace), named after a real Node.
            proxied = dataclasses.replace(options, name=self.nodes[0].name)
            self.proxy = ServiceProxy(cache, proxied, client)
            self.manager.add(self.proxy.controller())
            self.dns = ClusterDNS(cache, options, self.proxy)
        self._chaos_lock = asyncio.Lock()

    def node(self, name: str) -> LocalNode:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(f"no node {name!r} on this host (nodes: {', '.join(n.name for n in self.nodes)})")

    async def run(self, on_ready: Callable[[], Awaitable[None]] | None = None) -> None:
        """Register the nodes and run everything until :meth:`stop` (or cancellation). ``on_ready`` runs as a task
        of the host once its caches have synced (the control endpoint, say)."""
        lock = NodeLock() if self.network is not None else None
        if lock is not None:
            lock.acquire()  # before anything is made: a refused host must not tear down the running one's network
        try:
            await asyncio.to_thread(partitions.remove_tables, self.options.chaos_table)  # a crashed host's partitions
            if self.network is not None:
                await self.network.start()
                for node in self.nodes:
                    await self.network.add_address(node.options.internal_ip)
            for node in self.nodes:
                await asyncio.to_thread(node.kubelet.cgroups.start)
                # On the node's own address (on the bridge by now); its port goes into the first heartbeat.
                cache = self.manager.cache
                node.kubelet_api = await start_kubelet_api(node.kubelet, cache, node.client, node.options)
                node.agent.kubelet_port = node.kubelet_api.port if node.kubelet_api is not None else 0
                await node.agent.heartbeat()  # the nodes exist before anything is scheduled to them
            await ensure_storage_class(self.client, self.options)
            if self.proxy is not None:
                await self.proxy.start()  # kube-proxy, or the userspace proxy: before DNS, which asks it where to bind
            if self.dns is not None:
                await reserve_dns_service(self.client, self.options)
                await self.dns.start()
            async with asyncio.TaskGroup() as group:
                beats = [group.create_task(n.agent.run(), name=f"heartbeat {n.name}") for n in self.nodes]
                extra = group.create_task(self._when_ready(on_ready)) if on_ready is not None else None
                try:
                    await self.manager.run(handle_signals=False)
                finally:
                    for task in [*beats, *([extra] if extra else [])]:
                        task.cancel()
                    await self._undo_chaos()
                    await asyncio.gather(*(n.kubelet.shutdown(self.options.shutdown_grace) for n in self.nodes))
        finally:
            # Shielded: a cancelled host must still leave no namespace, link or mountpoint behind.
            try:
                await asyncio.shield(self._clean_up())
            finally:
                if lock is not None:
                    lock.release()

    async def _when_ready(self, on_ready: Callable[[], Awaitable[None]]) -> None:
        while not self.manager.ready():  # noqa: ASYNC110 — the manager exposes no event
            await asyncio.sleep(0.1)
        await on_ready()

    async def _undo_chaos(self) -> None:
        """Before the containers are stopped: every node thawed and healed, every gate opened for good (a stopped
        node's kubelet still starts nothing: it has no workers and its reconciles return)."""
        for node in self.nodes:
            await asyncio.to_thread(node.kubelet.cgroups.thaw)
            node.state.close()
        if any(n.state.partitioned for n in self.nodes):
            # A failed heal must not skip the graceful container stop that follows (PostgreSQL's clean shutdown).
            try:
                await partitions.apply(self.options.chaos_table, [])
            except partitions.ChaosError as exc:
                log.warning("could not heal the partitions; removing their tables", error=str(exc))
        await asyncio.to_thread(partitions.remove_tables, self.options.chaos_table)

    async def _clean_up(self) -> None:
        for node in self.nodes:
            if node.kubelet_api is not None:
                await node.kubelet_api.close()
        if self.dns is not None:
            await self.dns.close()
        if self.proxy is not None:
            await self.proxy.close()
        if self.network is not None:
            await self.network.close()
        for node in self.nodes:
            await asyncio.to_thread(node.kubelet.mountpoints.remove_all)
            await asyncio.to_thread(node.kubelet.cgroups.close)
            await asyncio.to_thread(forget_sessions, node.options.data_dir)
            await node.client.close()

    def stop(self) -> None:
        """Stop gracefully: reconciles in flight finish, heartbeats stop. The Node objects stay (as a kubelet's
        do); the node-lifecycle controller will mark them NotReady once the grace period passes."""
        for node in self.nodes:
            node.state.close()  # nothing may wait at a gate while the Manager drains
        self.manager.stop()

    # --- the chaos verbs (idempotent; each returns whether it changed anything) -----------------------------------

    async def chaos(self, verb: str, name: str) -> bool:
        """Run ``verb`` (one of :data:`VERBS`) on node ``name``."""
        if verb not in VERBS:
            raise ValueError(f"unknown verb {verb!r} (one of {', '.join(VERBS)})")
        node = self.node(name)
        async with self._chaos_lock:
            changed = await getattr(self, f"_{verb}")(node)
        log.info("node chaos", verb=verb, node=name, changed=changed, state=node.state.describe())
        return bool(changed)

    async def _stop(self, node: LocalNode) -> bool:
        """Power off: heartbeats and kubelet stop, every container of the node SIGKILLed at once."""
        if node.state.stopped:
            return False
        node.state.set("stopped", True)
        if node.state.frozen:  # a machine that is off is not frozen: the kills must land
            node.state.set("frozen", False)
        await node.kubelet.power_off()
        return True

    async def _start(self, node: LocalNode) -> bool:
        """Power on: heartbeats again, and the kubelet resyncs like a rebooted one."""
        if not node.state.stopped:
            return False
        node.state.set("stopped", False)
        node.kubelet.power_on()
        return True

    async def _freeze(self, node: LocalNode) -> bool:
        if node.state.frozen:
            return False
        await asyncio.to_thread(node.kubelet.cgroups.freeze)
        node.state.set("frozen", True)
        return True

    async def _thaw(self, node: LocalNode) -> bool:
        if not node.state.frozen:
            return False
        await asyncio.to_thread(node.kubelet.cgroups.thaw)
        node.state.set("frozen", False)
        return True

    async def _partition(self, node: LocalNode) -> bool:
        if node.state.partitioned:
            return False
        await partitions.apply(self.options.chaos_table, self._partitions(also=node))
        node.state.set("partitioned", True)
        return True

    async def _heal(self, node: LocalNode) -> bool:
        if not node.state.partitioned:
            return False
        await partitions.apply(self.options.chaos_table, self._partitions(but=node))
        node.state.set("partitioned", False)
        return True

    def _partitions(self, also: LocalNode | None = None, but: LocalNode | None = None) -> list[partitions.Partition]:
        cut = [n for n in self.nodes if (n.state.partitioned or n is also) and n is not but]
        return [partitions.Partition(n.options.pod_slice or n.options.pod_cidr, n.options.internal_ip) for n in cut]
