"""One KRaft node as a process of this machine, from the jars ``make kafka-dist`` fetched: the real broker the
topic logic's integration tests and the benchmarks talk to (no pod, no image)."""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from kanri.kafka.broker.settings import new_cluster_id
from kanri.local.ports import free_port

_LOG = logging.getLogger("kanri.kafka.host")

#: Where ``make kafka-dist`` puts the jars, from this checkout's root.
DIST_LIBS = Path(__file__).resolve().parents[1] / ".build" / "kafka" / "libs"


@dataclass
class HostBroker:
    """A running single-node cluster: ``bootstrap`` is its address, ``log`` its output."""

    bootstrap: str
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] = field(default_factory=dict)

    def admin(self) -> AdminClient:
        config: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "logger": _LOG}
        return AdminClient(config)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _wait_ready(broker: HostBroker, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    admin = broker.admin()
    while time.monotonic() < deadline:
        if broker.process.poll() is not None:
            raise RuntimeError(f"the broker exited with {broker.process.returncode}; see {broker.log}")
        try:
            if admin.list_topics(timeout=2).brokers:
                return
        except Exception as exc:  # the admin client raises KafkaException until the listener answers
            last = repr(exc)
        time.sleep(0.3)
    broker.stop()
    raise TimeoutError(f"the broker did not answer within {timeout} s (last: {last}); see {broker.log}")


@contextlib.contextmanager
def host_broker(workdir: Path, libs: Path = DIST_LIBS, timeout: float = 60.0) -> Iterator[HostBroker]:
    """Start one combined broker+controller on 127.0.0.1 with its data under ``workdir``; stop it after the block."""
    with host_cluster(workdir, 1, libs, timeout) as brokers:
        yield brokers[0]


@contextlib.contextmanager
def host_cluster(
    workdir: Path,
    nodes: int,
    libs: Path = DIST_LIBS,
    timeout: float = 60.0,
    voters: int | None = None,
    env: Mapping[str, str] | None = None,
    dedicated: int = 0,
) -> Iterator[list[HostBroker]]:
    """Start ``nodes`` nodes of one quorum — the first ``voters`` (default: all) combined broker+controller, the
    rest brokers only — node N on 127.0.0.(N+1) (all of 127/8 is this machine's loopback, so the nodes share one
    pair of ports: the voter list names hosts, not ports), data under ``workdir/nodeN``; stop them after the block
    (with any node :func:`add_node` started into the list). ``env``: more of the launcher's settings for every node
    (a TLS listener, say). ``dedicated``: that many dedicated controllers instead (ids 1000+, on 127.0.1.N, no
    broker; not in the list), every node then a broker only."""
    if not (libs / "kafka-clients-4.4.0.jar").exists():
        raise FileNotFoundError(f"no Kafka jars in {libs}: run `make kafka-dist`")
    port, controller_port = free_port(), free_port()
    cluster_id = new_cluster_id()
    voter_list = ",".join(f"{n}=127.0.0.{n + 1}" for n in range(nodes if voters is None else voters))
    if dedicated:
        voter_list = ",".join(f"{1000 + n}=127.0.1.{n + 1}" for n in range(dedicated))
    brokers: list[HostBroker] = []
    controllers: list[HostBroker] = []
    try:
        for n in range(dedicated):  # controllers: no client listener to wait for; the brokers' readiness waits on them
            host, data = f"127.0.1.{n + 1}", workdir / f"controller{n}"
            controller_env = os.environ | {
                "KAFKA_CLUSTER_ID": cluster_id, "KAFKA_VOTERS": voter_list, "KAFKA_NODE_ID": str(1000 + n),
                "KAFKA_PROCESS_ROLES": "controller", "KAFKA_HOST": host, "KAFKA_BIND": host,
                "KAFKA_CONTROLLER_PORT": str(controller_port), "KAFKA_DATA_DIR": str(data), "KAFKA_LIBS": str(libs),
            }  # fmt: skip
            controllers.append(_start(data, controller_env, f"{host}:{controller_port}"))
        for node in range(nodes):
            host = f"127.0.0.{node + 1}"
            data = workdir if nodes == 1 else workdir / f"node{node}"
            node_env = (
                os.environ
                | dict(env or {})
                | {
                    "KAFKA_CLUSTER_ID": cluster_id,
                    "KAFKA_VOTERS": voter_list,
                    "KAFKA_NODE_ID": str(node),
                    "KAFKA_HOST": host,
                    "KAFKA_BIND": host,
                    "KAFKA_PORT": str(port),
                    "KAFKA_CONTROLLER_PORT": str(controller_port),
                    "KAFKA_DATA_DIR": str(data),
                    "KAFKA_LIBS": str(libs),
                }
            )
            brokers.append(_start(data, node_env, f"{host}:{port}"))
        for broker in brokers:
            _wait_ready(broker, timeout)
        yield brokers
    finally:
        for broker in brokers + controllers:  # all at once: a node waiting for its quorum to stop cleanly waits long
            if broker.process.poll() is None:
                broker.process.terminate()
        for broker in brokers + controllers:
            broker.stop()


def add_node(brokers: list[HostBroker], workdir: Path, timeout: float = 60.0) -> HostBroker:
    """Start the next node of the cluster ``brokers`` run (a broker only: the voter list stays), data under
    ``workdir/nodeN``; it joins ``brokers`` (stopped with them)."""
    node = len(brokers)
    host = f"127.0.0.{node + 1}"
    data = workdir / f"node{node}"
    env = brokers[0].env | {"KAFKA_NODE_ID": str(node), "KAFKA_HOST": host, "KAFKA_BIND": host,
                            "KAFKA_DATA_DIR": str(data)}  # fmt: skip
    port = brokers[0].bootstrap.rpartition(":")[2]
    broker = _start(data, env, f"{host}:{port}")
    brokers.append(broker)
    _wait_ready(broker, timeout)
    return broker


def restart(broker: HostBroker, timeout: float = 60.0) -> None:
    """Start a stopped ``broker`` again with the same environment and data; returns once it answers."""
    broker.stop()
    with broker.log.open("ab") as out:
        broker.process = subprocess.Popen([sys.executable, "-m", "kanri.kafka.broker"], env=broker.env, stdout=out,
                                          stderr=subprocess.STDOUT)  # fmt: skip
    _wait_ready(broker, timeout)


def _start(data: Path, env: dict[str, str], bootstrap: str) -> HostBroker:
    data.mkdir(parents=True, exist_ok=True)
    log = data / "broker.log"
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "kanri.kafka.broker"], env=env, stdout=out,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    return HostBroker(bootstrap, process, log, env)
