"""The broker's TLS listener (kanri.kafka.broker with ``KAFKA_TLS_DIR``) on a real host broker, with a certificate
the kit's CA signed (kanri.kit.tls): a client that trusts the CA and checks the broker's name produces and consumes
over TLS; a client that trusts another CA is refused at the handshake, so the test would notice a listener that
is not TLS or a certificate that is not checked."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.cimpl import NewTopic

from kanri.kit import tls
from kanri.local.ports import free_port
from tests.kafka_host import host_cluster


def _client(port: int, ca: Path) -> dict[str, Any]:
    # librdkafka checks the broker's name against the certificate by default (https); said here so it is not lost
    return {"bootstrap.servers": f"localhost:{port}", "security.protocol": "SSL", "ssl.ca.location": str(ca),
            "ssl.endpoint.identification.algorithm": "https"}  # fmt: skip


def produce(config: dict[str, Any], count: int) -> tuple[int, list[str]]:
    acked, errors = [0], []
    lock = threading.Lock()

    def delivered(error: Any, _message: Any) -> None:
        with lock:
            if error is None:
                acked[0] += 1
            else:
                errors.append(str(error))

    producer = Producer(config | {"acks": "all", "message.timeout.ms": 8000,
                                  "error_cb": lambda e: errors.append(str(e))})  # fmt: skip
    for i in range(count):
        producer.produce("secure", value=f"m{i}".encode(), on_delivery=delivered)
    producer.flush(30)
    return acked[0], errors


def test_a_client_trusting_the_ca_talks_tls_and_one_trusting_another_is_refused(tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    ca = tls.build_ca("kafka test CA", now)
    server = tls.build_server(ca, ["localhost"], now, ip_addresses=["127.0.0.1"])
    certs = tmp_path / "tls"
    certs.mkdir()
    (certs / "tls.crt").write_bytes(server.cert)
    (certs / "tls.key").write_bytes(server.key)
    (tmp_path / "ca.crt").write_bytes(ca.cert)
    (tmp_path / "other.crt").write_bytes(tls.build_ca("another CA", now).cert)
    port = free_port()
    env = {"KAFKA_TLS_DIR": str(certs), "KAFKA_TLS_PORT": str(port), "KAFKA_TLS_HOST": "localhost"}
    with host_cluster(tmp_path / "broker", 1, env=env) as brokers:
        properties = (tmp_path / "broker" / "config" / "server.properties").read_text()
        assert f"TLS://localhost:{port}" in properties
        assert "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,TLS:SSL" in properties
        admin = brokers[0].admin()  # the plain listener: the operator's way in
        admin.create_topics([NewTopic("secure", 1, 1)])["secure"].result(30)
        keystore = tmp_path / "broker" / "config" / "tls-keystore.pem"
        assert keystore.stat().st_mode & 0o077 == 0  # the key is the owner's alone
        acked, errors = produce(_client(port, tmp_path / "ca.crt"), 20)
        assert (acked, errors) == (20, [])

        consumer = Consumer(_client(port, tmp_path / "ca.crt") | {"group.id": "tls-check"})
        consumer.assign([TopicPartition("secure", 0, 0)])
        seen: list[bytes] = []
        for _ in range(60):
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.append(message.value() or b"")
            if len(seen) == 20:
                break
        consumer.close()
        assert seen == [f"m{i}".encode() for i in range(20)]

        acked, errors = produce(_client(port, tmp_path / "other.crt"), 1)
        assert acked == 0
        assert any("certificate verify failed" in e or "SSL handshake failed" in e for e in errors), errors
        assert brokers[0].process.poll() is None
