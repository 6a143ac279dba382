"""The built images run for real, without a daemon: each is unpacked into an OCI runtime bundle (umoci) and run by
runc as the image's own user — the operator image starts ``kanri run`` against the session's control plane and
answers ``/healthz`` and ``/readyz`` (its caches synced through the API server); the PostgreSQL image initdb's a
data directory and serves a TLS connection that verifies against a CA the test made; the Kafka image's entrypoint
formats a KRaft node's storage and execs the JVM, and a message goes through it (confluent-kafka).

The containers share the host's network namespace (so the operator reaches the control plane on 127.0.0.1 and the
test reaches the container's ports); everything else — mount, PID, IPC, UTS namespaces, the image's user, its root
filesystem — is the image's.
"""

from __future__ import annotations

import asyncio
import datetime
import http.client
import ipaddress
import json
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from kanri.images.catalog import BuiltImage, built_images, catalog_file
from kanri.local.controlplane import Endpoint
from kanri.local.ports import free_port
from kanri.runtime import Client
from tests.postgres_support import install_postgres_crd
from tests.support import eventually

pytestmark = [pytest.mark.timeout(240), pytest.mark.asyncio(loop_scope="session")]

Obj = dict[str, Any]


def _image(name: str) -> BuiltImage:
    if not catalog_file().is_file():
        pytest.fail(f"{catalog_file()} is missing: run `make images` (part of `make setup`)")
    for image in built_images():
        if image.name == name:
            return image
    pytest.fail(f"{name} is not in {catalog_file()}")


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed (Debian's {name}: make system)")
    return path


class Container:
    """One image unpacked into ``bundle`` and run by runc under a unique id."""

    def __init__(self, image: BuiltImage, bundle: Path) -> None:
        self.image = image
        self.bundle = bundle
        self.id = f"kanri-test-{secrets.token_hex(4)}"
        self.log = bundle.parent / f"{self.id}.log"
        self.process: subprocess.Popen[bytes] | None = None
        subprocess.run(
            [_tool("umoci"), "unpack", "--image", f"{image.layout}:{image.tag}", str(bundle)],
            check=True,
            capture_output=True,
        )
        self.config: Obj = json.loads((bundle / "config.json").read_text())
        # the host's network: the control plane and the test are on 127.0.0.1
        namespaces = self.config["linux"]["namespaces"]
        self.config["linux"]["namespaces"] = [n for n in namespaces if n["type"] != "network"]
        self.config["process"]["terminal"] = False

    @property
    def user(self) -> tuple[int, int]:
        user = self.config["process"]["user"]
        return int(user["uid"]), int(user["gid"])

    def bind(self, source: Path, destination: str) -> None:
        self.config["mounts"].append(
            {"destination": destination, "type": "bind", "source": str(source), "options": ["rbind", "ro"]}
        )

    def env(self, values: dict[str, str]) -> None:
        self.config["process"]["env"] += [f"{key}={value}" for key, value in values.items()]

    def tmpfs(self, destination: str, mode: str = "1777") -> None:
        uid, gid = self.user
        options = ["nosuid", "nodev", f"mode={mode}", f"uid={uid}", f"gid={gid}"]
        self.config["mounts"].append(
            {"destination": destination, "type": "tmpfs", "source": "tmpfs", "options": options}
        )

    def start(self, args: list[str] | None = None, extra_args: list[str] | None = None) -> None:
        if args is not None:
            self.config["process"]["args"] = args
        self.config["process"]["args"] += extra_args or []
        (self.bundle / "config.json").write_text(json.dumps(self.config))
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [_tool("runc"), "run", "--bundle", str(self.bundle), self.id],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process is None:
            return
        subprocess.run([_tool("runc"), "kill", self.id, "KILL"], capture_output=True, check=False)
        try:
            self.process.wait(timeout=30)
        finally:
            subprocess.run([_tool("runc"), "delete", "--force", self.id], capture_output=True, check=False)


@pytest.fixture
def containers(tmp_path: Path) -> Iterator[list[Container]]:
    started: list[Container] = []
    yield started
    for container in started:
        container.stop()


def _get(port: int, path: str) -> int | None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    except OSError:
        return None
    finally:
        conn.close()


async def test_the_operator_image_runs_kanri_against_the_control_plane(
    control_plane: Endpoint, client: Client, namespace: str, containers: list[Container], tmp_path: Path
) -> None:
    await install_postgres_crd(client)
    image = _image("kanri-operator")
    container = Container(image, tmp_path / "operator")
    containers.append(container)
    assert container.user == (65532, 65532)  # the image's own user, not root
    kubeconfig = tmp_path / "kubeconfig"
    shutil.copyfile(control_plane.kubeconfig, kubeconfig)
    kubeconfig.chmod(0o644)  # the image's user reads it (the admin's: this is a test)
    container.bind(kubeconfig, "/etc/kanri/kubeconfig")
    port = free_port()
    container.start(
        extra_args=[
            "--kubeconfig=/etc/kanri/kubeconfig",
            f"--health-port={port}",
            f"--namespace={namespace}",
            "--no-leader-election",
        ]
    )

    async def answers(path: str) -> bool:
        assert container.running(), container.output()
        return await asyncio.to_thread(_get, port, path) == 200

    await eventually(lambda: answers("/healthz"), timeout=60, interval=0.5)
    # ready: its informers listed and watch PostgresClusters through the API server
    await eventually(lambda: answers("/readyz"), timeout=60, interval=0.5)


def _tls_pair(directory: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 it signs: (ca.crt, server.crt, server.key)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kanri test CA")])
    ca = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    directory.mkdir()
    paths = directory / "ca.crt", directory / "server.crt", directory / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return paths


# Runs in the image's python3 as its postgres user: initdb, then the server with TLS only on 127.0.0.1:<port>
# (the key is copied into the data directory: PostgreSQL wants it 0600 and owned by the server's user).
_SERVE = """
import os, shutil, subprocess, sys
port, bin_dir = sys.argv[1], os.environ["KANRI_PG_BIN"]
data = "/pgdata/data"
subprocess.run([f"{bin_dir}/initdb", "-D", data, "-U", "postgres", "--auth=trust", "--no-sync"], check=True)
for name in ("server.crt", "server.key"):
    shutil.copy(f"/tls/{name}", f"{data}/{name}")
os.chmod(f"{data}/server.key", 0o600)
os.execv(f"{bin_dir}/postgres", ["postgres", "-D", data, "-p", port, "-c", "listen_addresses=127.0.0.1",
         "-c", "unix_socket_directories=/tmp", "-c", "ssl=on", "-c", "ssl_cert_file=server.crt",
         "-c", "ssl_key_file=server.key"])
"""


async def test_the_postgres_image_initdbs_and_serves_tls(containers: list[Container], tmp_path: Path) -> None:
    image = _image("kanri-postgres-17")
    container = Container(image, tmp_path / "postgres")
    containers.append(container)
    assert container.user == (26, 26)  # postgres, not root
    ca, cert, key = _tls_pair(tmp_path / "tls")
    for path in (tmp_path / "tls", ca, cert, key):
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    container.bind(tmp_path / "tls", "/tls")
    container.tmpfs("/pgdata", mode="0700")
    container.tmpfs("/tmp")
    port = free_port()
    container.start(args=["python3", "-c", _SERVE, str(port)])

    async def connected() -> str | None:
        assert container.running(), container.output()
        try:
            conn = await psycopg.AsyncConnection.connect(
                host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                sslmode="verify-full", sslrootcert=str(ca), connect_timeout=2,
            )  # fmt: skip
        except psycopg.OperationalError:
            return None
        async with conn:
            cursor = await conn.execute("SELECT ssl, version FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            row = await cursor.fetchone()
            cursor = await conn.execute("SELECT current_setting('server_version_num')::int")
            version = await cursor.fetchone()
        assert row is not None
        assert row[0] is True, row
        assert version is not None
        return str(version[0])

    version = await eventually(connected, timeout=90, interval=0.5)
    assert version.startswith("17"), version  # 170011: the image's major


def _round_trip(bootstrap: str) -> list[bytes]:
    """A topic created, three messages produced (acks=all) and read back from the start."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic("through-the-image", 1, 1)])["through-the-image"].result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(3):
        producer.produce("through-the-image", value=f"message {i}".encode())
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "image-test", "auto.offset.reset": "earliest"})
    consumer.subscribe(["through-the-image"])
    seen: list[bytes] = []
    try:
        for _ in range(120):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value() or b"")
                if len(seen) == 3:
                    break
    finally:
        consumer.close()
    return seen


async def test_the_kafka_image_formats_its_storage_and_serves_a_produced_message(
    containers: list[Container], tmp_path: Path
) -> None:
    image = _image("kanri-kafka")
    container = Container(image, tmp_path / "kafka")
    containers.append(container)
    assert container.user == (1001, 1001)  # kafka, not root
    assert container.config["process"]["args"] == ["/usr/bin/python3", "-m", "kanri.kafka.broker"]
    container.tmpfs("/var/lib/kafka", mode="0700")
    container.tmpfs("/tmp")
    port, controller = free_port(), free_port()
    container.env({
        "KAFKA_CLUSTER_ID": "a2FucmktaW1hZ2UtdGVzdA", "KAFKA_NODE_ID": "0", "KAFKA_VOTERS": "0=127.0.0.1",
        "KAFKA_HOST": "127.0.0.1", "KAFKA_BIND": "127.0.0.1", "KAFKA_DATA_DIR": "/var/lib/kafka",
        "KAFKA_PORT": str(port), "KAFKA_CONTROLLER_PORT": str(controller),
    })  # fmt: skip
    container.start()  # the image's entrypoint, as a pod runs it
    bootstrap = f"127.0.0.1:{port}"

    def listed() -> bool | None:
        try:
            AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=2)
        except KafkaException:
            return None
        return True

    async def answers() -> bool | None:
        assert container.running(), container.output()
        return await asyncio.to_thread(listed)

    await eventually(answers, timeout=120, interval=1.0)
    seen = await asyncio.to_thread(_round_trip, bootstrap)
    assert seen == [b"message 0", b"message 1", b"message 2"]
    log = container.log.read_text(errors="replace")
    assert "Formatting metadata directory /var/lib/kafka/log" in log, log[-4000:]  # the launcher's format, once
    assert "[KafkaRaftServer nodeId=0] Kafka Server started" in log, log[-4000:]  # kafka.Kafka, exec'd by it
