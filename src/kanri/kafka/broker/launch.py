"""``python -m kanri.kafka.broker``: write this node's ``server.properties`` from its environment, format its
storage once, and become the JVM running ``kafka.Kafka``.

The environment (set by the KafkaCluster's StatefulSet, or by the tests for a host broker):

- ``KAFKA_CLUSTER_ID`` — the quorum's cluster id (the same on every node; formatting writes it into the storage).
- ``KAFKA_VOTERS`` — ``<node id>=<host>,…`` of every controller.
- ``KAFKA_NODE_ID`` — this node's id; when absent, ``KAFKA_NODE_ID_BASE`` (0) plus the ordinal of ``HOSTNAME``
  (``orders-2`` is node 2, ``orders-controller-1`` with base 1000 is node 1001).
- ``KAFKA_PROCESS_ROLES`` — ``controller`` for a dedicated controller (no broker); otherwise the node is a broker,
  and a controller too when it is one of the voters.
- ``KAFKA_HOST`` — the name this node is advertised by; when absent, ``HOSTNAME`` + ``KAFKA_HOST_SUFFIX``.
- ``KAFKA_DATA_DIR`` — the volume: partitions under ``log/``, the written config under ``config/``.
- ``KAFKA_PORT`` / ``KAFKA_CONTROLLER_PORT`` (9092 / 9093), ``KAFKA_BIND`` (listen address, default every one).
- ``KAFKA_TLS_DIR`` — when set, a TLS listener for clients: the folder holds ``tls.crt`` (the chain) and ``tls.key``
  (PKCS#8), written together into one PEM keystore on the volume at start; ``KAFKA_TLS_PORT`` (9094) and the name
  it is advertised by, ``KAFKA_TLS_HOST`` or ``HOSTNAME`` + ``KAFKA_TLS_HOST_SUFFIX`` (the pod's stable DNS name,
  which the certificate names).
- ``KAFKA_CONFIG_FILE`` — the user's broker config (``key=value``; the operator's keys refused).
- ``KAFKA_LIBS`` — the folder of the broker's jars (``make kafka-dist``: ``.build/kafka/libs``), ``KAFKA_JAVA`` the
  java binary (default: ``java`` on PATH), ``KAFKA_HEAP_OPTS`` the JVM's memory flags.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from kanri.kafka.broker.settings import NodeSettings, parse_properties, parse_voters

#: Small on purpose: the local cluster runs three brokers on a 2-core machine next to everything else. The serial
#: collector and C1 only spend less CPU at start (a broker is up in ~2 s) at the price of peak throughput.
DEFAULT_HEAP = "-Xms64m -Xmx384m -XX:+UseSerialGC -XX:TieredStopAtLevel=1"

#: The broker's log4j2 configuration: INFO to stdout, the request log and state changes kept quiet.
LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.kafka.name = kafka
logger.kafka.level = info
logger.state.name = state.change.logger
logger.state.level = warn
logger.request.name = kafka.request.logger
logger.request.level = warn
"""


def settings_from(env: Mapping[str, str]) -> NodeSettings:
    """The node's settings from its environment (the module docstring); a missing or bad value raises ValueError."""
    hostname = env.get("HOSTNAME", "")
    ordinal = hostname.rpartition("-")[2]
    node = env.get("KAFKA_NODE_ID") or (str(int(env.get("KAFKA_NODE_ID_BASE", "0")) + int(ordinal))
                                        if ordinal.isdigit() else "")  # fmt: skip
    if not node.isdigit():
        raise ValueError(f"KAFKA_NODE_ID is not set and HOSTNAME {hostname!r} ends in no ordinal")
    roles = env.get("KAFKA_PROCESS_ROLES", "")
    if roles not in ("", "controller"):
        raise ValueError(f"KAFKA_PROCESS_ROLES is 'controller' or unset, not {roles!r}")
    extra = {}
    if config_file := env.get("KAFKA_CONFIG_FILE"):
        path = Path(config_file)
        extra = parse_properties(path.read_text()) if path.exists() else {}
    tls = bool(env.get("KAFKA_TLS_DIR"))
    return NodeSettings(
        node_id=int(node),
        host=env.get("KAFKA_HOST") or hostname + env.get("KAFKA_HOST_SUFFIX", ""),
        voters=parse_voters(env["KAFKA_VOTERS"]),
        data_dir=str(Path(env["KAFKA_DATA_DIR"]) / "log"),
        port=int(env.get("KAFKA_PORT", "9092")),
        controller_port=int(env.get("KAFKA_CONTROLLER_PORT", "9093")),
        bind=env.get("KAFKA_BIND", ""),
        extra={} if roles == "controller" else extra,
        controller_only=roles == "controller",
        tls_port=int(env.get("KAFKA_TLS_PORT", "9094")) if tls else None,
        tls_host=(env.get("KAFKA_TLS_HOST") or hostname + env.get("KAFKA_TLS_HOST_SUFFIX", "")) if tls else "",
        tls_keystore=str(Path(env["KAFKA_DATA_DIR"]) / "config" / "tls-keystore.pem") if tls else "",
    )


def java_command(env: Mapping[str, str], main: str, *args: str) -> list[str]:
    """``java <heap> -cp <libs>/* <main> <args>`` with the broker's jars and logging."""
    java = env.get("KAFKA_JAVA") or shutil.which("java") or "java"
    libs = Path(env["KAFKA_LIBS"])
    config = Path(env["KAFKA_DATA_DIR"]) / "config"
    heap = env.get("KAFKA_HEAP_OPTS", DEFAULT_HEAP).split()
    return [
        java,
        *heap,
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={config / 'log4j2.properties'}",
        "-cp",
        f"{libs}/*",
        main,
        *args,
    ]


def prepare(env: Mapping[str, str]) -> Path:
    """Write the config files and format the storage unless it already is; return ``server.properties``."""
    settings = settings_from(env)
    config = Path(env["KAFKA_DATA_DIR"]) / "config"
    config.mkdir(parents=True, exist_ok=True)
    (config / "log4j2.properties").write_text(LOG4J2)
    if settings.tls_keystore:
        # Kafka's PEM keystore is one file: the private key, then the certificate chain (the Secret keeps them apart)
        tls = Path(env["KAFKA_TLS_DIR"])
        keystore = Path(settings.tls_keystore)
        keystore.touch(mode=0o600)
        keystore.write_bytes((tls / "tls.key").read_bytes() + (tls / "tls.crt").read_bytes())
    server = config / "server.properties"
    server.write_text(settings.render())
    if not (Path(settings.data_dir) / "meta.properties").exists():
        # formatting twice would fail; --ignore-formatted also covers a crash between format and the check above
        format_storage = java_command(
            # --cluster-id=ID, one argument: an id made before new_cluster_id avoided a leading '-' is not an option
            env, "kafka.tools.StorageTool", "format", "--ignore-formatted",
            f"--cluster-id={env['KAFKA_CLUSTER_ID']}", "-c", str(server),
        )  # fmt: skip
        subprocess.run(format_storage, check=True, stdout=sys.stdout, stderr=sys.stderr)
    return server


def main() -> None:
    server = prepare(os.environ)
    command = java_command(os.environ, "kafka.Kafka", str(server))
    sys.stdout.flush()
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
