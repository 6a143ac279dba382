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

from kanri.contract import parameters, roles
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
    assert CUSTOM_RESOURCES[0] == (PostgresCluster,), "PostgresCluster first, one version"


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
    assert properties["primaryUpdateStrategy"]["default"] == "Switchover"
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
    kept = [path for path, node in nodes(pod_template) if node.get("x-kubernetes-preserve-unknown-fields")]
    assert "x-kubernetes-preserve-unknown-fields" not in pod_template, "unknown keys are pruned, never kept"
    assert kept == [], "affinity and topologySpreadConstraints have Kubernetes' structure, not a free-form object"
    affinity = pod_template["properties"]["affinity"]["properties"]
    assert set(affinity) == {"nodeAffinity", "podAffinity", "podAntiAffinity"}
    spread = pod_template["properties"]["topologySpreadConstraints"]["items"]
    assert spread["required"] == ["maxSkew", "topologyKey", "whenUnsatisfiable"]


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
        "primaryUpdateStrategy": "Switchover",
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


def rules_of(node: dict[str, Any]) -> list[dict[str, Any]]:
    return list(node.get("x-kubernetes-validations", []))


PARAMETERS = SPEC["properties"]["postgresql"]["properties"]["parameters"]


def test_operator_owned_parameters_are_the_contracts_and_the_cel_rule_lists_them_all() -> None:
    assert OPERATOR_OWNED_PARAMETERS is parameters.OPERATOR_OWNED, "one list for the API and the instance manager"
    assert {"listen_addresses", "port", "archive_command", "primary_conninfo", "wal_level"} <= set(
        OPERATOR_OWNED_PARAMETERS
    )
    assert list(OPERATOR_OWNED_PARAMETERS) == sorted(set(OPERATOR_OWNED_PARAMETERS))
    (owned,) = [r for r in rules_of(PARAMETERS) if "managed by the operator" in r["messageExpression"]]
    assert re.findall(r"'([a-z_]+)'", owned["rule"]) == list(OPERATOR_OWNED_PARAMETERS)


def test_the_forbidden_rule_lists_every_forbidden_parameter_and_the_ssl_family() -> None:
    (rule,) = [r for r in rules_of(PARAMETERS) if "read files" in r["messageExpression"]]
    assert re.findall(r"'([a-z_]+)'", rule["rule"]) == [*parameters.FORBIDDEN, "ssl", "ssl_"]
    assert {"include", "include_if_exists", "include_dir", "dynamic_library_path"} <= set(parameters.FORBIDDEN)
    assert rule["reason"] == "FieldValueForbidden"


def test_parameter_values_are_one_line_without_nul() -> None:
    (value_rule,) = rules_of(PARAMETERS["additionalProperties"])
    assert parameters.VALUE_PATTERN in value_rule["rule"]
    # The CEL cost estimate was measured with these bounds (docs/runtime-crd.md).
    assert PARAMETERS["maxProperties"] == 256
    assert PARAMETERS["additionalProperties"]["maxLength"] == 4096


@pytest.mark.parametrize(
    "value",
    ["pg_stat_statements", "pg_stat_statements,auto_explain", ' "pg_prewarm" , auth_delay ', "", "passwordcheck"],
)
def test_preload_lists_of_shipped_libraries_are_allowed(value: str) -> None:
    assert re.fullmatch(parameters.PRELOAD_LIST_PATTERN, value)
    assert parameters.refusal("shared_preload_libraries", value) is None


@pytest.mark.parametrize(
    "value",
    ["evil", "pg_stat_statements,evil", "/tmp/evil.so", '"pg_prewarm', "pg_prewarm,", "$libdir/auto_explain"],
)
def test_preload_lists_of_anything_else_are_refused(value: str) -> None:
    assert not re.fullmatch(parameters.PRELOAD_LIST_PATTERN, value)


def test_descriptions_name_what_the_contract_lists() -> None:
    """Docstrings are static text: they must keep up with the contract's lists."""
    described = " ".join(PARAMETERS["description"].split())
    for name in (*parameters.PRELOAD_LIBRARIES, *parameters.PRELOAD_PARAMETERS, "include_if_exists", "ssl_*"):
        assert name in described, name
    initdb = SPEC["properties"]["bootstrap"]["properties"]["initdb"]["properties"]
    for name in roles.RESERVED_ROLES:
        assert name in initdb["owner"]["description"], name
    for name in roles.RESERVED_DATABASES:
        assert name in initdb["database"]["description"], name


def test_initdb_rules_refuse_every_reserved_role_and_database() -> None:
    initdb = SPEC["properties"]["bootstrap"]["properties"]["initdb"]["properties"]
    (owner,) = rules_of(initdb["owner"])
    (database,) = rules_of(initdb["database"])
    assert re.findall(r"'([a-z_0-9]+)'", owner["rule"]) == [*roles.RESERVED_ROLES, roles.RESERVED_PREFIX]
    assert re.findall(r"'([a-z_0-9]+)'", database["rule"]) == [*roles.RESERVED_DATABASES, roles.RESERVED_PREFIX]


# From the Kubernetes documentation (Assigning Pods to Nodes, Pod Topology Spread Constraints).
DOCS_AFFINITY: dict[str, Any] = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                       "values": ["antarctica-east1", "antarctica-west1"]}]}
            ]
        },
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 1, "preference": {"matchExpressions": [
                {"key": "another-node-label-key", "operator": "In", "values": ["another-node-label-value"]}]}}
        ],
    },
    "podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": {
                "labelSelector": {"matchExpressions": [{"key": "security", "operator": "In", "values": ["S2"]}]},
                "topologyKey": "topology.kubernetes.io/zone"}}
        ]
    },
}  # fmt: skip
DOCS_SPREAD: dict[str, Any] = {
    "maxSkew": 1,
    "topologyKey": "zone",
    "whenUnsatisfiable": "DoNotSchedule",
    "labelSelector": {"matchLabels": {"foo": "bar"}},
    "matchLabelKeys": ["pod-template-hash"],
}


def test_a_documented_affinity_is_accepted_and_passed_on_unchanged() -> None:
    spec = PostgresClusterSpec.model_validate(
        {**MINIMAL, "podTemplate": {"affinity": DOCS_AFFINITY, "topologySpreadConstraints": [DOCS_SPREAD]}}
    )
    assert spec.pod_template is not None
    assert spec.pod_template.affinity == DOCS_AFFINITY
    assert spec.pod_template.topology_spread_constraints == [DOCS_SPREAD]


@pytest.mark.parametrize(
    "pod_template",
    [
        {"affinity": {"nodeAffinity": "x"}},
        {"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"topologyKey": ""}]}}},
        {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}]}}}},
        {"affinity": {"weird": {}}},
        {"topologySpreadConstraints": [{"maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule"}]},
        {"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"}]},
    ],
)  # fmt: skip
def test_python_validation_refuses_a_malformed_affinity_or_spread(pod_template: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        PostgresClusterSpec.model_validate({**MINIMAL, "podTemplate": pod_template})


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
