"""TLS for a cluster: its CA, its server certificate, and when either must be (re)issued. Pure: no API calls.

Three Secrets per cluster (names in :mod:`kanri.postgres.names`):

| Secret | type | keys | who reads it |
|---|---|---|---|
| ``<cluster>-ca`` | Opaque | ``ca.crt`` | clients (``sslmode=verify-full``), the operator |
| ``<cluster>-ca-key`` | Opaque | ``ca.crt``, ``ca.key`` | the operator only (signs server certificates) |
| ``<cluster>-server`` | kubernetes.io/tls | ``tls.crt``, ``tls.key``, ``ca.crt`` | the instance pods (mounted) |

The CA's private key is kept apart from the published CA certificate: whoever may read ``<cluster>-ca`` to verify
the server cannot sign a certificate the cluster's clients would trust. The operator generates what is missing and
marks what it made with :data:`MANAGED`; a Secret without the mark (a user's, e.g. written by cert-manager as
``<cluster>-server`` with ``ca.crt``) is adopted and never overwritten — its renewal is its owner's business. A
managed server certificate is reissued when a third of its lifetime remains, when its names no longer cover the
cluster's, or when it is not signed by the current CA; the instances pick the new files up and reload PostgreSQL.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kanri.postgres import names
from kanri.postgres.labels import cluster_labels

__all__ = [
    "CA_LIFETIME",
    "MANAGED",
    "SERVER_LIFETIME",
    "Issued",
    "build_ca",
    "build_server",
    "ca_key_secret",
    "ca_secret",
    "dns_names",
    "expiry",
    "needs_renewal",
    "server_secret",
]

Obj = dict[str, Any]

MANAGED = "kanri.dev/tls-managed"
"""Annotation on the TLS Secrets the operator generated (and so may replace); absent on adopted ones."""

CA_LIFETIME = dt.timedelta(days=3650)
SERVER_LIFETIME = dt.timedelta(days=365)
RENEW_FRACTION = 1 / 3
"""A managed server certificate is reissued once less than this fraction of its lifetime remains."""


@dataclass(frozen=True)
class Issued:
    """A certificate and its private key, both PEM."""

    cert: bytes
    key: bytes


def dns_names(cluster: str, namespace: str, instances: list[str]) -> list[str]:
    """Every name a client may use: the three Services in short, namespaced, ``.svc`` and ``.svc.cluster.local``
    forms, each instance's pod under the ``-r`` headless-style Service, and the instance names themselves."""
    services = [names.read_write_service(cluster), names.read_only_service(cluster), names.read_service(cluster)]
    found: list[str] = []
    for service in services:
        found += [
            service,
            f"{service}.{namespace}",
            f"{service}.{namespace}.svc",
            f"{service}.{namespace}.svc.cluster.local",
        ]
    for instance in instances:
        pod = names.pod_name(instance)
        found += [instance, pod, f"{pod}.{names.read_service(cluster)}.{namespace}.svc"]
    return list(dict.fromkeys(found))


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def build_ca(cluster: str, namespace: str, now: dt.datetime, lifetime: dt.timedelta = CA_LIFETIME) -> Issued:
    """A self-signed CA for one cluster."""
    key = _key()
    # a common name holds at most 64 characters: the cluster's name (at most 40) fits, its namespace may not
    common_name = f"{cluster}.{namespace}"[:55] + " kanri CA"
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))  # a node whose clock is a little behind still accepts it
        .not_valid_after(now + lifetime)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
        )  # keyCertSign and cRLSign only
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return Issued(cert.public_bytes(serialization.Encoding.PEM), _pem_key(key))


def build_server(
    ca: Issued, common_name: str, dns: list[str], now: dt.datetime, lifetime: dt.timedelta = SERVER_LIFETIME
) -> Issued:
    """A server certificate for ``dns`` (and 127.0.0.1), signed by ``ca``."""
    ca_cert = x509.load_pem_x509_certificate(ca.cert)
    ca_key = serialization.load_pem_private_key(ca.key, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise ValueError("the CA key is not an EC key")
    common_name = common_name[:64]
    key = _key()
    alt: list[x509.GeneralName] = [x509.DNSName(n) for n in dns]
    alt.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + lifetime)
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


def needs_renewal(cert_pem: bytes, ca_pem: bytes, dns: list[str], now: dt.datetime) -> str | None:
    """Why a managed server certificate must be reissued now, or None: unreadable, less than a third of its
    lifetime left, a wanted name missing, or not issued by this CA."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
    except ValueError:
        return "the certificate does not parse"
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if end - now < (end - start) * RENEW_FRACTION:
        return f"it expires at {end.isoformat()}"
    try:
        present = set(
            cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
        )
    except x509.ExtensionNotFound:
        present = set()
    if missing := [n for n in dns if n not in present]:
        return f"it does not name {missing[0]}"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, Exception):  # InvalidSignature is not a ValueError
        return "it is not signed by the cluster's CA"
    return None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secret(cluster: str, namespace: str, name: str, kind: str, data: dict[str, bytes]) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": cluster_labels(cluster),
            "annotations": {MANAGED: "true"},
        },
        "type": kind,
        "data": {k: _b64(v) for k, v in data.items()},
    }


def ca_secret(cluster: str, namespace: str, ca_cert: bytes) -> Obj:
    """``<cluster>-ca``: the published CA certificate."""
    return _secret(cluster, namespace, names.ca_secret(cluster), "Opaque", {"ca.crt": ca_cert})


def ca_key_secret(cluster: str, namespace: str, ca: Issued) -> Obj:
    """``<cluster>-ca-key``: the CA with its private key (the operator's only)."""
    return _secret(cluster, namespace, names.ca_key_secret(cluster), "Opaque", {"ca.crt": ca.cert, "ca.key": ca.key})


def server_secret(cluster: str, namespace: str, server: Issued, ca_cert: bytes) -> Obj:
    """``<cluster>-server``: what the pods mount (cert-manager's layout)."""
    data = {"tls.crt": server.cert, "tls.key": server.key, "ca.crt": ca_cert}
    return _secret(cluster, namespace, names.server_secret(cluster), "kubernetes.io/tls", data)
