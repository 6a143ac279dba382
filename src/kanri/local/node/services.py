"""Services: the real kube-proxy for ClusterIPs, and a userspace proxy as its fallback.

:meth:`ServiceProxy.start` runs kube-proxy in nftables mode (:mod:`kanri.local.node.kubeproxy`) when the node has a
kubeconfig to give it and ``NodeOptions.proxy_mode`` is ``nftables``. kube-proxy reads Services and EndpointSlices
itself; what is left here are the endpoints of the two Services that are served from the host, not from pods:
``default/kubernetes`` (the API server binds only 127.0.0.1, so a small forwarder on the bridge's address passes
connections on to it) and the cluster DNS (see :mod:`kanri.local.node.dns`). Both get an EndpointSlice naming the
bridge's address, which pods and the host reach and which kube-proxy's DNAT can target.

When kube-proxy cannot run (no kubeconfig, ``proxy_mode`` ``userspace``, or the kernel or nft refuse: one log line
says which), the userspace proxy below serves instead:

Every Service with an IPv4 ``clusterIP`` gets that address as a ``/32`` on a link of its own in the host's network
namespace (``NodeOptions.service_link``), and an asyncio TCP listener on ``clusterIP:port`` for each TCP port. The
host reaches those addresses directly; pods reach them through their default route (the bridge's address is in the
host's namespace too, so the kernel delivers packets for any local address). Each accepted connection is copied both
ways to an endpoint picked at random from the Service's EndpointSlices — ready endpoints, or serving-and-terminating
ones when none is ready (kube-proxy's rule) — chosen when the connection arrives, so endpoint changes apply to new
connections without touching the listeners. ``default/kubernetes`` goes to ``NodeOptions.apiserver`` instead: the
control plane publishes no endpoints for it.

Not done: UDP and SCTP ports (the only UDP service a local cluster needs is DNS, which :mod:`kanri.local.node.dns`
answers itself), NodePorts, ``sessionAffinity``, traffic policies, IPv6.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import random
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import structlog

from kanri.local.node.kubeproxy import KubeProxy, kubeconfig_for_proxy
from kanri.local.node.options import NodeOptions
from kanri.runtime import Cache, Client, Controller, ControllerOptions, Request, Result
from kanri.runtime.kinds import ENDPOINT_SLICE, SERVICE

Obj = dict[str, Any]
Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
log = structlog.get_logger("kanri.local.services")

SERVICE_NAME_LABEL = "kubernetes.io/service-name"
"""Ties an EndpointSlice to its Service (set by kube-controller-manager, or by whoever writes a slice by hand)."""

MANAGED_BY = "kanri-local-node"
"""The ``endpointslice.kubernetes.io/managed-by`` label and field manager of the slices the node writes."""
API_SERVICE = Request("default", "kubernetes")

_CHUNK = 64 * 1024
_CONNECT_TIMEOUT = 5.0
_CONNECT_ATTEMPTS = 3  # endpoints tried per connection before giving up (the old userspace proxy also retried)


# --- the link that carries the ClusterIPs ----------------------------------------------------------------------------


class LinkError(RuntimeError):
    """An ``ip`` command failed."""


async def _ip(*args: str, check: bool = True) -> tuple[int, str, str]:
    """Run ``ip ARGS``; returns (exit code, stdout, stderr), raising :class:`LinkError` on failure when ``check``."""
    process = await asyncio.create_subprocess_exec(
        "ip", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await process.communicate()
    code = process.returncode or 0
    stdout, stderr = out.decode(errors="replace"), err.decode(errors="replace").strip()
    if check and code != 0:
        raise LinkError(f"ip {' '.join(args)}: {stderr or f'exit {code}'}")
    return code, stdout, stderr


class ServiceLink:
    """A link in the host's network namespace that only holds addresses (ClusterIPs as ``/32``).

    A ``dummy`` link where the kernel has the driver; otherwise a bridge without ports, which behaves the same for
    local addresses (some VM kernels, Firecracker's for one, are built without ``CONFIG_DUMMY``). Every method is
    idempotent.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = asyncio.Lock()

    async def exists(self) -> bool:
        """Whether the link is there."""
        code, _, _ = await _ip("link", "show", "dev", self.name, check=False)
        return code == 0

    async def ensure(self) -> None:
        """Create the link if absent and set it up."""
        async with self._lock:
            if not await self.exists():
                code, _, err = await _ip("link", "add", self.name, "type", "dummy", check=False)
                if code != 0 and "Unknown device type" in err:
                    code, _, err = await _ip("link", "add", self.name, "type", "bridge", check=False)
                if code != 0 and "File exists" not in err:  # a concurrent creator is fine
                    raise LinkError(f"ip link add {self.name}: {err}")
                log.info("service link created", link=self.name)
            await _ip("link", "set", self.name, "up")

    async def addresses(self) -> set[str]:
        """The IPv4 addresses on the link (none when it does not exist)."""
        code, out, _ = await _ip("-j", "-4", "addr", "show", "dev", self.name, check=False)
        if code != 0:
            return set()
        return {
            str(info["local"])
            for link in json.loads(out or "[]")
            for info in link.get("addr_info") or ()
            if info.get("family") == "inet" and info.get("local")
        }

    async def add_address(self, ip: str) -> None:
        """Add ``ip/32`` (nothing happens when it is there already)."""
        await _ip("addr", "replace", f"{ip}/32", "dev", self.name)  # replace: no error when already there

    async def remove_address(self, ip: str) -> None:
        """Remove ``ip/32`` (nothing happens when it, or the link, is gone already)."""
        code, _, err = await _ip("addr", "del", f"{ip}/32", "dev", self.name, check=False)
        if code != 0 and "Cannot assign requested address" not in err and "Cannot find device" not in err:
            raise LinkError(f"ip addr del {ip}/32 dev {self.name}: {err}")

    async def delete(self) -> None:
        """Remove the link and, with it, every address on it."""
        async with self._lock:
            code, _, err = await _ip("link", "del", self.name, check=False)
            if code != 0 and "Cannot find device" not in err:
                raise LinkError(f"ip link del {self.name}: {err}")


# --- reading Services and EndpointSlices (pure) ----------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """One endpoint of an EndpointSlice, as the proxy and DNS read it."""

    address: str
    """The first address: consumers may use only the first, the API says; the rest are fungible."""
    ready: bool
    serving: bool
    terminating: bool
    hostname: str | None = None
    port: int | None = None
    """The target port of the service port asked about (None when no port was asked about)."""


def cluster_ip(service: Obj) -> str | None:
    """The Service's IPv4 ClusterIP, or None (headless, ExternalName, IPv6 or not yet allocated)."""
    value = str((service.get("spec") or {}).get("clusterIP") or "")
    try:
        return value if ipaddress.ip_address(value).version == 4 else None
    except ValueError:
        return None  # "None" (headless) or empty


def is_headless(service: Obj) -> bool:
    """``clusterIP: None``: DNS names the endpoints themselves and the proxy has nothing to do."""
    spec = service.get("spec") or {}
    return spec.get("clusterIP") == "None" and spec.get("type", "ClusterIP") != "ExternalName"


def service_ports(service: Obj, protocol: str = "TCP") -> list[Obj]:
    """The Service's ports of ``protocol`` (TCP when a port names none)."""
    return [p for p in (service.get("spec") or {}).get("ports") or () if p.get("protocol", "TCP") == protocol]


def slices_of(service: Obj, slices: Iterable[Obj]) -> list[Obj]:
    """The IPv4 EndpointSlices of ``service`` among ``slices``."""
    meta = service["metadata"]
    return [
        s
        for s in slices
        if s.get("addressType") == "IPv4"
        and (s["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL) == meta["name"]
        and s["metadata"].get("namespace") == meta.get("namespace")
    ]


def endpoints(slices: Iterable[Obj], port_name: str | None = None, protocol: str = "TCP") -> list[Endpoint]:
    """The endpoints of ``slices``, one per address (an endpoint may briefly sit in two slices).

    With ``port_name`` only slices that have that port (``""`` is the unnamed port of a single-port Service) count,
    and each endpoint carries the port's number. Missing conditions read as the API documents them: ``ready``
    absent means ready, ``serving`` absent means the same as ``ready``, ``terminating`` absent means false.
    """
    found: dict[str, Endpoint] = {}
    for slice_ in slices:
        port: int | None = None
        if port_name is not None:
            match = [
                p
                for p in slice_.get("ports") or ()
                if (p.get("name") or "") == port_name and p.get("protocol", "TCP") == protocol and p.get("port")
            ]
            if not match:
                continue
            port = int(match[0]["port"])
        for item in slice_.get("endpoints") or ():
            addresses = item.get("addresses") or ()
            if not addresses or addresses[0] in found:
                continue
            conditions = item.get("conditions") or {}
            ready = conditions.get("ready") is not False
            serving = conditions.get("serving", ready) is not False
            found[addresses[0]] = Endpoint(
                address=str(addresses[0]),
                ready=ready,
                serving=serving,
                terminating=conditions.get("terminating") is True,
                hostname=item.get("hostname"),
                port=port,
            )
    return list(found.values())


def host_endpoint_slice(service: Request, address: str, ports: Iterable[tuple[str, int, str]]) -> Obj:
    """The EndpointSlice of a selector-less Service served on the host at ``address``: one ready endpoint with the
    ``(name, port, protocol)`` ports (names as the Service's ports name them)."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service.name}-{MANAGED_BY}",
            "namespace": service.namespace,
            "labels": {SERVICE_NAME_LABEL: service.name, "endpointslice.kubernetes.io/managed-by": MANAGED_BY},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [address], "conditions": {"ready": True, "serving": True, "terminating": False}}],
        "ports": [{"name": name, "port": port, "protocol": protocol} for name, port, protocol in ports],
    }


def proxy_targets(service: Obj, slices: Iterable[Obj], port: int) -> list[tuple[str, int]]:
    """Where a connection to the Service's ``port`` may go: the ready endpoints, else — as kube-proxy does, so that
    a rolling update does not drop connections — the serving and terminating ones; empty when there are none."""
    spec = next((p for p in service_ports(service) if p.get("port") == port), None)
    if spec is None:
        return []
    found = [e for e in endpoints(slices_of(service, slices), spec.get("name") or "") if e.port is not None]
    chosen = [e for e in found if e.ready] or [e for e in found if e.serving and e.terminating]
    return [(e.address, e.port) for e in chosen if e.port is not None]


# --- the proxy -------------------------------------------------------------------------------------------------------


@dataclass
class _Listener:
    server: asyncio.Server
    connections: set[asyncio.Task[None]] = field(default_factory=set)

    async def close(self) -> None:
        """Stop accepting and drop the connections in flight (Python 3.11's ``Server.close`` leaves them open)."""
        self.server.close()
        for task in list(self.connections):
            task.cancel()
        await asyncio.gather(*self.connections, return_exceptions=True)
        await self.server.wait_closed()


@dataclass
class _Proxied:
    """What the proxy runs for one Service."""

    ip: str
    listeners: dict[int, _Listener] = field(default_factory=dict)


class ServiceProxy:
    """kube-proxy, or a userspace proxy: ClusterIPs on :class:`ServiceLink`, a TCP listener per service port.

    Add :meth:`controller` to the node's Manager, call :meth:`start` (which picks the mode, see the module
    docstring) before the Manager runs; call :meth:`close` after the Manager has stopped. Without :meth:`start` the
    userspace proxy serves. The ClusterIP of the cluster DNS Service (``NodeOptions.cluster_dns_ip``) gets its
    address but no listeners from the userspace proxy: the DNS server serves those ports.
    """

    def __init__(self, cache: Cache, options: NodeOptions, client: Client | None = None) -> None:
        self._cache = cache
        self._options = options
        self._client = client
        self.mode = "userspace"
        """``nftables`` once :meth:`start` has kube-proxy running, else ``userspace``."""
        self.kube_proxy: KubeProxy | None = None
        self._host_slices: dict[Request, Obj] = {}  # the slices of Services served on the host, kept as written
        self._api_forwarder: _Listener | None = None
        self.link = ServiceLink(options.service_link)
        self._proxied: dict[Request, _Proxied] = {}
        self._pinned: set[str] = {options.cluster_dns_ip}  # addresses kept whatever the Services say
        self._prepared = False
        self._closed = False

    def controller(self) -> Controller:
        """The controller keyed by Service; EndpointSlice changes queue their Service (the listeners read the
        slices anew for every connection, so nothing has to restart)."""
        # A bind that fails (the address is taken by someone else) is retried every few seconds, not after minutes.
        options = ControllerOptions(backoff_base=0.5, backoff_max=30.0, permanent_error_condition=None)
        return Controller("service-proxy", self, for_kind=SERVICE, options=options).watches(
            ENDPOINT_SLICE, self._on_slice
        )

    @staticmethod
    def _on_slice(slice_: Obj) -> list[Request]:
        name = (slice_["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL)
        return [Request(slice_["metadata"].get("namespace") or "", name)] if name else []

    def listening(self) -> set[tuple[str, int]]:
        """Every ``(clusterIP, port)`` with a listener right now."""
        return {(state.ip, port) for state in self._proxied.values() for port in state.listeners}

    async def start(self) -> None:
        """Run kube-proxy if it can run here; else stay the userspace proxy, saying why in one log line."""
        reason = self._userspace_reason()
        if reason is not None:
            log.info("service proxy: userspace", reason=reason)
            return
        assert self._client is not None
        assert self._options.kubeconfig is not None
        kube_proxy = KubeProxy(self._options, kubeconfig_for_proxy(self._options.kubeconfig))
        try:
            api = await self._client.get(SERVICE, API_SERVICE.name, API_SERVICE.namespace)
            await kube_proxy.start(str(api["spec"]["clusterIP"]))
        except Exception as exc:  # whatever stops it (the kernel, nft, the binary), the userspace proxy serves
            await kube_proxy.stop()
            log.warning("kube-proxy refused; falling back to the userspace service proxy", reason=str(exc))
            return
        self.kube_proxy, self.mode = kube_proxy, "nftables"
        await self.link.delete()  # a link an earlier userspace run left: nothing serves its addresses any more
        await self._forward_api_server()

    def _userspace_reason(self) -> str | None:
        if self._options.proxy_mode == "userspace":
            return "proxy_mode is userspace"
        if self._options.kubeconfig is None or self._client is None:
            return "no kubeconfig for kube-proxy"
        if self._options.apiserver is None:
            return "the API server's address is unknown (the kubernetes Service needs an endpoint)"
        return None

    async def _forward_api_server(self) -> None:
        """Forward ``<bridge address>:<port>`` to the API server on 127.0.0.1 and name that address in the
        ``kubernetes`` Service's EndpointSlice, so kube-proxy's DNAT (which cannot target loopback) reaches it."""
        assert self._options.apiserver is not None
        target = self._options.apiserver
        port = target[1]

        async def forward(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                async with asyncio.timeout(_CONNECT_TIMEOUT):
                    backend_reader, backend_writer = await asyncio.open_connection(*target)
            except (OSError, TimeoutError) as exc:
                log.info("API server unreachable", endpoint=f"{target[0]}:{target[1]}", error=str(exc))
                writer.transport.abort()
                return
            await splice(reader, writer, backend_reader, backend_writer)

        self._api_forwarder = await self._listen(self._options.internal_ip, port, forward)
        await self.publish_host_endpoints(API_SERVICE, [("https", port, "TCP")])

    async def serve_on_host(self, service: Request, ip: str, ports: Sequence[tuple[str, int, str]]) -> str:
        """Where a server on the host must listen for the Service whose ClusterIP is ``ip`` to reach it: with
        kube-proxy the bridge's address (named by an EndpointSlice, ``ports`` as ``(name, port, protocol)``);
        with the userspace proxy ``ip`` itself, on the service link."""
        if self.mode == "nftables":
            await self.publish_host_endpoints(service, ports)
            return self._options.internal_ip
        await self.ensure_address(ip)
        return ip

    async def publish_host_endpoints(self, service: Request, ports: Iterable[tuple[str, int, str]]) -> None:
        """Write (and keep, see :meth:`reconcile`) the EndpointSlice naming the bridge's address for ``service``."""
        assert self._client is not None
        slice_ = host_endpoint_slice(service, self._options.internal_ip, ports)
        self._host_slices[service] = slice_
        await self._client.apply(ENDPOINT_SLICE, slice_, field_manager=MANAGED_BY)

    async def _unpublish_host_endpoints(self) -> None:
        """Delete the slices :meth:`publish_host_endpoints` wrote (best effort: the API server may be gone first)."""
        slices, self._host_slices = list(self._host_slices.values()), {}
        if self._client is None:
            return
        for slice_ in slices:
            metadata = slice_["metadata"]
            try:
                async with asyncio.timeout(5):
                    await self._client.delete(ENDPOINT_SLICE, metadata["name"], metadata["namespace"])
            except Exception as exc:  # closing goes on: the slice is only stale, and the warning says so
                log.warning("could not delete a host EndpointSlice", slice=metadata["name"], error=str(exc))

    async def ensure_address(self, ip: str) -> None:
        """Put ``ip`` on the service link (creating it if need be) and keep it there until :meth:`close`."""
        self._pinned.add(ip)
        await self.link.ensure()
        await self.link.add_address(ip)

    async def close(self) -> None:
        """Close every listener and connection, delete the EndpointSlices naming this host (a later cluster on the
        same control plane would otherwise send the Service's traffic to an address nobody serves: a real node's
        CoreDNS behind ``kube-dns`` answered only some queries after the e2e tier), and delete the link (which
        removes every address on it)."""
        self._closed = True
        await self._unpublish_host_endpoints()
        if self._api_forwarder is not None:
            await self._api_forwarder.close()
            self._api_forwarder = None
        if self.kube_proxy is not None:
            await self.kube_proxy.stop()
            self.kube_proxy = None
        for state in self._proxied.values():
            for listener in state.listeners.values():
                await listener.close()
        self._proxied.clear()
        await self.link.delete()
        log.info("service proxy closed", link=self.link.name)

    # --- the reconcile ---------------------------------------------------------------------------------------------

    async def reconcile(self, request: Request) -> Result | None:
        if self._closed:
            return None
        if self.mode == "nftables":
            # kube-proxy serves every Service; ours is only to keep the slices of those served on the host.
            if (slice_ := self._host_slices.get(request)) is not None and self._client is not None:
                await self._client.apply(ENDPOINT_SLICE, slice_, field_manager=MANAGED_BY)
            return None
        if not self._prepared:
            await self._prepare()
        service = self._cache.get(SERVICE, request.name, request.namespace)
        ip = cluster_ip(service) if service is not None else None
        ports: dict[int, Obj] = {}
        if service is not None and ip is not None and ip != self._options.cluster_dns_ip:
            ports = {int(p["port"]): p for p in service_ports(service)}
            for skipped in service_ports(service, "UDP") + service_ports(service, "SCTP"):
                log.debug("service port not proxied", service=str(request), port=skipped.get("port"),
                          protocol=skipped.get("protocol"))  # fmt: skip
        state = self._proxied.get(request)
        if state is not None and state.ip != ip:
            await self._drop(request, state)  # deleted, or recreated under the same name with another address
            state = None
        if ip is None:
            return None
        if state is None:
            await self.link.add_address(ip)
            state = self._proxied[request] = _Proxied(ip)
            log.info("service address added", service=str(request), ip=ip)
        for port in set(state.listeners) - set(ports):
            await state.listeners.pop(port).close()
            log.info("service port closed", service=str(request), ip=ip, port=port)
        for port in sorted(set(ports) - set(state.listeners)):
            state.listeners[port] = await self._listen(ip, port, self._forwarder(request, port))
            log.info("service port open", service=str(request), ip=ip, port=port)
        return None

    async def _prepare(self) -> None:
        """Once, with the cache synced: make the link and remove addresses left by an earlier run whose Services are
        gone (a node that crashed never deleted its link)."""
        await self.link.ensure()
        wanted = self._pinned | {ip for s in self._cache.list(SERVICE) if (ip := cluster_ip(s)) is not None}
        for stale in await self.link.addresses() - wanted:
            await self.link.remove_address(stale)
            log.info("stale service address removed", ip=stale)
        self._prepared = True

    async def _drop(self, request: Request, state: _Proxied) -> None:
        for listener in state.listeners.values():
            await listener.close()
        if state.ip not in self._pinned:
            await self.link.remove_address(state.ip)
        del self._proxied[request]
        log.info("service address removed", service=str(request), ip=state.ip)

    def _forwarder(self, request: Request, port: int) -> Handler:
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._forward(request, port, reader, writer)

        return handle

    @staticmethod
    async def _listen(ip: str, port: int, handle: Handler) -> _Listener:
        connections: set[asyncio.Task[None]] = set()

        async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            connections.add(task)  # so that closing the listener can drop its connections
            try:
                await handle(reader, writer)
            finally:
                connections.discard(task)
                if not writer.is_closing():  # cancelled before the splice took the connection over
                    writer.transport.abort()

        server = await asyncio.start_server(accepted, ip, port, reuse_address=True)
        return _Listener(server, connections)

    # --- one connection --------------------------------------------------------------------------------------------

    def targets(self, namespace: str, name: str, port: int) -> list[tuple[str, int]]:
        """Where a new connection to ``namespace/name``'s ``port`` may go right now."""
        if (namespace, name) == ("default", "kubernetes") and self._options.apiserver is not None:
            return [self._options.apiserver]
        service = self._cache.get(SERVICE, name, namespace)
        if service is None:
            return []
        slices = self._cache.list(ENDPOINT_SLICE, namespace, {SERVICE_NAME_LABEL: name})
        return proxy_targets(service, slices, port)

    async def _forward(
        self, request: Request, port: int, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter
    ) -> None:
        candidates = self.targets(request.namespace, request.name, port)
        random.shuffle(candidates)
        for host, target_port in candidates[:_CONNECT_ATTEMPTS]:
            try:
                async with asyncio.timeout(_CONNECT_TIMEOUT):
                    backend_reader, backend_writer = await asyncio.open_connection(host, target_port)
            except (OSError, TimeoutError) as exc:
                log.info("endpoint unreachable", service=str(request), endpoint=f"{host}:{target_port}", error=str(exc))
                continue
            await splice(client_reader, client_writer, backend_reader, backend_writer)
            return
        if not candidates:
            log.debug("no endpoint for connection", service=str(request), port=port)
        # No endpoint (or none answered): close at once rather than leave the client waiting.
        client_writer.close()
        with contextlib.suppress(OSError):
            await client_writer.wait_closed()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy until EOF, then pass the EOF on (a half-close: the other direction keeps flowing)."""
    while data := await reader.read(_CHUNK):
        writer.write(data)
        await writer.drain()
    if writer.can_write_eof() and not writer.is_closing():
        writer.write_eof()


async def splice(
    a_reader: asyncio.StreamReader,
    a_writer: asyncio.StreamWriter,
    b_reader: asyncio.StreamReader,
    b_writer: asyncio.StreamWriter,
) -> None:
    """Copy both ways until both sides have sent EOF; on an error in either direction (or cancellation) abort both
    connections, so neither peer waits for data that will never come."""
    pipes = [asyncio.create_task(_pipe(a_reader, b_writer)), asyncio.create_task(_pipe(b_reader, a_writer))]
    failed = True
    try:
        done, _ = await asyncio.wait(pipes, return_when=asyncio.FIRST_EXCEPTION)
        failed = any(not t.cancelled() and t.exception() is not None for t in done) or len(done) < len(pipes)
    finally:
        for task in pipes:
            task.cancel()
        await asyncio.gather(*pipes, return_exceptions=True)
        writers: Sequence[asyncio.StreamWriter] = (a_writer, b_writer)
        for writer in writers:
            if failed:
                writer.transport.abort()
            else:
                writer.close()
        for writer in writers:
            with contextlib.suppress(OSError):
                await writer.wait_closed()
