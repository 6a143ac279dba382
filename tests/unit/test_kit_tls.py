"""The kit's certificate authority (kanri.kit.tls): a CA that signs server certificates, and when one is due."""

from __future__ import annotations

import datetime as dt

from cryptography import x509

from kanri.kit import tls

NOW = dt.datetime(2026, 12, 7, tzinfo=dt.UTC)


def test_a_server_certificate_names_what_it_was_asked_for_and_is_signed_by_the_ca() -> None:
    ca = tls.build_ca("events.shop kanri kafka CA", NOW)
    server = tls.build_server(ca, ["*.events-brokers.shop.svc", "events-bootstrap"], NOW, ip_addresses=["127.0.0.1"])
    cert = x509.load_pem_x509_certificate(server.cert)
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["*.events-brokers.shop.svc", "events-bootstrap"]
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.cert))
    assert tls.expiry(server.cert) == NOW + tls.SERVER_LIFETIME
    assert tls.expiry(ca.cert) == NOW + tls.CA_LIFETIME
    assert b"PRIVATE KEY" in server.key


def test_renewal_is_due_late_in_life_for_a_missing_name_or_another_ca() -> None:
    ca = tls.build_ca("ca", NOW)
    names = ["a.svc", "b.svc"]
    server = tls.build_server(ca, names, NOW)
    assert tls.needs_renewal(server.cert, ca.cert, names, NOW) is None
    late = NOW + tls.SERVER_LIFETIME * 0.7
    assert (tls.needs_renewal(server.cert, ca.cert, names, late) or "").startswith("it expires at")
    assert tls.needs_renewal(server.cert, ca.cert, [*names, "c.svc"], NOW) == "it does not name c.svc"
    other = tls.build_ca("other", NOW)
    assert tls.needs_renewal(server.cert, other.cert, names, NOW) == "it is not signed by the cluster's CA"
    assert tls.needs_renewal(b"junk", ca.cert, names, NOW) == "the certificate does not parse"
