"""The pod network: a bridge in the host's network namespace and, per pod, a network namespace joined to it.

Layout (defaults of :class:`~kanri.local.node.options.NodeOptions`)::

    host netns:  kanri0 (bridge, 10.244.0.1/16)  ── kv<uid8> ═══ eth0 (10.244.x.y/16)  netns kanri-<uid8>
                 kanri-svc (ClusterIPs, /32 each; see services.py)

Pods reach each other over the bridge and everything in the host's network namespace (the service proxy, DNS,
the API server through the ``kubernetes`` Service) through their default route, the bridge address. The host
reaches pods through the bridge's connected route. Nothing is forwarded or NATed: ``ip_forward`` stays as it is and
no packet of the pod network leaves the machine.

Everything is done with ``ip`` (iproute2). The node removes what a previous run left behind (a crash, a SIGKILL)
before it starts and :meth:`PodNetwork.close` removes everything it made, so ``kanri local down`` leaves no
namespace or link.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

import structlog

from kanri.local.node.options import NodeOptions

log = structlog.get_logger("kanri.local.network")

NETNS_DIR = Path("/run/netns")


class NetworkError(Exception):
    """An ``ip`` command failed; the message carries its stderr."""


async def run_ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS``; its stdout. Raises :class:`NetworkError` (with stderr) when it fails and ``check``."""
    process = await asyncio.create_subprocess_exec(
        "ip", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    if check and process.returncode != 0:
        raise NetworkError(f"ip {' '.join(args)}: {err.decode().strip()}")
    return out.decode()


@dataclass(frozen=True)
class PodSandbox:
    """A pod's network: its namespace (by name, mounted at ``/run/netns/<name>``), its address and host link."""

    netns: str
    ip: str
    host_link: str

    @property
    def netns_path(self) -> Path:
        return NETNS_DIR / self.netns


class AddressPool:
    """Pod addresses of the CIDR, minus network, broadcast and the gateway. Hands out addresses round-robin so a
    freed address is reused as late as possible (stale endpoints and DNS answers point nowhere, not at a new pod)."""

    def __init__(self, cidr: str, gateway: str) -> None:
        self.network = ipaddress.IPv4Network(cidr)
        self.gateway = ipaddress.IPv4Address(gateway)
        if self.gateway not in self.network:
            raise ValueError(f"the gateway {gateway} is not inside the pod CIDR {cidr}")
        self._used: set[ipaddress.IPv4Address] = set()
        self._next = int(self.network.network_address) + 1

    def allocate(self) -> str:
        first, last = int(self.network.network_address) + 1, int(self.network.broadcast_address) - 1
        for _ in range(last - first + 1):
            candidate = ipaddress.IPv4Address(self._next)
            self._next = first if self._next >= last else self._next + 1
            if candidate != self.gateway and candidate not in self._used:
                self._used.add(candidate)
                return str(candidate)
        raise NetworkError(f"the pod CIDR {self.network} has no free address")

    def release(self, ip: str) -> None:
        self._used.discard(ipaddress.IPv4Address(ip))

    def __len__(self) -> int:
        return len(self._used)


def netns_name(options: NodeOptions, pod_uid: str) -> str:
    return f"{options.netns_prefix}{pod_uid[:8]}"


def bridge_mac(bridge: str) -> str:
    """A locally administered unicast MAC derived from the bridge's name (stable across restarts)."""
    digest = hashlib.sha256(bridge.encode()).digest()
    return ":".join(f"{b:02x}" for b in (0x02, *digest[:5]))


def host_link_name(pod_uid: str) -> str:
    # Link names are at most 15 bytes; "kv" + 8 hex digits of the uid is unique enough among one node's pods.
    return f"kv{pod_uid.replace('-', '')[:8]}"


class PodNetwork:
    """Creates the bridge and pod namespaces; see the module docstring."""

    def __init__(self, options: NodeOptions) -> None:
        self.options = options
        self.prefix_length = ipaddress.IPv4Network(options.pod_cidr).prefixlen
        self.pool = AddressPool(options.pod_cidr, options.internal_ip)
        self.sandboxes: dict[str, PodSandbox] = {}
        """By pod uid."""
        self._pools: dict[str, AddressPool] = {}
        """The pool each pod's address came from, by pod uid."""
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Remove what an earlier run left, then create the bridge with the gateway address. The caller holds the
        machine's :class:`NodeLock`."""
        await self.remove_leftovers()
        # A fixed address: a bridge otherwise takes the lowest of its ports' MACs and changes it when that pod goes,
        # and every other pod keeps sending to the gateway's old MAC until its neighbour entry expires (30-45 s).
        await run_ip("link", "add", self.options.bridge, "address", bridge_mac(self.options.bridge), "type", "bridge")
        await run_ip("addr", "add", f"{self.options.internal_ip}/{self.prefix_length}", "dev", self.options.bridge)
        await run_ip("link", "set", self.options.bridge, "up")
        log.info("pod network ready", bridge=self.options.bridge, cidr=self.options.pod_cidr)

    async def remove_leftovers(self) -> None:
        """Delete every namespace with our prefix, and our bridge (its host links go with their namespaces)."""
        for name in leftover_namespaces(self.options):
            await run_ip("netns", "del", name, check=False)
        if await link_exists(self.options.bridge):
            await run_ip("link", "del", self.options.bridge)

    async def add_address(self, ip: str) -> None:
        """Give the bridge one more address (a node's own ``InternalIP``, as a /32: the host's default source
        address towards the pods stays the gateway's). Removed with the bridge."""
        await run_ip("addr", "replace", f"{ip}/32", "dev", self.options.bridge)

    async def attach(self, pod_uid: str, pool: AddressPool | None = None) -> PodSandbox:
        """The pod's namespace, veth pair and an address from ``pool`` (a node's slice; default: the whole pod
        CIDR) — idempotent per pod uid."""
        pool = pool if pool is not None else self.pool  # (an empty pool is falsy: it has a __len__)
        async with self._lock:
            existing = self.sandboxes.get(pod_uid)
            if existing is not None:
                return existing
            sandbox = PodSandbox(netns_name(self.options, pod_uid), pool.allocate(), host_link_name(pod_uid))
            try:
                await self._create(sandbox)
            except BaseException:
                await self._destroy(sandbox)
                pool.release(sandbox.ip)
                raise
            self.sandboxes[pod_uid] = sandbox
            self._pools[pod_uid] = pool
            return sandbox

    async def _create(self, sandbox: PodSandbox) -> None:
        ns = sandbox.netns
        await run_ip("netns", "add", ns)
        await run_ip("link", "add", sandbox.host_link, "type", "veth", "peer", "name", "eth0", "netns", ns)
        await run_ip("link", "set", sandbox.host_link, "master", self.options.bridge, "up")
        await run_ip("-n", ns, "addr", "add", f"{sandbox.ip}/{self.prefix_length}", "dev", "eth0")
        await run_ip("-n", ns, "link", "set", "lo", "up")
        await run_ip("-n", ns, "link", "set", "eth0", "up")
        await run_ip("-n", ns, "route", "add", "default", "via", self.options.internal_ip)

    async def _destroy(self, sandbox: PodSandbox) -> None:
        # Deleting the namespace destroys eth0 and with it its peer on the bridge.
        await run_ip("netns", "del", sandbox.netns, check=False)
        if await link_exists(sandbox.host_link):
            await run_ip("link", "del", sandbox.host_link, check=False)

    async def detach(self, pod_uid: str) -> None:
        """Remove the pod's namespace and links and free its address (no-op for an unknown pod)."""
        async with self._lock:
            sandbox = self.sandboxes.pop(pod_uid, None)
            pool = self._pools.pop(pod_uid, self.pool)
            if sandbox is None:
                return
            await self._destroy(sandbox)
            pool.release(sandbox.ip)

    async def close(self) -> None:
        """Remove every pod namespace and the bridge."""
        async with self._lock:
            for uid, sandbox in list(self.sandboxes.items()):
                await self._destroy(sandbox)
                self._pools.pop(uid, self.pool).release(sandbox.ip)
            self.sandboxes.clear()
            await self.remove_leftovers()
        log.info("pod network removed", bridge=self.options.bridge)


def leftover_namespaces(options: NodeOptions) -> list[str]:
    """Network namespaces named as this node names them (``<prefix><8 hex digits>`` in ``/run/netns``) — exactly,
    so a node with prefix ``kanri-`` never touches another's ``kanri-t-…`` namespaces."""
    try:
        names = os.listdir(NETNS_DIR)
    except FileNotFoundError:
        return []
    pattern = re.compile(re.escape(options.netns_prefix) + r"[0-9a-f]{8}")
    return sorted(n for n in names if pattern.fullmatch(n))


class NodeLock:
    """One networked local node per machine: they would share the ClusterIP range, the DNS address and (by default)
    the bridge. An exclusive ``flock`` on ``/run/kanri-local-node.lock`` (holding the owner's pid) says who runs;
    the kernel drops it when that process dies, so a crash never leaves it stuck."""

    PATH = Path("/run/kanri-local-node.lock")

    def __init__(self, path: Path = PATH) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode().strip() or "unknown"
            os.close(fd)
            raise NetworkError(
                f"another kanri local node (pid {holder}) runs a pod network on this machine; stop it first "
                "(kanri local down, or end the test session that started it)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def holder(self) -> str | None:
        """Who runs the machine's pod network now (the pid the lock holds, ``unknown`` when unreadable), or None
        when nobody does. Takes the lock for an instant to find out, and lets it go at once."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.read(fd, 64).decode().strip() or "unknown"
        finally:
            os.close(fd)  # also drops the shared lock, when it was had
        return None


async def link_exists(name: str) -> bool:
    process = await asyncio.create_subprocess_exec(
        "ip", "link", "show", "dev", name, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL
    )
    return await process.wait() == 0
