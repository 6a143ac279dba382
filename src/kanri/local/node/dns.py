"""Cluster DNS: an authoritative server for the cluster domain, answering from the node's cache.

It follows the Kubernetes DNS specification (the names CoreDNS's ``kubernetes`` plugin serves):

- ``<svc>.<ns>.svc.<domain>``: A, the ClusterIP; for a headless Service the ready endpoints' addresses (all of
  them when it has ``publishNotReadyAddresses``); a CNAME for an ExternalName Service.
- ``<hostname>.<svc>.<ns>.svc.<domain>``: A, the endpoint of a headless Service whose ``hostname`` is that (a
  StatefulSet pod with ``subdomain``: KCM copies the pod's hostname into the EndpointSlice), or whose address,
  dashed (``10-244-0-5``), is that.
- ``_<port>._<proto>.<svc>.<ns>.svc.<domain>``: SRV for the named port, one record to the Service's name, or one
  per endpoint of a headless Service (with the targets' A records as additional data).

A known name asked for another type (AAAA, say) is NOERROR with no answer; an unknown name inside the domain is
NXDOMAIN (both carry the zone's SOA, whose minimum tells resolvers how long to cache that); a name outside the domain is
REFUSED. The server never forwards or recurses: nothing else on the network is ever asked. Records live 5 s, so a
changed Service or endpoint shows within seconds. Until the cache has synced every query gets SERVFAIL (resolvers
retry) rather than a false NXDOMAIN.

The record building is the pure function :func:`resolve`; :class:`ClusterDNS` is the UDP and TCP plumbing around it.
Wire format is dnslib's.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import structlog
from dnslib import CNAME, EDNS0, QTYPE, RCODE, RR, SOA, SRV, A, DNSError, DNSHeader, DNSRecord

from kanri.local.node.options import NodeOptions
from kanri.local.node.services import (
    ServiceProxy,
    cluster_ip,
    endpoints,
    is_headless,
    service_ports,
    slices_of,
)
from kanri.runtime import ApiError, Cache, Client, Request
from kanri.runtime.kinds import ENDPOINT_SLICE, SERVICE

Obj = dict[str, Any]
log = structlog.get_logger("kanri.local.dns")

TTL = 5
"""Seconds every answer (and, through the SOA minimum, every negative answer) may be cached."""
DNS_PORT = 53
DNS_SERVICE = ("kube-system", "kube-dns")
"""The Service that holds the DNS address, under the name kubeadm clusters use (tools look for it)."""
DNS_PORTS = (("dns", DNS_PORT, "UDP"), ("dns-tcp", DNS_PORT, "TCP"))
"""The Service's ports, as ``(name, port, protocol)``."""

_UDP_LIMIT = 512  # without EDNS0 (RFC 1035)
_EDNS_LIMIT = 1232  # what we offer and honour at most: the DNS flag day 2020 size, safe from fragmentation
_TCP_IDLE = 10.0


@dataclass(frozen=True)
class Answer:
    """What :func:`resolve` decided: a response code and the records of each section."""

    rcode: int
    answers: tuple[Any, ...] = ()
    """dnslib ``RR`` objects."""
    authority: tuple[Any, ...] = ()
    additional: tuple[Any, ...] = ()


def _dashed(address: str) -> str:
    return address.replace(".", "-")


def soa(domain: str, ttl: int = TTL) -> Any:
    """The zone's SOA record (its minimum, ``ttl``, is the negative-caching time)."""
    domain = domain.strip(".").lower()
    times = (1, 7200, 1800, 86400, ttl)  # serial, refresh, retry, expire, minimum (CoreDNS's values)
    return RR(domain, QTYPE.SOA, ttl=ttl, rdata=SOA(f"ns.dns.{domain}", f"hostmaster.{domain}", times))


@dataclass(frozen=True)
class _Asked:
    """One question inside the zone, and the answers it can get."""

    qname: str
    """As asked (answers carry it so)."""
    qtype: int
    zone: str
    ttl: int

    @property
    def asks_a(self) -> bool:
        return self.qtype in (QTYPE.A, QTYPE.ANY)

    def records(self, found: list[Any], *, additional: Iterable[Any] = ()) -> Answer:
        """NOERROR: ``found`` is empty for a known name without records of the type asked (NODATA)."""
        return Answer(RCODE.NOERROR, tuple(found), () if found else (soa(self.zone, self.ttl),), tuple(additional))

    def nxdomain(self) -> Answer:
        return Answer(RCODE.NXDOMAIN, authority=(soa(self.zone, self.ttl),))

    def a(self, owner: str, address: str) -> Any:
        return RR(owner, QTYPE.A, ttl=self.ttl, rdata=A(address))


