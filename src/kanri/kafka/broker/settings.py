"""A KRaft node's settings and the ``server.properties`` they make: pure, so the pods and the tests' host broker
write the same file."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

#: Keys the operator decides; a user's broker config may not set them (the API refuses them too).
OWNED_KEYS = frozenset(
    {
        "process.roles",
        "node.id",
        "controller.quorum.voters",
        "controller.quorum.bootstrap.servers",
        "listeners",
        "advertised.listeners",
        "listener.security.protocol.map",
        "controller.listener.names",
        "inter.broker.listener.name",
        "log.dirs",
        "log.dir",
        "metadata.log.dir",
        "broker.id",
    }
)


def new_cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding (what ``kafka-storage random-uuid``
    prints) — never one that starts with ``-``, which a command line reads as an option (Kafka's own ids avoid it
    too; one in 64 did, and ``kafka-storage format -t -gTD…`` failed on every start of every node)."""
    while True:
        found = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not found.startswith("-"):
            return found


@dataclass(frozen=True)
class NodeSettings:
    """One node of a KRaft cluster: a combined broker and controller when it is one of the ``voters``, else a
    broker only (it still knows the voters: brokers fetch the metadata log from the quorum)."""

    node_id: int
    host: str
    """The name clients and the other nodes reach this node by (advertised)."""
    voters: Mapping[int, str]
    """Every controller's node id -> its host."""
    data_dir: str
    port: int = 9092
    controller_port: int = 9093
    bind: str = ""
    """The address listeners bind to: "" is every interface."""
    extra: Mapping[str, str] = field(default_factory=dict)
    """The user's broker config (never an owned key)."""
    controller_only: bool = False
    """A dedicated controller: a voter of the quorum and no broker (no client listener, no partitions)."""
    tls_port: int | None = None
    """A TLS listener for clients on this port (None: none)."""
    tls_host: str = ""
    """The name the TLS listener is advertised by: one the server certificate names (clients verify it)."""
    tls_keystore: str = ""
    """A PEM file holding the listener's private key and certificate chain."""

    @property
    def controller(self) -> bool:
        """A voter of the controller quorum (and a broker)."""
        return self.node_id in self.voters

    def properties(self) -> dict[str, str]:
        """Every key of ``server.properties``: the owned ones, defaults sized to the quorum, then the user's."""
        if self.controller_only:
            return self._controller_properties()
        replicas = len(self.voters)
        # internal topics must fit the cluster: a one-node quorum cannot hold three replicas of __consumer_offsets
        internal_rf = str(min(3, replicas))
        listeners = f"PLAINTEXT://{self.bind}:{self.port}"
        advertised = f"PLAINTEXT://{self.host}:{self.port}"
        protocols = "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
        if self.controller:
            listeners += f",CONTROLLER://{self.bind}:{self.controller_port}"
        tls: dict[str, str] = {}
        if self.tls_port is not None:
            if not self.tls_host or not self.tls_keystore:
                raise ValueError("a TLS listener needs the name it is advertised by and its keystore")
            listeners += f",TLS://{self.bind}:{self.tls_port}"
            advertised += f",TLS://{self.tls_host}:{self.tls_port}"
            protocols += ",TLS:SSL"
            tls = {"listener.name.tls.ssl.keystore.type": "PEM",
                   "listener.name.tls.ssl.keystore.location": self.tls_keystore,
                   "listener.name.tls.ssl.client.auth": "none"}  # fmt: skip
        props = {
            "process.roles": "broker,controller" if self.controller else "broker",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self._voters(),
            "listeners": listeners,
            "advertised.listeners": advertised,
            "listener.security.protocol.map": protocols,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": self.data_dir,
            "offsets.topic.replication.factor": internal_rf,
            "transaction.state.log.replication.factor": internal_rf,
            "transaction.state.log.min.isr": str(min(2, replicas)),
            "share.coordinator.state.topic.replication.factor": internal_rf,
            "share.coordinator.state.topic.min.isr": str(min(2, replicas)),
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "false",
        }
        refused = sorted(set(self.extra) & OWNED_KEYS)
        if refused:
            raise ValueError(f"broker config may not set {', '.join(refused)}: the operator owns them")
        return props | tls | dict(self.extra)

    def _voters(self) -> str:
        return ",".join(f"{nid}@{host}:{self.controller_port}" for nid, host in sorted(self.voters.items()))

    def _controller_properties(self) -> dict[str, str]:
        """A dedicated controller's: the quorum's listener alone; the broker config is not its."""
        if not self.controller:
            raise ValueError(f"node {self.node_id} is a dedicated controller but not one of the voters")
        return {
            "process.roles": "controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": self._voters(),
            "listeners": f"CONTROLLER://{self.bind}:{self.controller_port}",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "log.dirs": self.data_dir,
        }

    def render(self) -> str:
        return "".join(f"{key}={value}\n" for key, value in self.properties().items())


def parse_voters(text: str) -> dict[int, str]:
    """``"0=host-0,1=host-1"`` -> ``{0: "host-0", 1: "host-1"}``."""
    voters = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        node, sep, host = item.partition("=")
        if not sep or not node.isdigit() or not host:
            raise ValueError(f"a voter is <node id>=<host>, not {item!r}")
        voters[int(node)] = host
    return voters


def parse_properties(text: str) -> dict[str, str]:
    """A ``key=value`` file (comments and blank lines skipped), as the user's broker config is mounted."""
    props = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "!")):
            key, _, value = line.partition("=")
            props[key.strip()] = value.strip()
    return props
