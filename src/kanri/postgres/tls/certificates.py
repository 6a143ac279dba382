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

Whatever the operator reads from these Secrets is checked first (:func:`server_problems`, :func:`ca_problems`,
:func:`ca_key_problems`): every key parses as PEM, the private key belongs to the certificate, ``ca.crt`` issues
``tls.crt`` (the operator verifies the instances with it), the certificate has not expired. A problem names the key
and what is wrong, never a value.
"""

from __future__ import annotations

import base64
import datetime as dt
import itertools
import ssl
from collections.abc import Mapping
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from kanri.contract.secrets import SecretProblem
from kanri.kit import tls
from kanri.postgres import names
from kanri.postgres.labels import cluster_labels

__all__ = [
    "CA_LIFETIME",
    "MANAGED",
    "SERVER_LIFETIME",
    "Issued",
    "build_ca",
    "build_server",
    "ca_key_problems",
    "ca_key_secret",
    "ca_problems",
    "ca_secret",
    "dns_names",
    "expiry",
    "needs_renewal",
    "server_problems",
    "server_secret",
]

Obj = dict[str, Any]

MANAGED = "kanri.dev/tls-managed"
"""Annotation on the TLS Secrets the operator generated (and so may replace); absent on adopted ones."""

CA_LIFETIME = tls.CA_LIFETIME
SERVER_LIFETIME = tls.SERVER_LIFETIME
RENEW_FRACTION = tls.RENEW_FRACTION
"""A managed server certificate is reissued once less than this fraction of its lifetime remains."""
Issued = tls.Issued
"""A certificate and its private key, both PEM (:class:`kanri.kit.tls.Issued`)."""


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


def build_ca(cluster: str, namespace: str, now: dt.datetime, lifetime: dt.timedelta = CA_LIFETIME) -> Issued:
    """A self-signed CA for one cluster (:func:`kanri.kit.tls.build_ca`)."""
    # a common name holds at most 64 characters: the cluster's name (at most 40) fits, its namespace may not
    return tls.build_ca(f"{cluster}.{namespace}"[:55] + " kanri CA", now, lifetime)


def build_server(
    ca: Issued, common_name: str, dns: list[str], now: dt.datetime, lifetime: dt.timedelta = SERVER_LIFETIME
) -> Issued:
    """A server certificate for ``dns`` (and 127.0.0.1, the instance's own health checks), signed by ``ca``."""
    return tls.build_server(ca, dns, now, lifetime, ip_addresses=["127.0.0.1"], common_name=common_name)


expiry = tls.expiry


def needs_renewal(cert_pem: bytes, ca_pem: bytes, dns: list[str], now: dt.datetime) -> str | None:
    """Why a managed server certificate must be reissued now, or None (:func:`kanri.kit.tls.needs_renewal`: one that
    already ends with its CA is renewed by the CA's rotation, kanri.postgres.tls.rotation)."""
    return tls.needs_renewal(cert_pem, ca_pem, dns, now)


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


# --- validation of what the operator reads (pure) ----------------------------------------------------------------


def _certificates(data: Mapping[str, bytes], key: str) -> tuple[list[x509.Certificate], SecretProblem | None]:
    raw = data.get(key)
    if not raw:
        return [], SecretProblem(key, "is missing")
    try:
        found = x509.load_pem_x509_certificates(raw)
    except ValueError:
        return [], SecretProblem(key, "is not a PEM certificate")
    return found, None


def _private_key(data: Mapping[str, bytes], key: str) -> tuple[Any, SecretProblem | None]:
    raw = data.get(key)
    if not raw:
        return None, SecretProblem(key, "is missing")
    try:
        return serialization.load_pem_private_key(raw, password=None), None
    except TypeError:
        return None, SecretProblem(key, "is an encrypted private key (PostgreSQL cannot ask for its passphrase)")
    except (ValueError, UnsupportedAlgorithm):
        return None, SecretProblem(key, "is not a PEM private key")


def _public(value: Any) -> bytes:
    return bytes(value.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo))


def _issued_by(chain: list[x509.Certificate], authorities: list[x509.Certificate]) -> bool:
    """``chain`` (leaf first, then intermediates) links up to one of ``authorities``."""

    def signs(issuer: x509.Certificate, cert: x509.Certificate) -> bool:
        try:
            cert.verify_directly_issued_by(issuer)
        except Exception:  # InvalidSignature, ValueError, TypeError: not this issuer
            return False
        return True

    for cert, parent in itertools.pairwise(chain):
        if not signs(parent, cert):
            return False
    top = chain[-1]
    return any(top == ca or signs(ca, top) for ca in authorities)


def _ca_loads(raw: bytes) -> bool:
    """``ca.crt`` is what the operator's TLS context accepts (``cadata``: the instance client verifies with it)."""
    try:
        ssl.create_default_context(cadata=raw.decode("ascii"))
    except (ssl.SSLError, ValueError, UnicodeDecodeError):
        return False
    return True


def ca_problems(data: Mapping[str, bytes]) -> list[SecretProblem]:
    """What is wrong with a CA certificate Secret's ``data`` (``<cluster>-ca``: key ``ca.crt``)."""
    _, problem = _certificates(data, "ca.crt")
    if problem is None and not _ca_loads(data["ca.crt"]):
        problem = SecretProblem("ca.crt", "is not a PEM certificate OpenSSL loads")
    return [problem] if problem is not None else []


def ca_key_problems(data: Mapping[str, bytes]) -> list[SecretProblem]:
    """What is wrong with the CA key pair the operator signs with (``<cluster>-ca-key``: ``ca.crt``, ``ca.key``)."""
    certs, problem = _certificates(data, "ca.crt")
    key, key_problem = _private_key(data, "ca.key")
    found = [p for p in (problem, key_problem) if p is not None]
    if found:
        return found
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return [SecretProblem("ca.key", "is not an EC private key (the operator signs with P-256)")]
    if _public(key.public_key()) != _public(certs[0].public_key()):
        return [SecretProblem("ca.key", "does not belong to ca.crt")]
    return []


def server_problems(data: Mapping[str, bytes], now: dt.datetime) -> list[SecretProblem]:
    """What is wrong with a server Secret's ``data`` (``<cluster>-server``, kubernetes.io/tls: ``tls.crt`` with its
    chain, ``tls.key``, ``ca.crt``); empty when the instances can serve it and the operator can verify them."""
    chain, cert_problem = _certificates(data, "tls.crt")
    key, key_problem = _private_key(data, "tls.key")
    authorities, ca_problem = _certificates(data, "ca.crt")
    if ca_problem is None and not _ca_loads(data["ca.crt"]):
        ca_problem = SecretProblem("ca.crt", "is not a PEM certificate OpenSSL loads")
    found = [p for p in (cert_problem, key_problem, ca_problem) if p is not None]
    if cert_problem is None:
        leaf = chain[0]
        if leaf.not_valid_after_utc <= now:
            found.append(SecretProblem("tls.crt", f"expired at {leaf.not_valid_after_utc.isoformat()}"))
        if key_problem is None and _public(key.public_key()) != _public(leaf.public_key()):
            found.append(SecretProblem("tls.key", "does not belong to the certificate in tls.crt"))
        if ca_problem is None and not _issued_by(chain, authorities):
            found.append(
                SecretProblem("ca.crt", "does not issue tls.crt (the operator verifies the instances with it)")
            )
    return found