@dataclass(frozen=True)
class _NamedService:
    """The Service a question names, with its EndpointSlices and its own name in the zone."""

    service: Obj
    slices: list[Obj]
    base: str
    """``<svc>.<ns>.svc.<zone>``."""

    def eligible(self, port_name: str | None = None) -> list[Any]:
        """The endpoints DNS publishes: ready ones, or all with ``publishNotReadyAddresses``."""
        publish_all = bool((self.service.get("spec") or {}).get("publishNotReadyAddresses"))
        return sorted(
            (e for e in endpoints(self.slices, port_name) if e.ready or publish_all),
            key=lambda e: (e.hostname or "", e.address),
        )


def resolve(
    qname: str, qtype: int, services: Iterable[Obj], slices: Iterable[Obj], *, domain: str, ttl: int = TTL
) -> Answer:
    """Answer one question from ``services`` and ``slices`` (any superset of the namespace asked about will do).

    ``qname`` is matched case-insensitively; answers carry it as asked.
    """
    name, zone = qname.strip(".").lower(), domain.strip(".").lower()
    if name != zone and not name.endswith("." + zone):
        return Answer(RCODE.REFUSED)
    labels = name[: -len(zone)].rstrip(".").split(".") if name != zone else []
    asked = _Asked(qname, qtype, zone, ttl)
    if not labels:
        return asked.records([soa(zone, ttl)] if qtype in (QTYPE.SOA, QTYPE.ANY) else [])
    if labels[-1] != "svc":
        return asked.nxdomain()  # pod records (<a-b-c-d>.<ns>.pod.<zone>) are not served: deprecated, and insecure
    if len(labels) == 1:
        return asked.records([])
    namespace = labels[-2]
    in_namespace = [s for s in services if s["metadata"].get("namespace") == namespace]
    if len(labels) == 2:
        return asked.records([]) if in_namespace else asked.nxdomain()
    service = next((s for s in in_namespace if s["metadata"]["name"] == labels[-3]), None)
    if service is None:
        return asked.nxdomain()
    named = _NamedService(service, slices_of(service, slices), f"{labels[-3]}.{namespace}.svc.{zone}")
    if len(labels) == 3:
        return _service_records(asked, named)
    if len(labels) == 4 and not labels[0].startswith("_"):
        return _pod_records(asked, named, labels[0])
    if len(labels) == 5 and labels[0].startswith("_") and labels[1].startswith("_"):
        return _srv_records(asked, named, labels[0][1:], labels[1][1:].upper())
    return asked.nxdomain()


def _service_records(asked: _Asked, named: _NamedService) -> Answer:
    """``<svc>.<ns>.svc.<zone>``: a CNAME (ExternalName), the ready endpoints (headless) or the ClusterIP."""
    spec = named.service.get("spec") or {}
    if spec.get("type") == "ExternalName":
        target = str(spec.get("externalName") or "").strip(".")
        return asked.records([RR(asked.qname, QTYPE.CNAME, ttl=asked.ttl, rdata=CNAME(target))] if target else [])
    if is_headless(named.service):
        return asked.records([asked.a(asked.qname, e.address) for e in named.eligible()] if asked.asks_a else [])
    ip = cluster_ip(named.service)
    return asked.records([asked.a(asked.qname, ip)] if asked.asks_a and ip else [])


def _pod_records(asked: _Asked, named: _NamedService, label: str) -> Answer:
    """A pod's own name under its headless Service: the hostname KCM copied from the pod, or its dashed address."""
    if not is_headless(named.service):
        return asked.nxdomain()
    matching = [e for e in named.eligible() if (e.hostname or "").lower() == label or _dashed(e.address) == label]
    if not matching:
        return asked.nxdomain()
    return asked.records([asked.a(asked.qname, e.address) for e in matching] if asked.asks_a else [])


