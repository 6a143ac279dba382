"""The local node's Services and DNS on the real control plane: the userspace proxy on ClusterIPs and the cluster DNS.

There are no pods with addresses here, so the tests play the pods: two addresses on a link of their own
(``kanri-tst``), a small TCP server on each that says who it is and then echoes, and a selector-less Service with a
hand-written EndpointSlice pointing at them. The proxy and the DNS server run on their own link and DNS address, so a
developer's running node is never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest_asyncio
from dnslib import QTYPE, RCODE, DNSRecord

from kanri.local import Endpoint
from kanri.local.node import NodeOptions
from kanri.local.node.dns import DNS_SERVICE, ClusterDNS, reserve_dns_service
from kanri.local.node.services import SERVICE_NAME_LABEL, ServiceLink, ServiceProxy
from kanri.runtime import ApiError, Client, Manager, ManagerOptions, Request
from kanri.runtime.kinds import ENDPOINT_SLICE, SERVICE
from tests.support import eventually, is_gone

Obj = dict[str, Any]

SERVICE_LINK = "kanri-svct"
BACKEND_LINK = "kanri-tst"
BACKENDS = ("10.244.255.11", "10.244.255.12")
BACKEND_PORT = 8080
DNS_IP = "10.96.200.10"  # inside the control plane's 10.96.0.0/16, far from what it hands out first


def links() -> str:
    return subprocess.run(["ip", "-br", "link", "show"], check=True, capture_output=True, text=True).stdout


# --- the pretend pods ------------------------------------------------------------------------------------------------


async def _backend(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Say who we are, echo until the client half-closes, then close."""
    host = writer.get_extra_info("sockname")[0]
    try:
        writer.write(f"{host}\n".encode())
        while data := await reader.read(4096):
            writer.write(data)
        await writer.drain()
    finally:
        writer.close()


@pytest_asyncio.fixture(loop_scope="session")
async def backends() -> AsyncIterator[tuple[str, ...]]:
    link = ServiceLink(BACKEND_LINK)
    await link.ensure()
    servers = []
    try:
        for address in BACKENDS:
            await link.add_address(address)
            servers.append(await asyncio.start_server(_backend, address, BACKEND_PORT))
        yield BACKENDS
    finally:
        for server in servers:
            server.close()
        await link.delete()


# --- the proxy and DNS, as the LocalNode will wire them ---------------------------------------------------------------


@dataclass
class Running:
    options: NodeOptions
    manager: Manager
    proxy: ServiceProxy
    dns: ClusterDNS


def proxy_options(control_plane: Endpoint, tmp_path: Path) -> NodeOptions:
    server = urlsplit(control_plane.server)
    assert server.hostname is not None
    assert server.port is not None
    return NodeOptions(
        data_dir=tmp_path / "node",
        service_link=SERVICE_LINK,
        cluster_dns_ip=DNS_IP,
        apiserver=(server.hostname, server.port),
    )


@contextlib.asynccontextmanager
async def running_proxy(kubeconfig: Path, options: NodeOptions) -> AsyncIterator[Running]:
    """Start a Manager with the proxy and the DNS server; on exit stop it, close both and check the link is gone."""
    async with await Client.from_kubeconfig(str(kubeconfig)) as client:
        with contextlib.suppress(ApiError):
            # An earlier test's node reserved kube-dns at the default address; this test serves DNS at its own.
            existing = await client.get(SERVICE, DNS_SERVICE[1], DNS_SERVICE[0])
            if existing["spec"].get("clusterIP") != options.cluster_dns_ip:
                await client.delete(SERVICE, DNS_SERVICE[1], DNS_SERVICE[0])
                await eventually(lambda: is_gone(lambda: client.get(SERVICE, DNS_SERVICE[1], DNS_SERVICE[0])))
        reserved = await reserve_dns_service(client, options)
        manager = Manager(client, ManagerOptions(name="svc-test", leader_election=False, health_port=None))
        proxy = ServiceProxy(manager.cache, options)
        manager.add(proxy.controller())
        dns = ClusterDNS(manager.cache, options, proxy)
        await dns.start()
        task = asyncio.create_task(manager.run(handle_signals=False))
        try:
            await eventually(lambda: asyncio.sleep(0, task.done() or manager.ready()), timeout=30)
            assert not task.done(), task.exception()
            yield Running(options, manager, proxy, dns)
        finally:
            manager.stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 20)
            await dns.close()
            await proxy.close()
            if reserved["spec"].get("clusterIP") == DNS_IP:  # ours: give the name back for a real node's address
                await client.delete(SERVICE, DNS_SERVICE[1], DNS_SERVICE[0])
    assert SERVICE_LINK not in links()


