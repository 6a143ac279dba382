"""A cluster's own certificate authority and the server certificates it signs (pure: no API calls).

An operator that serves TLS for a workload keeps one long-lived CA per cluster (its certificate published to
clients, its key only in a Secret the operator reads) and reissues the short-lived server certificate from it
before it expires, so clients that trust the CA never notice a renewal. Keys are ECDSA P-256 (cheap to make,
accepted by OpenSSL, Java and Go alike), PEM, PKCS#8, unencrypted (a Secret is their protection).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["CA_LIFETIME", "SERVER_LIFETIME", "Issued", "build_ca", "build_server", "expiry", "needs_renewal"]

CA_LIFETIME = dt.timedelta(days=3650)
SERVER_LIFETIME = dt.timedelta(days=365)
RENEW_FRACTION = 1 / 3
"""A server certificate is reissued once less than this fraction of its lifetime remains (cert-manager's
default)."""
_CLOCK_SKEW = dt.timedelta(minutes=5)
"""Certificates start this much before now: a peer whose clock is a little behind still accepts them."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert: bytes
    key: bytes


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())  # fmt: skip


def build_ca(common_name: str, now: dt.datetime, lifetime: dt.timedelta = CA_LIFETIME) -> Issued:
    """A self-signed CA (``common_name`` cut to X.509's 64 characters)."""
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        # keyCertSign and cRLSign only
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def build_server(
    ca: Issued,
    dns_names: Sequence[str],
    now: dt.datetime,
    lifetime: dt.timedelta = SERVER_LIFETIME,
    ip_addresses: Sequence[str] = (),
    common_name: str | None = None,
) -> Issued:
    """A server certificate for ``dns_names`` (wildcards allowed) and ``ip_addresses``, signed by ``ca`` and never
    outliving it; its common name is ``common_name`` or the first name (TLS clients check the subject alternative
    names only)."""
    if not dns_names and not ip_addresses:
        raise ValueError("a server certificate needs at least one DNS name or IP address")
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    key = _key()
    alt: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    alt += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    common_name = (common_name or str((list(dns_names) or list(ip_addresses))[0]))[:64]
    end = min(now + lifetime, ca_cert.not_valid_after_utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def expiry(cert_pem: bytes) -> dt.datetime:
    """When the certificate expires (UTC)."""
    return x509.load_pem_x509_certificate(cert_pem).not_valid_after_utc


def needs_renewal(cert_pem: bytes, ca_pem: bytes, dns_names: Sequence[str], now: dt.datetime) -> str | None:
    """Why a server certificate must be reissued now, or None: unreadable, less than a third of its lifetime left
    (unless it already ends with the CA that signed it: a new one could not last longer — renewing the CA renews it),
    a wanted name missing, or not signed by this CA."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        return "the certificate does not parse"
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    with_its_ca = end >= ca.not_valid_after_utc - dt.timedelta(minutes=1)
    if end - now < (end - start) * RENEW_FRACTION and not (with_its_ca and end > now):
        return f"it expires at {end.isoformat()}"
    try:
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        present = set(names.get_values_for_type(x509.DNSName))
    except x509.ExtensionNotFound:
        present = set()
    if missing := [name for name in dns_names if name not in present]:
        return f"it does not name {missing[0]}"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return "it is not signed by the cluster's CA"
    return None
