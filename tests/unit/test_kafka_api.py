"""The KafkaCluster and KafkaTopic schemas as generated (the API server: tests/integration/test_kafka_api.py)."""

from __future__ import annotations

from typing import Any

import yaml

from kanri.kafka.api import KafkaCluster, KafkaTopic, KafkaTopicSpec
from kanri.kafka.broker.settings import OWNED_KEYS
from kanri.runtime import crd_yaml


def schema(kind: type[Any]) -> dict[str, Any]:
    crd = yaml.safe_load(crd_yaml(kind))
    return dict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def test_a_topic_needs_a_cluster_and_a_partition_count_and_defaults_the_rest() -> None:
    spec = schema(KafkaTopic)["properties"]["spec"]
    assert set(spec["required"]) == {"cluster", "partitions"}
    parsed = KafkaTopicSpec.model_validate({"cluster": "events", "partitions": 6})
    assert parsed.deletion_policy == "Retain"
    assert parsed.managed is True
    assert parsed.key_ordered is False
    assert (parsed.partition_growth.step_size, parsed.partition_growth.pause_seconds) == (2, 30)


def test_partitions_carry_a_transition_rule_and_config_maps_are_bounded() -> None:
    spec = schema(KafkaTopic)["properties"]["spec"]["properties"]
    rules = [r["rule"] for r in spec["partitions"]["x-kubernetes-validations"]]
    assert "self >= oldSelf" in rules
    assert spec["config"]["maxProperties"] == 40  # the CEL cost estimate needs a bound
    cluster = schema(KafkaCluster)["properties"]["spec"]["properties"]
    assert cluster["config"]["maxProperties"] == 64
    owned_rule = cluster["config"]["x-kubernetes-validations"][0]["rule"]
    assert all(f"'{key}'" in owned_rule for key in OWNED_KEYS)