def _srv_records(asked: _Asked, named: _NamedService, port_name: str, protocol: str) -> Answer:
    """``_<port>._<proto>.<svc>...``: one SRV to the Service's name, or one per endpoint of a headless Service (the
    targets' A records as additional data)."""
    service = named.service
    port = next((p for p in service_ports(service, protocol) if (p.get("name") or "").lower() == port_name), None)
    if port is None:
        return asked.nxdomain()
    if asked.qtype not in (QTYPE.SRV, QTYPE.ANY):
        return asked.records([])
    if not is_headless(service):
        ip = cluster_ip(service)
        srv = RR(asked.qname, QTYPE.SRV, ttl=asked.ttl, rdata=SRV(0, 100, int(port["port"]), named.base))
        return asked.records([srv], additional=[asked.a(named.base, ip)] if ip else [])
    targets = [e for e in named.eligible(port.get("name") or "") if e.port is not None]
    weight = max(1, 100 // len(targets)) if targets else 0
    answers, extra = [], []
    for e in targets:
        target = f"{(e.hostname or _dashed(e.address)).lower()}.{named.base}"
        answers.append(RR(asked.qname, QTYPE.SRV, ttl=asked.ttl, rdata=SRV(0, weight, e.port, target)))
        extra.append(asked.a(target, e.address))
    return asked.records(answers, additional=extra)


def _namespace_asked(qname: str, domain: str) -> str | None:
    """The namespace label of ``...<ns>.svc.<domain>``, to narrow what the cache hands :func:`resolve`."""
    labels = qname.strip(".").lower().split(".")
    zone = domain.strip(".").lower().split(".")
    head = labels[: len(labels) - len(zone)]
    if labels[len(labels) - len(zone) :] != zone or len(head) < 2 or head[-1] != "svc":
        return None
    return head[-2]


class ClusterDNS:
    """The DNS server for ``NodeOptions.cluster_dns_ip``, port 53, UDP and TCP.

    ``start()`` asks ``proxy`` where to listen and binds there: with kube-proxy on the bridge's address, which an
    EndpointSlice of ``kube-dns`` names (kube-proxy DNATs the ClusterIP to it); with the userspace proxy on the
    ClusterIP itself, which the proxy puts on the service link and keeps there. ``close()`` unbinds. The answers
    come from ``cache`` — the node Manager's, which must be running for the server to be useful (queries get
    SERVFAIL until it has synced).
    """

    def __init__(self, cache: Cache, options: NodeOptions, proxy: ServiceProxy) -> None:
        self._cache = cache
        self._options = options
        self._proxy = proxy
        self._udp: asyncio.DatagramTransport | None = None
        self._tcp: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self.bound: tuple[str, int] | None = None
        """Where the server listens once started: the ClusterIP, or the bridge's address under kube-proxy."""
        for kind in (SERVICE, ENDPOINT_SLICE):
            cache.informer(kind)  # the Manager's cache runs the informers of every kind asked for before it starts

    @property
    def address(self) -> tuple[str, int]:
        """Where the server listens: ``(cluster_dns_ip, 53)``."""
        return self._options.cluster_dns_ip, DNS_PORT

    async def start(self) -> None:
        """Bind UDP and TCP where the DNS address reaches (see the class docstring)."""
        service = Request(*DNS_SERVICE)
        host = await self._proxy.serve_on_host(service, self._options.cluster_dns_ip, DNS_PORTS)
        self.bound = (host, DNS_PORT)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _UDPProtocol(self), local_addr=self.bound)
        self._udp = transport
        self._tcp = await asyncio.start_server(self._serve_tcp, *self.bound, reuse_address=True)
        log.info("cluster DNS listening", address=f"{self._options.cluster_dns_ip}:{DNS_PORT}",
                 bound=f"{host}:{DNS_PORT}", domain=self._options.cluster_domain)  # fmt: skip

    async def close(self) -> None:
        """Stop answering (the address stays until the proxy closes the link)."""
        if self._udp is not None:
            self._udp.close()
            self._udp = None
        if self._tcp is not None:
            self._tcp.close()
            for task in list(self._connections):
                task.cancel()
            await asyncio.gather(*self._connections, return_exceptions=True)
            await self._tcp.wait_closed()
            self._tcp = None

    def respond(self, data: bytes, *, udp: bool) -> bytes | None:
        """The packed response to the packed query ``data`` (None when it is not a query worth answering)."""
        try:
            query = DNSRecord.parse(data)
        except (DNSError, ValueError, IndexError, struct.error):
            return None  # garbage: a server stays silent
        if query.header.qr:
            return None  # a response, not a query
        reply = DNSRecord(
            DNSHeader(id=query.header.id, qr=1, aa=1, ra=0, rd=query.header.rd, opcode=query.header.opcode)
        )
        reply.questions = list(query.questions)
        edns = next((rr for rr in query.ar if rr.rtype == QTYPE.OPT), None)
        if edns is not None:
            reply.add_ar(EDNS0(udp_len=_EDNS_LIMIT))
        if query.header.opcode != 0:
            reply.header.rcode = RCODE.NOTIMP
        elif len(query.questions) != 1:
            reply.header.rcode = RCODE.FORMERR
        elif not self._cache.synced([SERVICE, ENDPOINT_SLICE]):
            reply.header.rcode = RCODE.SERVFAIL
        else:
            question = query.questions[0]
            qname = str(question.qname)
            namespace = _namespace_asked(qname, self._options.cluster_domain)
            services = self._cache.list(SERVICE, namespace) if namespace is not None else []
            slices = self._cache.list(ENDPOINT_SLICE, namespace) if namespace is not None else []
            answer = resolve(qname, question.qtype, services, slices, domain=self._options.cluster_domain)
            reply.header.rcode = answer.rcode
            reply.rr, reply.auth = list(answer.answers), list(answer.authority)
            reply.ar = list(answer.additional) + reply.ar
        packed: bytes = reply.pack()
        if udp:
            limit = max(_UDP_LIMIT, min(_EDNS_LIMIT, int(edns.rclass))) if edns is not None else _UDP_LIMIT
            if len(packed) > limit:
                # Too big for this datagram: the question alone, with TC set, tells the resolver to ask over TCP.
                reply.rr, reply.auth, reply.ar = [], [], [rr for rr in reply.ar if rr.rtype == QTYPE.OPT]
                reply.header.tc = 1
                packed = reply.pack()
        return packed

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Length-prefixed messages (RFC 1035 4.2.2), as many as the client sends, until it goes quiet."""
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            while True:
                async with asyncio.timeout(_TCP_IDLE):
                    (length,) = struct.unpack("!H", await reader.readexactly(2))
                    data = await reader.readexactly(length)
                response = self.respond(data, udp=False)
                if response is None:
                    break
                writer.write(struct.pack("!H", len(response)) + response)
                await writer.drain()
        except (asyncio.IncompleteReadError, TimeoutError, OSError):
            pass  # the client is done (or gone)
        finally:
            self._connections.discard(task)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


class _UDPProtocol(asyncio.DatagramProtocol):
    def __init__(self, server: ClusterDNS) -> None:
        self._server = server
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Python 3.11's selector datagram transport does not subclass DatagramTransport, though it is one.
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        try:
            response = self._server.respond(data, udp=True)
        except Exception:  # one bad query must not take the server down
            log.exception("DNS query failed")
            return
        if response is not None and self._transport is not None:
            self._transport.sendto(response, addr)


def dns_service(options: NodeOptions) -> Obj:
    """The selector-less ``kube-system/kube-dns`` Service holding the DNS address."""
    namespace, name = DNS_SERVICE
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS", "app.kubernetes.io/managed-by": "kanri"},
        },
        "spec": {
            "clusterIP": options.cluster_dns_ip,
            "ports": [
                {"name": "dns", "port": DNS_PORT, "protocol": "UDP", "targetPort": DNS_PORT},
                {"name": "dns-tcp", "port": DNS_PORT, "protocol": "TCP", "targetPort": DNS_PORT},
            ],
        },
    }


async def reserve_dns_service(client: Client, options: NodeOptions) -> Obj:
    """Create ``kube-system/kube-dns`` with ClusterIP ``options.cluster_dns_ip`` unless it exists, so the API server
    never gives that address to another Service. Returns the Service (an existing one with another address is kept
    and logged: ClusterIPs are immutable, and deleting a Service someone made is not ours to do)."""
    namespace, name = DNS_SERVICE
    try:
        return await client.create(SERVICE, dns_service(options))
    except ApiError as exc:
        # The API server allocates the ClusterIP before it looks for the name: an existing kube-dns answers 422
        # ("provided IP is already allocated"), not 409.
        if exc.status not in (409, 422):
            raise
        try:
            existing = await client.get(SERVICE, name, namespace)
        except ApiError:
            raise exc from None
    if existing["spec"].get("clusterIP") != options.cluster_dns_ip:
        log.warning("DNS service has another address", service=f"{namespace}/{name}",
                    cluster_ip=existing["spec"].get("clusterIP"), dns_ip=options.cluster_dns_ip)  # fmt: skip
    return existing