@pytest_asyncio.fixture(loop_scope="session")
async def running(control_plane: Endpoint, tmp_path: Path) -> AsyncIterator[Running]:
    async with running_proxy(control_plane.kubeconfig, proxy_options(control_plane, tmp_path)) as r:
        yield r


@pytest_asyncio.fixture(loop_scope="session")
async def client(control_plane: Endpoint) -> AsyncIterator[Client]:
    async with await Client.from_kubeconfig(str(control_plane.kubeconfig)) as c:
        yield c


# --- objects and probes ----------------------------------------------------------------------------------------------


async def create_service(client: Client, namespace: str, name: str, **spec: Any) -> Obj:
    ports = spec.pop("ports", [{"name": "http", "port": 80, "targetPort": BACKEND_PORT, "protocol": "TCP"}])
    body = {"metadata": {"name": name, "namespace": namespace}, "spec": {"ports": ports, **spec}}  # no selector
    return await client.create(SERVICE, body)


def slice_endpoint(address: str, *, ready: bool = True, hostname: str | None = None) -> Obj:
    item: Obj = {"addresses": [address], "conditions": {"ready": ready}}
    if hostname:
        item["hostname"] = hostname
    return item


async def put_slice(client: Client, namespace: str, service: str, items: list[Obj]) -> Obj:
    """Create or replace the hand-made EndpointSlice of ``service``."""
    name = f"{service}-manual"
    body: Obj = {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": namespace, "labels": {SERVICE_NAME_LABEL: service}},
        "addressType": "IPv4",
        "endpoints": items,
        "ports": [{"name": "http", "port": BACKEND_PORT, "protocol": "TCP"}],
    }
    try:
        return await client.create(ENDPOINT_SLICE, body)
    except ApiError as exc:
        if not exc.conflict:
            raise
    current = await client.get(ENDPOINT_SLICE, name, namespace)
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    return await client.replace(ENDPOINT_SLICE, body)


