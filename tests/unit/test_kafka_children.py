"""What the operator writes for a KafkaCluster (kanri.kafka.cluster.children): the voters on record in the
StatefulSet and the kraft ConfigMap, and the TLS listener's pieces when ``spec.tls.enabled``."""

from __future__ import annotations

from typing import Any

from kanri import kit
from kanri.kafka.api import KafkaClusterSpec
from kanri.kafka.cluster import children


def _spec(**extra: Any) -> KafkaClusterSpec:
    return KafkaClusterSpec.model_validate({"storage": {"size": "1Gi"}} | extra)


def _env(body: dict[str, Any]) -> dict[str, Any]:
    container = body["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_new_clusters_get_three_voters_from_three_nodes_and_one_below() -> None:
    assert [children.default_controllers(_spec(replicas=n)) for n in (1, 2, 3, 5, 9)] == [1, 1, 3, 3, 3]
    assert children.default_controllers(_spec(replicas=5, controllers=5)) == 5
    env = _env(children.statefulset("events", "shop", _spec(replicas=5)))
    assert env["KAFKA_VOTERS"].count("=") == 3
    assert env["KAFKA_VOTERS"].startswith("0=events-0.events-brokers.shop.svc.cluster.local,")
    # the voters on record win over the spec's default: a cluster made with every node a voter keeps them
    assert (
        _env(children.statefulset("events", "shop", _spec(replicas=5), controllers=5))["KAFKA_VOTERS"].count("=") == 5
    )
    assert children.voter_count(env["KAFKA_VOTERS"]) == 3
    assert children.kraft_config_map("events", 3)["data"]["controllers"] == "3"


def test_tls_mounts_the_certificate_opens_9094_and_rolls_on_a_new_certificate() -> None:
    plain = children.statefulset("events", "shop", _spec())
    assert "KAFKA_TLS_DIR" not in _env(plain)
    assert all(p["port"] != children.TLS_PORT for s in children.services("events") for p in s["spec"]["ports"])
    one = children.statefulset("events", "shop", _spec(tls={"enabled": True}), tls_hash="aaaa")
    two = children.statefulset("events", "shop", _spec(tls={"enabled": True}), tls_hash="bbbb")
    env = _env(one)
    assert env["KAFKA_TLS_DIR"] == children.TLS_DIR
    assert env["KAFKA_TLS_HOST_SUFFIX"] == ".events-brokers.shop.svc.cluster.local"
    pod = one["spec"]["template"]["spec"]
    assert {"name": "tls", "secret": {"secretName": "events-tls", "defaultMode": 0o440}} in pod["volumes"]
    annotations = one["spec"]["template"]["metadata"]["annotations"]
    assert annotations[children.TLS_HASH] == "aaaa"
    assert two["spec"]["template"]["metadata"]["annotations"][children.TLS_HASH] == "bbbb"
    assert all(
        any(p["port"] == children.TLS_PORT for p in s["spec"]["ports"]) for s in children.services("events", True)
    )
    names = children.tls_dns_names("events", "shop")
    # every advertised name (pod-N under the headless Service) matches the wildcard; the bootstrap in every form
    assert "*.events-brokers.shop.svc.cluster.local" in names
    assert children.tls_bootstrap("events", "shop").rpartition(":")[0] in names


def test_dedicated_controllers_get_a_statefulset_of_their_own_that_no_broker_selector_matches() -> None:
    spec = _spec(replicas=3, dedicatedControllers=True)
    assert children.default_controllers(spec) == 3
    controllers = children.controller_statefulset("events", "shop", spec, 3)
    env = _env(controllers)
    assert (controllers["metadata"]["name"], controllers["spec"]["replicas"]) == ("events-controller", 3)
    assert env["KAFKA_PROCESS_ROLES"] == "controller"
    assert env["KAFKA_NODE_ID_BASE"] == "1000"
    assert env["KAFKA_VOTERS"].split(",")[0] == "1000=events-controller-0.events-controllers.shop.svc.cluster.local"
    brokers = children.statefulset("events", "shop", spec, 3, dedicated=True)
    assert _env(brokers)["KAFKA_VOTERS"] == env["KAFKA_VOTERS"]  # every broker is a broker only
    pod_labels = controllers["spec"]["template"]["metadata"]["labels"]
    bootstrap = children.services("events")[1]["spec"]["selector"]
    assert not all(pod_labels.get(k) == v for k, v in bootstrap.items())  # clients are never sent to a controller
    # the controllers' volumes carry the brokers' labels: deletionPolicy finds every volume of the cluster
    claim = controllers["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"]
    assert claim == brokers["spec"]["volumeClaimTemplates"][0]["metadata"]["labels"]
    service = children.controllers_service("events")
    assert service["spec"]["selector"] == controllers["spec"]["selector"]["matchLabels"]
    assert children.kraft_config_map("events", 3, True)["data"]["dedicatedControllers"] == "true"


def test_volumes_grow_on_the_claims_while_the_template_keeps_the_size_it_was_made_with() -> None:
    made = children.statefulset("events", "shop", _spec())
    assert kit.claim_template_size(made) == "1Gi"
    grown = children.statefulset("events", "shop", _spec(storage={"size": "4Gi"}), claim_size="1Gi")
    # the API server refuses any change of a StatefulSet's claim template: the one applied is the one made
    assert grown["spec"]["volumeClaimTemplates"] == made["spec"]["volumeClaimTemplates"]

    def claim(name: str, request: str, phase: str = "Bound", capacity: str | None = None) -> dict[str, Any]:
        status: dict[str, Any] = {"phase": phase} | ({"capacity": {"storage": capacity}} if capacity else {})
        return {"metadata": {"name": name}, "spec": {"resources": {"requests": {"storage": request}}}, "status": status}

    claims = [
        claim("data-events-0", "1Gi", capacity="1Gi"),
        claim("data-events-1", "4Gi", capacity="1Gi"),
        claim("data-events-2", "1Gi", phase="Pending"),
        claim("data-events-3", "4096Mi", capacity="4Gi"),
    ]
    assert kit.claims_to_grow(claims, "4Gi") == ["data-events-0"]  # bound and below; a pending claim cannot change yet
    assert kit.claims_resizing(claims) == ["data-events-1"]
