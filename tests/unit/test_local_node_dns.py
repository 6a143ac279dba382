"""Cluster DNS records and endpoint reading, without sockets: :func:`kanri.local.node.dns.resolve` and the
EndpointSlice helpers of :mod:`kanri.local.node.services` it shares with the proxy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from dnslib import QTYPE, RCODE, DNSRecord

from kanri.local.node.dns import ClusterDNS, _namespace_asked, resolve
from kanri.local.node.options import NodeOptions
from kanri.local.node.services import endpoints, proxy_targets

Obj = dict[str, Any]
DOMAIN = "cluster.local"


def service(name: str, namespace: str = "ns", cluster_ip: str = "10.96.0.20", **spec: Any) -> Obj:
    ports = spec.pop("ports", [{"name": "http", "port": 80, "protocol": "TCP"}])
    return {
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterIP": cluster_ip, "ports": ports, **spec},
    }


def endpoint(address: str, hostname: str | None = None, **conditions: bool) -> Obj:
    item: Obj = {"addresses": [address], "conditions": conditions}
    if hostname:
        item["hostname"] = hostname
    return item


def endpoint_slice(
    service_name: str, items: list[Obj], *, namespace: str = "ns", port: int = 8080, **extra: Any
) -> Obj:
    return {
        "metadata": {
            "name": f"{service_name}-{len(items)}",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": extra.pop("address_type", "IPv4"),
        "endpoints": items,
        "ports": extra.pop("ports", [{"name": "http", "port": port, "protocol": "TCP"}]),
    }


HEADLESS = service("db", cluster_ip="None", ports=[{"name": "pg", "port": 5432}])
HEADLESS_SLICE = endpoint_slice(
    "db",
    [
        endpoint("10.244.0.5", "db-0", ready=True),
        endpoint("10.244.0.6", "db-1"),  # no conditions at all: ready
        endpoint("10.244.0.7", "db-2", ready=False),
    ],
    ports=[{"name": "pg", "port": 5432, "protocol": "TCP"}],
)
SERVICES = [service("web"), HEADLESS, service("web", namespace="other", cluster_ip="10.96.0.99")]
SLICES = [HEADLESS_SLICE]


def ask(
    name: str, qtype: str = "A", services: list[Obj] = SERVICES, slices: list[Obj] = SLICES
) -> tuple[int, list[str]]:
    answer = resolve(name, getattr(QTYPE, qtype), services, slices, domain=DOMAIN)
    return answer.rcode, sorted(str(rr.rdata) for rr in answer.answers)


def test_service_name_gives_its_cluster_ip_case_insensitively() -> None:
    assert ask("web.ns.svc.cluster.local.") == (RCODE.NOERROR, ["10.96.0.20"])
    assert ask("WEB.Ns.SVC.cluster.LOCAL") == (RCODE.NOERROR, ["10.96.0.20"])
    assert ask("web.other.svc.cluster.local") == (RCODE.NOERROR, ["10.96.0.99"])
    answer = resolve("Web.ns.svc.cluster.local.", QTYPE.A, SERVICES, SLICES, domain=DOMAIN)
    assert [(str(rr.rname), rr.ttl) for rr in answer.answers] == [("Web.ns.svc.cluster.local.", 5)]


def test_known_name_other_type_is_nodata_with_the_soa() -> None:
    answer = resolve("web.ns.svc.cluster.local", QTYPE.AAAA, SERVICES, SLICES, domain=DOMAIN)
    assert (answer.rcode, answer.answers) == (RCODE.NOERROR, ())
    assert [rr.rtype for rr in answer.authority] == [QTYPE.SOA]
    assert answer.authority[0].rdata.times[-1] == 5  # negative answers are cached no longer than positive ones


@pytest.mark.parametrize(
    "name",
    [
        "nope.ns.svc.cluster.local",
        "web.nowhere.svc.cluster.local",
        "nowhere.svc.cluster.local",
        "web.ns.cluster.local",
        "10-244-0-5.ns.pod.cluster.local",
        "x.web.ns.svc.cluster.local",  # web is not headless: no per-endpoint names
        "db-2.db.ns.svc.cluster.local",  # not ready
        "a.b.c.d.e.f.svc.cluster.local",
    ],
)
def test_unknown_names_in_the_domain_are_nxdomain(name: str) -> None:
    answer = resolve(name, QTYPE.A, SERVICES, SLICES, domain=DOMAIN)
    assert answer.rcode == RCODE.NXDOMAIN
    assert [rr.rtype for rr in answer.authority] == [QTYPE.SOA]


@pytest.mark.parametrize("name", ["example.com", "kubernetes.io.", "cluster.local.evil.com", "notcluster.local"])
def test_names_outside_the_domain_are_refused(name: str) -> None:
    assert resolve(name, QTYPE.A, SERVICES, SLICES, domain=DOMAIN).rcode == RCODE.REFUSED


def test_zone_structure_names_exist() -> None:
    assert ask("cluster.local", "SOA")[0] == RCODE.NOERROR
    assert resolve("cluster.local", QTYPE.SOA, [], [], domain=DOMAIN).answers[0].rtype == QTYPE.SOA
    assert ask("svc.cluster.local") == (RCODE.NOERROR, [])
    assert ask("ns.svc.cluster.local") == (RCODE.NOERROR, [])


def test_headless_service_gives_ready_endpoints() -> None:
    assert ask("db.ns.svc.cluster.local") == (RCODE.NOERROR, ["10.244.0.5", "10.244.0.6"])


def test_headless_service_publishing_not_ready_addresses_gives_all() -> None:
    publishing = service("db", cluster_ip="None", publishNotReadyAddresses=True)
    assert ask("db.ns.svc.cluster.local", services=[publishing]) == (
        RCODE.NOERROR,
        ["10.244.0.5", "10.244.0.6", "10.244.0.7"],
    )
    assert ask("db-2.db.ns.svc.cluster.local", services=[publishing]) == (RCODE.NOERROR, ["10.244.0.7"])


def test_headless_service_without_endpoints_is_nodata() -> None:
    assert ask("db.ns.svc.cluster.local", slices=[]) == (RCODE.NOERROR, [])


def test_endpoint_hostname_and_dashed_address() -> None:
    assert ask("db-0.db.ns.svc.cluster.local") == (RCODE.NOERROR, ["10.244.0.5"])
    assert ask("DB-1.db.ns.svc.cluster.local") == (RCODE.NOERROR, ["10.244.0.6"])
    assert ask("10-244-0-6.db.ns.svc.cluster.local") == (RCODE.NOERROR, ["10.244.0.6"])
    assert ask("db-0.db.ns.svc.cluster.local", "AAAA") == (RCODE.NOERROR, [])


def test_slices_of_other_services_namespaces_and_families_do_not_count() -> None:
    slices = [
        endpoint_slice("db", [endpoint("10.244.1.1")], namespace="other"),
        endpoint_slice("web", [endpoint("10.244.1.2")]),
        endpoint_slice("db", [endpoint("fd00::1")], address_type="IPv6"),
    ]
    assert ask("db.ns.svc.cluster.local", slices=slices) == (RCODE.NOERROR, [])


def test_srv_for_a_cluster_ip_service_points_at_the_service_name() -> None:
    answer = resolve("_http._tcp.web.ns.svc.cluster.local", QTYPE.SRV, SERVICES, SLICES, domain=DOMAIN)
    assert answer.rcode == RCODE.NOERROR
    [srv] = answer.answers
    assert (srv.rdata.port, str(srv.rdata.target)) == (80, "web.ns.svc.cluster.local.")
    assert [str(rr.rdata) for rr in answer.additional] == ["10.96.0.20"]
    assert ask("_nope._tcp.web.ns.svc.cluster.local", "SRV")[0] == RCODE.NXDOMAIN
    assert ask("_http._udp.web.ns.svc.cluster.local", "SRV")[0] == RCODE.NXDOMAIN
    assert ask("_http._tcp.web.ns.svc.cluster.local", "A") == (RCODE.NOERROR, [])


def test_srv_for_a_headless_service_lists_ready_endpoints_by_name() -> None:
    answer = resolve("_pg._tcp.db.ns.svc.cluster.local", QTYPE.SRV, SERVICES, SLICES, domain=DOMAIN)
    targets = sorted((str(rr.rdata.target), rr.rdata.port) for rr in answer.answers)
    assert targets == [("db-0.db.ns.svc.cluster.local.", 5432), ("db-1.db.ns.svc.cluster.local.", 5432)]
    assert sorted(str(rr.rdata) for rr in answer.additional) == ["10.244.0.5", "10.244.0.6"]


def test_external_name_is_a_cname() -> None:
    external = service("ext", cluster_ip="", type="ExternalName", externalName="db.example.com")
    answer = resolve("ext.ns.svc.cluster.local", QTYPE.A, [external], [], domain=DOMAIN)
    assert [(rr.rtype, str(rr.rdata)) for rr in answer.answers] == [(QTYPE.CNAME, "db.example.com.")]


def test_namespace_asked() -> None:
    assert _namespace_asked("a.NS.svc.cluster.local.", DOMAIN) == "ns"
    assert _namespace_asked("_p._tcp.a.ns.svc.cluster.local", DOMAIN) == "ns"
    assert _namespace_asked("svc.cluster.local", DOMAIN) is None
    assert _namespace_asked("a.ns.svc.example.com", DOMAIN) is None


# --- the proxy's choice of endpoints ---------------------------------------------------------------------------------


def test_endpoint_conditions_default_as_the_api_documents() -> None:
    [plain, not_ready, draining] = endpoints(
        [
            endpoint_slice(
                "web",
                [
                    endpoint("10.244.0.1"),
                    endpoint("10.244.0.2", ready=False),
                    endpoint("10.244.0.3", ready=False, serving=True, terminating=True),
                ],
            )
        ],
        "http",
    )
    assert (plain.ready, plain.serving, plain.terminating, plain.port) == (True, True, False, 8080)
    assert (not_ready.ready, not_ready.serving) == (False, False)
    assert (draining.ready, draining.serving, draining.terminating) == (False, True, True)


def test_proxy_targets_ready_then_serving_terminating() -> None:
    web = service("web", ports=[{"name": "http", "port": 80}, {"name": "metrics", "port": 9090}])
    ready = endpoint_slice("web", [endpoint("10.244.0.1"), endpoint("10.244.0.2", ready=False)])
    assert proxy_targets(web, [ready], 80) == [("10.244.0.1", 8080)]
    assert proxy_targets(web, [ready], 9090) == []  # the slice has no "metrics" port
    assert proxy_targets(web, [ready], 81) == []  # not a port of the Service
    draining = endpoint_slice(
        "web",
        [
            endpoint("10.244.0.3", ready=False, serving=True, terminating=True),
            endpoint("10.244.0.4", ready=False, serving=False, terminating=True),
        ],
    )
    assert proxy_targets(web, [draining], 80) == [("10.244.0.3", 8080)]
    assert sorted(proxy_targets(web, [ready, draining], 80)) == [("10.244.0.1", 8080)]  # ready ones win


def test_proxy_targets_unnamed_single_port() -> None:
    single = service("one", ports=[{"port": 80}])
    slice_ = endpoint_slice("one", [endpoint("10.244.0.9")], ports=[{"port": 3000}])
    assert proxy_targets(single, [slice_], 80) == [("10.244.0.9", 3000)]


# --- the message layer (no sockets: respond() is bytes in, bytes out) ------------------------------------------------


class _SyncedCache:
    """Enough of a Cache for ClusterDNS.respond: two kinds, always synced."""

    def __init__(self, services: list[Obj], slices: list[Obj]) -> None:
        self._objects = {"Service": services, "EndpointSlice": slices}

    def informer(self, kind: Any) -> None:
        return None

    def synced(self, kinds: Any = None) -> bool:
        return True

    def list(self, kind: Any, namespace: str | None = None, labels: Any = None) -> list[Obj]:
        return [o for o in self._objects[kind.kind] if namespace is None or o["metadata"]["namespace"] == namespace]


def _server(services: list[Obj], slices: list[Obj]) -> ClusterDNS:
    return ClusterDNS(_SyncedCache(services, slices), NodeOptions(data_dir=Path("/nonexistent")), None)  # type: ignore[arg-type]


def test_respond_packs_authoritative_answers_and_truncates_big_udp_answers() -> None:
    many = endpoint_slice("db", [endpoint(f"10.244.1.{i}") for i in range(1, 60)])
    server = _server([HEADLESS], [many])
    query = DNSRecord.question("db.ns.svc.cluster.local", "A")
    reply = DNSRecord.parse(server.respond(query.pack(), udp=False))
    assert (reply.header.id, reply.header.aa, reply.header.ra, reply.header.tc) == (query.header.id, 1, 0, 0)
    assert len(reply.rr) == 59
    truncated = DNSRecord.parse(server.respond(query.pack(), udp=True))
    assert (truncated.header.tc, truncated.rr, str(truncated.q.qname)) == (1, [], "db.ns.svc.cluster.local.")
    assert server.respond(b"\x00garbage", udp=True) is None
    refused = DNSRecord.parse(server.respond(DNSRecord.question("example.com").pack(), udp=True))
    assert refused.header.rcode == RCODE.REFUSED
