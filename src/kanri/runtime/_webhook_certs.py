"""The conversion webhook's serving certificate and the CA the API server trusts it by (the CRD's ``caBundle``).

Every rotation makes a new CA and a serving certificate signed by it; the bundle holds the new CA *and* the previous
one while it is valid, so a replica still serving the old certificate stays trusted until it reloads. The pair lives
in one Secret shared by every replica (the first replica creates it; a rotation is a replace with the
resourceVersion it read, so two replicas never both win). Keys are ECDSA P-256: cheap to make, accepted everywhere.
"""

from __future__ import annotations

import base64
import ipaddress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kanri.runtime._client import Client
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import SECRET

__all__ = ["CertificateStore", "WebhookCertificates", "issue_certificates"]

Obj = dict[str, Any]
_PEM_END = b"-----END CERTIFICATE-----\n"


@dataclass(frozen=True)
class WebhookCertificates:
    """A serving certificate and key, and the CA bundle that verifies it (PEM)."""

    ca_bundle: bytes
    """Newest CA first, then the previous CA while it is still valid."""
    cert: bytes
    key: bytes

    @property
    def serving(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert)

    def due(self, now: datetime) -> bool:
        """Renew once less than a third of the serving certificate's lifetime is left (cert-manager's default)."""
        serving = self.serving
        lifetime = serving.not_valid_after_utc - serving.not_valid_before_utc
        return now >= serving.not_valid_after_utc - lifetime / 3

    def covers(self, dns_names: tuple[str, ...], ip_addresses: tuple[str, ...]) -> bool:
        """Whether the serving certificate names every host the API server may call."""
        names = self.serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        have_dns = set(names.get_values_for_type(x509.DNSName))
        have_ips = {str(ip) for ip in names.get_values_for_type(x509.IPAddress)}
        return set(dns_names) <= have_dns and set(ip_addresses) <= have_ips

    def to_secret_data(self) -> dict[str, str]:
        raw = {"ca.crt": self.ca_bundle, "tls.crt": self.cert, "tls.key": self.key}
        return {name: base64.b64encode(value).decode() for name, value in raw.items()}

    @classmethod
    def from_secret(cls, secret: Obj) -> WebhookCertificates | None:
        data = secret.get("data") or {}
        try:
            ca, cert, key = (base64.b64decode(data[name]) for name in ("ca.crt", "tls.crt", "tls.key"))
        except (KeyError, ValueError):
            return None
        return cls(ca_bundle=ca, cert=cert, key=key)


def issue_certificates(
    dns_names: tuple[str, ...],
    ip_addresses: tuple[str, ...] = (),
    *,
    now: datetime,
    valid_for: timedelta,
    previous: WebhookCertificates | None = None,
) -> WebhookCertificates:
    """A new CA and a serving certificate for ``dns_names`` / ``ip_addresses``; the bundle keeps ``previous``'s
    newest CA while it is still valid at ``now``."""
    if not dns_names and not ip_addresses:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    start = now - timedelta(minutes=5)  # tolerate clocks a little behind ours
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"kanri webhook CA {now:%Y%m%dT%H%M%S}")])
    ca = (
        _builder(ca_name, ca_name, ca_key.public_key(), start, now + valid_for)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = [x509.DNSName(name) for name in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    # X.509 caps a common name at 64 characters and TLS clients check the SANs only, so a long Service name in a long
    # namespace (<service>.<namespace>.svc can pass 64) gets its first label as the name, not a crash.
    common_name = (dns_names or ip_addresses)[0]
    if len(common_name) > 64:
        common_name = common_name.split(".", 1)[0][:64]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    serving = (
        _builder(subject, ca_name, key.public_key(), start, now + valid_for)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    bundle = ca.public_bytes(serialization.Encoding.PEM)
    if previous is not None:
        bundle += _still_valid_first_ca(previous.ca_bundle, now)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return WebhookCertificates(ca_bundle=bundle, cert=serving.public_bytes(serialization.Encoding.PEM), key=key_pem)


def _builder(
    subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, start: datetime, end: datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
        key_agreement=False, key_cert_sign=cert_sign, crl_sign=cert_sign, encipher_only=False, decipher_only=False,
    )  # fmt: skip


def _still_valid_first_ca(bundle: bytes, now: datetime) -> bytes:
    """The first certificate of ``bundle`` (the CA that signed the serving certificate being replaced), if valid."""
    first = bundle.split(_PEM_END, 1)[0] + _PEM_END
    try:
        ca = x509.load_pem_x509_certificate(first)
    except ValueError:
        return b""
    return first if ca.not_valid_after_utc > now else b""


class CertificateStore:
    """The Secret every replica reads its certificates from; creates or rotates them when due."""

    def __init__(
        self,
        client: Client,
        namespace: str,
        name: str,
        *,
        dns_names: tuple[str, ...],
        ip_addresses: tuple[str, ...] = (),
        valid_for: timedelta = timedelta(days=90),
    ) -> None:
        self.client, self.namespace, self.name = client, namespace, name
        self.dns_names, self.ip_addresses, self.valid_for = dns_names, ip_addresses, valid_for

    async def current(self, now: datetime) -> WebhookCertificates:
        """The certificates to serve: the Secret's, after creating or rotating them if they are missing, due at
        ``now`` or do not name every host. New ones are issued at the real time (``now`` may be a test's clock).
        A replica that loses the race to write reads the winner's."""
        lost_race = False
        for _ in range(5):
            try:
                secret: Obj | None = await self.client.get(SECRET, self.name, self.namespace)
            except ApiError as error:
                if not error.not_found:
                    raise
                secret = None
            certs = WebhookCertificates.from_secret(secret) if secret is not None else None
            # After losing a race the winner's certificates are the new ones: take them even if `now` says due.
            fresh_enough = lost_race or not certs.due(now) if certs is not None else False
            if certs is not None and fresh_enough and certs.covers(self.dns_names, self.ip_addresses):
                return certs
            fresh = issue_certificates(
                self.dns_names, self.ip_addresses, now=datetime.now(UTC), valid_for=self.valid_for, previous=certs
            )
            try:
                await self._write(secret, fresh)
            except ApiError as error:
                if error.conflict:
                    lost_race = True  # another replica wrote first: use its certificates
                    continue
                raise
            return fresh
        raise RuntimeError(f"Secret {self.namespace}/{self.name}: kept losing write races; giving up for now")

    async def _write(self, secret: Obj | None, certs: WebhookCertificates) -> None:
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Secret",
            "type": "Opaque",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "data": certs.to_secret_data(),
        }
        if secret is None:
            await self.client.create(SECRET, body)
            return
        body["metadata"] = {**secret["metadata"], "resourceVersion": secret["metadata"]["resourceVersion"]}
        await self.client.replace(SECRET, body)
