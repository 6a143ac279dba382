"""The PostgresCluster models: what they default, accept and refuse in Python, and the CRD they generate.

What the API server enforces (CEL, transition rules) is proven in tests/integration/test_postgrescluster_api.py;
these tests pin the parts that need no server and keep the generated schema explainable."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from kanri.postgres.api import CUSTOM_RESOURCES
from kanri.postgres.api.v1alpha1 import (
    CRON_PATTERN,
    DEFAULT_MAX_DATA_LOSS_BYTES,
    OPERATOR_OWNED_PARAMETERS,
    PHASES,
    PostgresCluster,
    PostgresClusterSpec,
    PostgresClusterStatus,
)
from kanri.postgres.api.v1alpha1._base import reflow
from kanri.runtime import crd_for

ROOT = Path(__file__).resolve().parents[2]
CRD = crd_for(PostgresCluster)
(VERSION,) = CRD["spec"]["versions"]
SCHEMA: dict[str, Any] = VERSION["schema"]["openAPIV3Schema"]
SPEC = SCHEMA["properties"]["spec"]
MINIMAL = {"version": 18, "storage": {"size": "1Gi"}}


def nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node below ``node`` with its path (``.spec.failover.policy``, ``[*]`` for items and values)."""
    for name, child in node.get("properties", {}).items():
        yield f"{path}.{name}", child
        yield from nodes(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield f"{path}[*]", node[key]
            yield from nodes(node[key], f"{path}[*]")


# --- the CRD ----------------------------------------------------------------------------------------------------


def test_crd_names_scope_and_the_one_served_version() -> None:
    assert CRD["metadata"]["name"] == "postgresclusters.kanri.dev"
    assert CRD["spec"]["group"] == "kanri.dev"
    assert CRD["spec"]["scope"] == "Namespaced"
    assert CRD["spec"]["names"] == {
        "kind": "PostgresCluster",
        "listKind": "PostgresClusterList",
        "plural": "postgresclusters",
        "singular": "postgrescluster",
        "shortNames": ["pgc"],
        "categories": ["kanri"],
    }
    assert (VERSION["name"], VERSION["served"], VERSION["storage"]) == ("v1alpha1", True, True)
    assert VERSION["subresources"] == {"status": {}}, "status is written through /status only"
    assert ((PostgresCluster,),) == CUSTOM_RESOURCES


def test_printer_columns() -> None:
    columns = [(c["name"], c["jsonPath"], c["type"]) for c in VERSION["additionalPrinterColumns"]]
    assert columns == [
        ("Version", ".spec.version", "integer"),
        ("Replicas", ".spec.replicas", "integer"),
        ("Ready", ".status.readyReplicas", "integer"),
        ("Primary", ".status.currentPrimary", "string"),
        ("Phase", ".status.phase", "string"),
        ("Age", ".metadata.creationTimestamp", "date"),
    ]


def test_every_spec_and_status_field_is_described_for_kubectl_explain() -> None:
    undescribed = [
        f".{part}{path}"
        for part in ("spec", "status")
        for path, node in nodes(SCHEMA["properties"][part])
        if not path.endswith("[*]")
        and not node.get("description")
        # Conditions are metav1.Condition, described by the runtime.
        and not path.startswith(".conditions")
    ]
    assert undescribed == []


def test_descriptions_are_reflowed_paragraphs() -> None:
    failover = SPEC["properties"]["failover"]["description"]
    assert failover.startswith("What the operator does when the primary fails")
    paragraphs = failover.split("\n\n")
    assert len(paragraphs) == 2
    assert not any("\n" in paragraph for paragraph in paragraphs), "kubectl explain wraps lines itself"


def test_every_cel_rule_explains_itself() -> None:
    rules = [rule for _, node in nodes(SCHEMA) for rule in node.get("x-kubernetes-validations", [])]
    rules += SCHEMA.get("x-kubernetes-validations", [])
    assert len(rules) >= 15
    assert [rule["rule"] for rule in rules if not (rule.get("message") or rule.get("messageExpression"))] == []


def test_transition_rules_guard_version_size_storage_class_and_bootstrap() -> None:
    def rules(node: dict[str, Any]) -> list[str]:
        return [rule["rule"] for rule in node.get("x-kubernetes-validations", [])]

    storage = SPEC["properties"]["storage"]
    assert "self >= oldSelf" in rules(SPEC["properties"]["version"])
    assert any("oldSelf" in rule for rule in rules(storage["properties"]["size"]))
    assert "self == oldSelf" in rules(storage["properties"]["storageClassName"])
    assert "has(self.storageClassName) == has(oldSelf.storageClassName)" in rules(storage)
    assert "self == oldSelf" in rules(SPEC["properties"]["bootstrap"])


def test_schema_defaults() -> None:
    properties = SPEC["properties"]
    assert SPEC["required"] == ["version", "storage"]
    assert properties["replicas"]["default"] == 1
    assert properties["deletionPolicy"]["default"] == "Retain"
    assert properties["replication"]["default"] == {"mode": "Async"}
    assert properties["failover"]["default"] == {
        "policy": "Automatic",
        "maxDataLossBytes": DEFAULT_MAX_DATA_LOSS_BYTES,
        "delaySeconds": 0,
    }
    assert properties["bootstrap"]["default"] == {"initdb": {"database": "app", "owner": "app"}}
    backup = properties["backup"]["properties"]
    assert backup["restoreTest"]["default"] == {"enabled": True, "schedule": "0 5 * * 0"}
    assert (backup["retentionDays"]["default"], backup["schedule"]["default"]) == (7, "0 3 * * *")


def test_pod_template_offers_only_the_allowed_fields() -> None:
    assert set(SPEC["properties"]["podTemplate"]["properties"]) == {
        "labels",
        "annotations",
        "nodeSelector",
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
        "priorityClassName",
    }
    pod_template = SPEC["properties"]["podTemplate"]
    assert "x-kubernetes-preserve-unknown-fields" not in pod_template, "unknown keys are pruned, never kept"
    assert pod_template["properties"]["affinity"]["x-kubernetes-preserve-unknown-fields"] is True


def test_status_lists_are_maps_keyed_by_name_and_type() -> None:
    status = SCHEMA["properties"]["status"]["properties"]
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]
    assert status["instances"]["x-kubernetes-list-map-keys"] == ["name"]
    assert status["phase"]["enum"] == list(PHASES)
    assert set(status["instances"]["items"]["properties"]) == {
        "name",
        "role",
        "ready",
        "receivedLSN",
        "replayedLSN",
        "lagBytes",
    }
    assert {"time", "from", "to", "lsnGapBytes", "dataLossPossible"} <= set(status["lastFailover"]["properties"])


