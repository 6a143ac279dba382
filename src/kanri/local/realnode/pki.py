"""A node's two certificates, made at each start from the control plane's CAs (``<data dir>/pki``).

- Its API client identity, ``system:node:<name>`` in group ``system:nodes`` (what the Node authorizer and the
  NodeRestriction admission plugin expect of a kubelet), signed by the cluster CA.
- Its serving certificate for the kubelet API (logs, exec, port-forward), for the node's address, signed by the
  control plane's kubelet serving CA (``kubelet-ca``), which the API server checks it against.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.types import CertificateIssuerPrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAYS = 365


def _load_ca(cert: Path, key: Path) -> tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes]:
    ca_key = serialization.load_pem_private_key(key.read_bytes(), password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"{key} is not an EC key; the control plane's CAs are P-256")
    return x509.load_pem_x509_certificate(cert.read_bytes()), ca_key


def _issue(
    out: Path,
    stem: str,
    subject: x509.Name,
    usage: x509.ObjectIdentifier,
    ca: tuple[x509.Certificate, CertificateIssuerPrivateKeyTypes],
    san: list[x509.GeneralName] | None = None,
) -> None:
    ca_cert, ca_key = ca
    now = datetime.datetime.now(datetime.UTC)
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    )
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    key_path = out / f"{stem}.key"
    key_path.unlink(missing_ok=True)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    (out / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def issue_node_certificates(control_plane_pki: Path, out: Path, node_name: str, node_ip: str) -> None:
    """Write ``client.crt/key`` and ``serving.crt/key`` for the node into ``out`` (replacing older ones)."""
    out.mkdir(parents=True, exist_ok=True)
    out.chmod(0o700)
    cluster_ca = _load_ca(control_plane_pki / "ca.crt", control_plane_pki / "ca.key")
    client_subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:nodes"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"system:node:{node_name}"),
        ]
    )
    _issue(out, "client", client_subject, ExtendedKeyUsageOID.CLIENT_AUTH, cluster_ca)
    kubelet_ca = _load_ca(control_plane_pki / "kubelet-ca.crt", control_plane_pki / "kubelet-ca.key")
    serving_names: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address(node_ip)),
        x509.DNSName(node_name),
    ]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_name)])
    _issue(out, "serving", subject, ExtendedKeyUsageOID.SERVER_AUTH, kubelet_ca, serving_names)
