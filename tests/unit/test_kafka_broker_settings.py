"""A KRaft node's server.properties and the launcher's reading of its environment (kanri.kafka.broker)."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from kanri.kafka.broker import launch, settings
from kanri.kafka.broker.launch import settings_from
from kanri.kafka.broker.settings import NodeSettings, new_cluster_id, parse_properties, parse_voters


def test_a_three_node_quorum_lists_every_voter_and_sizes_internal_topics() -> None:
    voters = {0: "orders-0.orders-brokers", 1: "orders-1.orders-brokers", 2: "orders-2.b"}
    node = NodeSettings(node_id=1, host="orders-1.orders-brokers", data_dir="/data/log", voters=voters)
    props = node.properties()
    assert (
        props["controller.quorum.voters"]
        == "0@orders-0.orders-brokers:9093,1@orders-1.orders-brokers:9093,2@orders-2.b:9093"
    )
    assert props["advertised.listeners"] == "PLAINTEXT://orders-1.orders-brokers:9092"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["process.roles"] == "broker,controller"
    assert "node.id=1\n" in node.render()


def test_a_node_beyond_the_voters_is_a_broker_only_that_still_knows_the_quorum() -> None:
    voters = {0: "e-0.b", 1: "e-1.b", 2: "e-2.b"}
    props = NodeSettings(node_id=3, host="10.0.0.4", data_dir="/d", voters=voters).properties()
    assert props["process.roles"] == "broker"
    assert props["listeners"] == "PLAINTEXT://:9092"  # no controller listener on a broker-only node
    assert props["controller.quorum.voters"] == "0@e-0.b:9093,1@e-1.b:9093,2@e-2.b:9093"
    assert props["controller.listener.names"] == "CONTROLLER"  # how it reaches the quorum
    voter = NodeSettings(node_id=2, host="10.0.0.3", data_dir="/d", voters=voters).properties()
    assert (voter["process.roles"], voter["listeners"]) == ("broker,controller", "PLAINTEXT://:9092,CONTROLLER://:9093")


def test_a_single_node_cannot_ask_for_three_replicas_of_internal_topics() -> None:
    node = NodeSettings(node_id=0, host="127.0.0.1", voters={0: "127.0.0.1"}, data_dir="/d")
    assert node.properties()["offsets.topic.replication.factor"] == "1"
    assert node.properties()["transaction.state.log.min.isr"] == "1"


def test_user_config_goes_in_but_an_owned_key_is_refused() -> None:
    node = NodeSettings(node_id=0, host="h", voters={0: "h"}, data_dir="/d", extra={"num.io.threads": "4"})
    assert node.properties()["num.io.threads"] == "4"
    owned = NodeSettings(node_id=0, host="h", voters={0: "h"}, data_dir="/d", extra={"log.dirs": "/elsewhere"})
    with pytest.raises(ValueError, match=r"log\.dirs"):
        owned.properties()


def test_the_node_id_comes_from_the_pods_ordinal_when_not_given() -> None:
    env = {"HOSTNAME": "orders-2", "KAFKA_VOTERS": "0=a,1=b,2=c", "KAFKA_DATA_DIR": "/var/lib/kafka",
           "KAFKA_HOST_SUFFIX": ".orders-brokers.ns.svc"}  # fmt: skip
    settings = settings_from(env)
    assert settings.node_id == 2
    assert settings.host == "orders-2.orders-brokers.ns.svc"
    assert settings.data_dir == "/var/lib/kafka/log"
    with pytest.raises(ValueError, match="ordinal"):
        settings_from(env | {"HOSTNAME": "orders"})


def test_voters_and_properties_parse_and_bad_voters_are_named() -> None:
    assert parse_voters("0=a, 1=b") == {0: "a", 1: "b"}
    with pytest.raises(ValueError, match="x@a"):
        parse_voters("x@a")
    assert parse_properties("# c\nretention.ms = 10\n\n!x\na=b=c\n") == {"retention.ms": "10", "a": "b=c"}


def test_cluster_ids_are_22_url_safe_characters_and_differ() -> None:
    first, second = new_cluster_id(), new_cluster_id()
    assert len(first) == 22
    assert first != second
    assert set(first) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def test_a_tls_listener_is_advertised_by_the_pods_name_with_a_pem_keystore() -> None:
    env = {"HOSTNAME": "events-1", "KAFKA_VOTERS": "0=a,1=b,2=c", "KAFKA_DATA_DIR": "/var/lib/kafka",
           "KAFKA_HOST": "10.0.0.2", "KAFKA_TLS_DIR": "/etc/kafka/tls", "KAFKA_TLS_PORT": "9094",
           "KAFKA_TLS_HOST_SUFFIX": ".events-brokers.shop.svc.cluster.local"}  # fmt: skip
    props = settings_from(env).properties()
    assert props["listeners"] == "PLAINTEXT://:9092,CONTROLLER://:9093,TLS://:9094"
    assert props["advertised.listeners"] == \
        "PLAINTEXT://10.0.0.2:9092,TLS://events-1.events-brokers.shop.svc.cluster.local:9094"  # fmt: skip
    assert props["listener.security.protocol.map"].endswith(",TLS:SSL")
    assert props["listener.name.tls.ssl.keystore.type"] == "PEM"
    assert props["listener.name.tls.ssl.keystore.location"] == "/var/lib/kafka/config/tls-keystore.pem"
    plain = settings_from({k: v for k, v in env.items() if not k.startswith("KAFKA_TLS")}).properties()
    assert "TLS" not in plain["listeners"]
    assert not [k for k in plain if k.startswith("listener.name.tls")]


def test_a_dedicated_controller_listens_for_the_quorum_only_and_takes_its_id_from_the_base() -> None:
    env = {"HOSTNAME": "events-controller-2", "KAFKA_NODE_ID_BASE": "1000", "KAFKA_PROCESS_ROLES": "controller",
           "KAFKA_VOTERS": "1000=c0,1001=c1,1002=c2", "KAFKA_DATA_DIR": "/var/lib/kafka", "KAFKA_HOST": "10.0.0.9",
           "KAFKA_TLS_DIR": "/etc/kafka/tls"}  # fmt: skip
    settings = settings_from(env)
    assert settings.node_id == 1002
    props = settings.properties()
    assert props["process.roles"] == "controller"
    assert props["listeners"] == "CONTROLLER://:9093"
    assert "advertised.listeners" not in props  # nothing for clients, TLS or not
    assert "offsets.topic.replication.factor" not in props
    with pytest.raises(ValueError, match="not one of the voters"):
        settings_from(env | {"HOSTNAME": "events-controller-7"}).properties()
    with pytest.raises(ValueError, match="KAFKA_PROCESS_ROLES"):
        settings_from(env | {"KAFKA_PROCESS_ROLES": "broker"})


def test_a_new_cluster_id_never_starts_with_a_dash_and_the_format_command_takes_one_that_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # the first two draws encode to ids starting with '-' (0xf8... -> '-'); the third does not
    draws = iter([b"\xf8" + bytes(15), b"\xfb" + bytes(15), b"\x01" + bytes(15)])
    monkeypatch.setattr(uuid, "uuid4", lambda: uuid.UUID(bytes=next(draws)))
    assert settings.new_cluster_id() == "AQAAAAAAAAAAAAAAAAAAAA"
    # a cluster made before keeps its id (the ConfigMap): the format command must take it as one argument
    ran: list[list[str]] = []
    monkeypatch.setattr(subprocess, "run", lambda command, **_: ran.append(command))
    env = {"KAFKA_CLUSTER_ID": "-gTDXW78TceqAZH7UYTF1A", "KAFKA_DATA_DIR": str(tmp_path), "KAFKA_LIBS": "/libs",
           "KAFKA_VOTERS": "0=h", "KAFKA_NODE_ID": "0", "KAFKA_HOST": "h"}  # fmt: skip
    launch.prepare(env)
    assert "--cluster-id=-gTDXW78TceqAZH7UYTF1A" in ran[0]
    assert "-t" not in ran[0]
