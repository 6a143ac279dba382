"""The local cluster's OCI image registry: distribution's ``registry`` (built by ``make registry-tools``) serving
HTTPS on a loopback port, with a CA of its own. Its certificate also names the real nodes' gateway address, where
their containerd reaches it (``kanri.local.realnode.node.NodeRegistry``).

One :class:`LocalRegistry` owns ``<cluster dir>/registry``: ``config.yml`` (the port, chosen free on the first start
and kept, so image references stay valid across restarts), ``pki/`` (``ca.crt`` is what clients trust; the keys are
0600) and ``data/`` (the blobs and manifests, kept across ``down``/``up`` like the cluster's other state).

distribution serves no OCI referrers API (its ``/v2/<name>/referrers/<digest>`` answers 404); clients attach and find
an image's SBOM and signature through the referrers tag schema (a ``sha256-<digest>`` index tag), which oras and
cosign fall back to by themselves. It prints no readiness line, so :meth:`LocalRegistry.start` waits for ``/v2/`` to
answer over TLS.
"""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import os
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from kanri.local import paths
from kanri.local.detached import DetachedProcess, DetachedProcessError
from kanri.local.ports import free_port
from kanri.local.realnode.spec import GATEWAY

HOST = "127.0.0.1"
_CA_DAYS = 3650
_SERVING_DAYS = 825


class RegistryError(DetachedProcessError):
    """The registry failed to start or stop; the message includes the tail of its log."""


@dataclass(frozen=True)
class RegistryEndpoint:
    """How to reach a running local registry: push to ``address/<repository>``, trusting ``ca_file``."""

    address: str
    ca_file: Path
    pid: int


def registry_binary() -> Path:
    """distribution's ``registry`` as ``make registry-tools`` builds it."""
    return paths.build_dir() / "bin" / "registry"


def _write_private(path: Path, data: bytes) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def issue_certificates(pki: Path, hosts: list[str]) -> None:
    """Write a CA (``ca.crt``, ``ca.key``) and a serving certificate it signs for ``hosts`` (IP addresses or DNS
    names: ``tls.crt``, ``tls.key``) into ``pki``. An existing CA is kept, so clients that trust it keep working."""
    pki.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_cert_path, ca_key_path = pki / "ca.crt", pki / "ca.key"
    if ca_cert_path.is_file() and ca_key_path.is_file():
        ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
        assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
        ca_cert = x509.load_pem_x509_certificate(ca_cert_path.read_bytes())
    else:
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kanri local registry CA")])
        ca_cert = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=_CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(
                x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True
            )  # keyCertSign, cRLSign
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        _write_private(ca_key_path, _key_pem(ca_key))
        ca_cert_path.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kanri local registry")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=_SERVING_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_cert.public_key()),  # type: ignore[arg-type]
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_private(pki / "tls.key", _key_pem(key))
    (pki / "tls.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class LocalRegistry(DetachedProcess):
    """The registry process bound to ``<cluster dir>/registry``."""

    what = "image registry"
    error = RegistryError

    def __init__(self, cluster_dir: Path, binary: Path | None = None) -> None:
        super().__init__(cluster_dir / "registry", "registry")
        self._binary = binary

    @property
    def config_file(self) -> Path:
        return self.data_dir / "config.yml"

    @property
    def pki_dir(self) -> Path:
        return self.data_dir / "pki"

    @property
    def ca_file(self) -> Path:
        """The CA certificate clients trust (``oras --ca-file``, ``kanri images push --ca-file``)."""
        return self.pki_dir / "ca.crt"

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, the registry part of every image reference pushed here."""
        return f"{HOST}:{self._port()}"

    def marker(self) -> bytes:
        return str(self.config_file).encode()

    def start(self, timeout: float = 60.0) -> RegistryEndpoint:
        """Start the registry unless it already runs, and return once ``/v2/`` answers over TLS. Idempotent."""
        if (pid := self.running_pid()) is not None:
            return RegistryEndpoint(self.address, self.ca_file, pid)
        binary = self._binary or registry_binary()
        if not binary.is_file():
            raise RegistryError(f"{binary} is missing: run `make registry-tools`")
        self._write_config()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # distribution exports OpenTelemetry traces to localhost:4318 unless told not to
        env = os.environ | {"OTEL_TRACES_EXPORTER": "none"}
        with self.log_file.open("ab") as log:
            process = subprocess.Popen(
                [str(binary), "serve", str(self.config_file)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                env=env,
            )
        self._process = process
        self.pid_file.write_text(f"{process.pid}\n")
        deadline = time.monotonic() + timeout
        while not self.is_ready():
            if process.poll() is not None:
                raise RegistryError(f"{self.what} exited with {process.returncode}\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RegistryError(f"{self.what} not ready within {timeout:.0f}s\n{self.log_tail()}")
            time.sleep(0.1)
        return RegistryEndpoint(self.address, self.ca_file, process.pid)

    def is_ready(self, timeout: float = 2.0) -> bool:
        """Whether ``GET /v2/`` answers 200 over TLS with a certificate :attr:`ca_file` vouches for."""
        try:
            context = ssl.create_default_context(cafile=str(self.ca_file))
            conn = http.client.HTTPSConnection(HOST, self._port(), context=context, timeout=timeout)
        except (OSError, RegistryError):
            return False
        try:
            conn.request("GET", "/v2/")
            return conn.getresponse().status == 200
        except OSError:
            return False
        finally:
            conn.close()

    def _port(self) -> int:
        try:
            config: dict[str, Any] = yaml.safe_load(self.config_file.read_text())
        except FileNotFoundError as exc:
            raise RegistryError(f"{self.config_file} is missing: the registry never started here") from exc
        return int(str(config["http"]["addr"]).rsplit(":", 1)[1])

    def _write_config(self) -> None:
        """(Re)write ``config.yml`` keeping its port, and a fresh serving certificate (the CA is kept)."""
        port = self._port() if self.config_file.is_file() else free_port(HOST)
        # the real nodes reach this loopback port at the host bridge's address (kanri.local.realnode.network)
        issue_certificates(self.pki_dir, [HOST, "localhost", GATEWAY])
        config = {
            "version": 0.1,
            "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": True}},
            "storage": {
                "filesystem": {"rootdirectory": str(self.data_dir / "data")},
                "delete": {"enabled": True},
            },
            "http": {
                "addr": f"{HOST}:{port}",
                "tls": {"certificate": str(self.pki_dir / "tls.crt"), "key": str(self.pki_dir / "tls.key")},
                "headers": {"X-Content-Type-Options": ["nosniff"]},
            },
        }
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(yaml.safe_dump(config, sort_keys=False))