async def exchange(ip: str, port: int, payload: bytes = b"", timeout: float = 3.0) -> bytes:
    """Connect, send ``payload``, half-close, and read everything until the other side closes."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(ip, port)
        try:
            writer.write(payload)
            writer.write_eof()
            return await reader.read()
        finally:
            writer.close()


async def backend_of(ip: str, port: int = 80) -> str:
    """Which backend a new connection reached ("" when the proxy closed it at once)."""
    return (await exchange(ip, port)).decode().strip()


async def reaches(ip: str, port: int = 80) -> str | None:
    with contextlib.suppress(OSError, TimeoutError):
        return await backend_of(ip, port) or None
    return None


def listener_of(proxy: ServiceProxy, namespace: str, name: str, port: int) -> object:
    """The listener object itself, to tell a kept listener from a restarted one."""
    return proxy._proxied[Request(namespace, name)].listeners[port]


# --- the proxy -------------------------------------------------------------------------------------------------------


async def test_cluster_ip_spreads_follows_readiness_and_goes_with_the_service(
    client: Client, namespace: str, running: Running, backends: tuple[str, ...]
) -> None:
    service = await create_service(client, namespace, "web")
    ip = service["spec"]["clusterIP"]
    await put_slice(client, namespace, "web", [slice_endpoint(b) for b in backends])
    assert await eventually(lambda: reaches(ip), timeout=20) in backends
    assert (ip, 80) in running.proxy.listening()
    assert ip in await running.proxy.link.addresses()

    # Random choice per connection: both get traffic.
    seen = Counter([await backend_of(ip) for _ in range(40)])
    assert set(seen) == set(backends), seen

    # Both directions, half-close included: the backend sees our EOF, answers, and closes; we get all of it.
    reply = await exchange(ip, 80, b"ping " * 50_000)
    assert reply.split(b"\n", 1)[1] == b"ping " * 50_000

    # One endpoint not ready: new connections avoid it, with no listener restarted.
    listener = listener_of(running.proxy, namespace, "web", 80)
    await put_slice(client, namespace, "web", [slice_endpoint(backends[0]), slice_endpoint(backends[1], ready=False)])

    async def only_first() -> bool:
        return {await backend_of(ip) for _ in range(20)} == {backends[0]}

    await eventually(only_first, timeout=20)
    assert listener_of(running.proxy, namespace, "web", 80) is listener

    # No ready endpoint at all: the connection is closed at once.
    await put_slice(client, namespace, "web", [slice_endpoint(b, ready=False) for b in backends])

    async def closed_at_once() -> bool:
        return await backend_of(ip) == ""

    await eventually(closed_at_once, timeout=20)

    # The Service goes: so do its listener and its address.
    await client.delete(SERVICE, "web", namespace)

    async def gone() -> bool:
        return (ip, 80) not in running.proxy.listening() and ip not in await running.proxy.link.addresses()

    await eventually(gone, timeout=20)


async def test_port_removed_closes_only_that_listener(
    client: Client, namespace: str, running: Running, backends: tuple[str, ...]
) -> None:
    ports = [
        {"name": "http", "port": 80, "targetPort": BACKEND_PORT},
        {"name": "alt", "port": 81, "targetPort": BACKEND_PORT},
    ]
    service = await create_service(client, namespace, "two", ports=ports)
    ip = service["spec"]["clusterIP"]
    await eventually(lambda: asyncio.sleep(0, {(ip, 80), (ip, 81)} <= running.proxy.listening()), timeout=20)
    service["spec"]["ports"] = ports[:1]
    await client.replace(SERVICE, service)
    await eventually(lambda: asyncio.sleep(0, (ip, 81) not in running.proxy.listening()), timeout=20)
    assert (ip, 80) in running.proxy.listening()
    assert ip in await running.proxy.link.addresses()


async def test_kubernetes_service_reaches_the_api_server(client: Client, running: Running) -> None:
    kubernetes = await client.get(SERVICE, "kubernetes", "default")
    ip, port = kubernetes["spec"]["clusterIP"], kubernetes["spec"]["ports"][0]["port"]
    assert port == 443

    async def readyz() -> tuple[int, str] | None:
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session,
                session.get(f"https://{ip}:{port}/readyz", ssl=False) as response,
            ):
                return response.status, await response.text()
        except (aiohttp.ClientError, TimeoutError):
            return None

    status, body = await eventually(readyz, timeout=20)
    # Anonymous requests may read /readyz; whatever the answer, it came from the API server through the ClusterIP.
    assert (status, body) == (200, "ok") or status in (401, 403), (status, body)


# --- DNS -------------------------------------------------------------------------------------------------------------


async def query(name: str, qtype: str = "A", *, tcp: bool = False) -> DNSRecord:
    question = DNSRecord.question(name, qtype)
    raw = await asyncio.to_thread(question.send, DNS_IP, 53, tcp=tcp, timeout=3)
    reply = DNSRecord.parse(raw)
    assert reply.header.id == question.header.id
    return reply


def addresses(reply: DNSRecord) -> list[str]:
    return sorted(str(rr.rdata) for rr in reply.rr if rr.rtype == QTYPE.A)


async def test_cluster_dns_answers_from_services_and_slices(
    client: Client, namespace: str, running: Running, backends: tuple[str, ...]
) -> None:
    dns_service = await client.get(SERVICE, DNS_SERVICE[1], DNS_SERVICE[0])
    assert dns_service["spec"]["clusterIP"] == DNS_IP
    assert {(p["protocol"], p["port"]) for p in dns_service["spec"]["ports"]} == {("UDP", 53), ("TCP", 53)}
    assert (DNS_IP, 53) not in running.proxy.listening()  # the DNS server serves that address, not the proxy

    web = await create_service(client, namespace, "web")
    await create_service(client, namespace, "db", clusterIP="None")
    await create_service(client, namespace, "all", clusterIP="None", publishNotReadyAddresses=True)
    pods = [slice_endpoint(backends[0], hostname="db-0"), slice_endpoint(backends[1], hostname="db-1", ready=False)]
    await put_slice(client, namespace, "db", pods)
    await put_slice(client, namespace, "all", pods)
    domain = f"{namespace}.svc.cluster.local"

    async def known() -> bool:
        return (await query(f"all.{domain}")).header.rcode == RCODE.NOERROR and bool((await query(f"all.{domain}")).rr)

    await eventually(known, timeout=20)

    for tcp in (False, True):
        reply = await query(f"web.{domain}", tcp=tcp)
        assert (reply.header.rcode, reply.header.aa, addresses(reply)) == (RCODE.NOERROR, 1, [web["spec"]["clusterIP"]])
        assert all(rr.ttl == 5 for rr in reply.rr)
    assert addresses(await query(f"WEB.{namespace.upper()}.SVC.Cluster.Local.")) == [web["spec"]["clusterIP"]]
    assert addresses(await query(f"db.{domain}")) == [backends[0]]  # ready endpoints only
    assert addresses(await query(f"all.{domain}", tcp=True)) == sorted(backends)  # publishNotReadyAddresses
    assert addresses(await query(f"db-0.db.{domain}")) == [backends[0]]
    assert addresses(await query(f"db-1.all.{domain}")) == [backends[1]]
    srv = await query(f"_http._tcp.web.{domain}", "SRV")
    assert [(rr.rdata.port, str(rr.rdata.target)) for rr in srv.rr] == [(80, f"web.{domain}.")]

    nodata = await query(f"web.{domain}", "AAAA")
    assert (nodata.header.rcode, nodata.rr, [rr.rtype for rr in nodata.auth]) == (RCODE.NOERROR, [], [QTYPE.SOA])
    for tcp in (False, True):
        assert (await query(f"nope.{domain}", tcp=tcp)).header.rcode == RCODE.NXDOMAIN
        assert (await query(f"db-1.db.{domain}", tcp=tcp)).header.rcode == RCODE.NXDOMAIN  # not ready
        assert (await query("example.com", tcp=tcp)).header.rcode == RCODE.REFUSED

    # Changes show up without restarting anything.
    await put_slice(client, namespace, "db", [slice_endpoint(b, hostname=f"db-{i}") for i, b in enumerate(backends)])

    async def both_ready() -> bool:
        return addresses(await query(f"db.{domain}")) == sorted(backends)

    await eventually(both_ready, timeout=20)


# --- start and stop --------------------------------------------------------------------------------------------------


async def test_start_removes_stale_addresses_and_close_removes_the_link(
    control_plane: Endpoint, tmp_path: Path
) -> None:
    # What a crashed node leaves behind: the link, with an address whose Service is long gone.
    stale = "10.96.254.254"
    leftover = ServiceLink(SERVICE_LINK)
    await leftover.ensure()
    await leftover.add_address(stale)
    async with running_proxy(control_plane.kubeconfig, proxy_options(control_plane, tmp_path)) as r:

        async def cleaned() -> bool:
            return stale not in await r.proxy.link.addresses()

        await eventually(cleaned, timeout=20)
        kept = await r.proxy.link.addresses()
        assert DNS_IP in kept
        kubernetes = await r.manager.client.get(SERVICE, "kubernetes", "default")
        assert kubernetes["spec"]["clusterIP"] in kept
    # running_proxy checked that the link is gone; closing twice is harmless.
    await r.proxy.close()
    assert SERVICE_LINK not in links()