# --- the models in Python ---------------------------------------------------------------------------------------


def test_minimal_spec_defaults_in_python_match_the_schema() -> None:
    spec = PostgresClusterSpec.model_validate(MINIMAL)
    assert spec.model_dump(exclude_none=True) == {
        **MINIMAL,
        "replicas": 1,
        "replication": {"mode": "Async"},
        "failover": {"policy": "Automatic", "maxDataLossBytes": DEFAULT_MAX_DATA_LOSS_BYTES, "delaySeconds": 0},
        "deletionPolicy": "Retain",
        "bootstrap": {"initdb": {"database": "app", "owner": "app"}},
    }
    assert spec.failover.max_data_loss_bytes == 16 * 1024 * 1024
    assert spec.bootstrap.initdb is not None
    assert spec.bootstrap.recovery is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"version": 13}, "version"),
        ({"version": 19}, "version"),
        ({"replicas": 10}, "replicas"),
        ({"replicas": -1}, "replicas"),
        ({"storage": {"size": "lots"}}, "storage.size"),
        ({"deletionPolicy": "Destroy"}, "deletionPolicy"),
        ({"failover": {"policy": "Sometimes"}}, "failover.policy"),
        ({"failover": {"maxDataLossBytes": -1}}, "failover.maxDataLossBytes"),
        ({"backup": {"retentionDays": 0, "repository": {"volume": {"size": "1Gi"}}}}, "backup.retentionDays"),
        ({"backup": {"schedule": "nightly", "repository": {"volume": {"size": "1Gi"}}}}, "backup.schedule"),
        ({"podTemplate": {"containers": []}}, "podTemplate.containers"),
    ],
)
def test_python_validation_refuses_what_the_schema_refuses(change: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as refused:
        PostgresClusterSpec.model_validate({**MINIMAL, **change})
    locations = {".".join(str(part) for part in error["loc"]) for error in refused.value.errors()}
    assert field in locations, locations


def test_status_uses_kubernetes_wire_names() -> None:
    status = PostgresClusterStatus.model_validate(
        {
            "instances": [{"name": "db-1", "role": "Primary", "receivedLSN": "0/3000148"}],
            "lastFailover": {"time": "2026-05-01T12:00:00Z", "from": "db-2", "to": "db-1", "dataLossPossible": False},
            "upgrade": {"phase": "Checking", "from": 16, "to": 17},
        }
    )
    assert status.instances[0].received_lsn == "0/3000148"
    assert status.last_failover is not None
    assert status.last_failover.from_ == "db-2"
    dumped = status.model_dump(exclude_none=True)
    assert dumped["instances"] == [{"name": "db-1", "role": "Primary", "ready": False, "receivedLSN": "0/3000148"}]
    assert dumped["upgrade"] == {"phase": "Checking", "from": 16, "to": 17}


def test_samples_read_into_the_models() -> None:
    samples = [
        document
        for path in sorted((ROOT / "examples").rglob("*.yaml"))
        for document in yaml.safe_load_all(path.read_text())
        if isinstance(document, dict) and document.get("kind") == "PostgresCluster"
    ]
    assert len(samples) >= 6
    for sample in samples:
        model = PostgresCluster.model_validate(sample)
        assert "namespace" not in model.metadata, "samples go into whatever namespace they are applied to"
    assert {sample["metadata"]["name"] for sample in samples} >= {"orders", "minimal", "reports", "orders-restored"}


# --- constants and patterns -------------------------------------------------------------------------------------


def test_operator_owned_parameters_include_the_issue_examples_and_the_cel_rule_lists_them_all() -> None:
    assert {"listen_addresses", "port", "archive_command", "primary_conninfo", "wal_level"} <= set(
        OPERATOR_OWNED_PARAMETERS
    )
    assert list(OPERATOR_OWNED_PARAMETERS) == sorted(set(OPERATOR_OWNED_PARAMETERS))
    parameters = SPEC["properties"]["postgresql"]["properties"]["parameters"]
    (owned_rule,) = [rule for rule in parameters["x-kubernetes-validations"] if rule.get("reason")]
    assert re.findall(r"'([a-z_]+)'", owned_rule["rule"]) == list(OPERATOR_OWNED_PARAMETERS)


@pytest.mark.parametrize(
    "schedule",
    ["0 3 * * *", "*/15 * * * *", "0 0 1 1 *", "30 2 * * 1-5", "0 4 ? * SUN", "0 0,12 1-7 JAN-mar 0", "@daily",
     "5 4 * * 7", "0  3 * * *"],
)  # fmt: skip
def test_cron_accepts_standard_schedules(schedule: str) -> None:
    assert re.fullmatch(CRON_PATTERN, schedule)


@pytest.mark.parametrize(
    "schedule",
    ["", "every night", "0 3 * *", "0 0 3 * * *", "60 * * * *", "0 24 * * *", "0 0 0 * *", "0 0 32 * *",
     "0 0 * 13 *", "0 0 * * 8", "*/0 * * * *", "@reboot", " 0 3 * * *", "0 3 * * * ", "0 3 * * *\n"],
)  # fmt: skip
def test_cron_refuses_everything_else(schedule: str) -> None:
    assert not re.fullmatch(CRON_PATTERN, schedule)


def test_reflow_joins_lines_and_keeps_paragraphs() -> None:
    assert reflow("One\n    two.\n\n    Three\n    four.") == "One two.\n\nThree four."
    assert reflow("Single line.") == "Single line."
