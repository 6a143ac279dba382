"""PostgresCluster, PostgresBackup and PostgresPooler v1beta1: every valid object converts to the other version and
back unchanged, defaults agree on both paths, and no v1alpha1 field is missing from v1beta1."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, get_args, get_origin

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from kanri.postgres.api import v1alpha1, v1beta1
from kanri.postgres.api.conversion import (
    DEPRECATION_WARNING,
    POSTGRES,
    POSTGRES_BACKUPS,
    POSTGRES_CLUSTERS,
    POSTGRES_POOLERS,
    PostgresClusterV1Alpha1,
)
from kanri.postgres.api.v1alpha1 import postgres_pooler
from kanri.runtime import ConversionError, crd_for

ROOT = Path(__file__).resolve().parents[2]
V1ALPHA1, V1BETA1 = "kanri.dev/v1alpha1", "kanri.dev/v1beta1"
PRESERVED_V1BETA1 = "kanri.dev/preserved-v1beta1"
MIB = 1 << 20

byte_counts = st.integers(min_value=0, max_value=v1beta1.MAX_BYTES) | st.integers(0, 4096).map(lambda n: n * MIB)
times = st.sampled_from(["2026-12-01T10:00:00Z", "2026-12-06T13:45:12Z"])


@st.composite
def specs(draw: st.DrawFn, suffix: str, amounts: st.SearchStrategy[Any]) -> dict[str, Any]:
    """A PostgresCluster spec; its amounts of WAL named ``maxDataLoss<suffix>``/``maxReadLag<suffix>``."""
    replicas = draw(st.integers(0, v1alpha1.MAX_REPLICAS))
    spec: dict[str, Any] = {"version": draw(st.integers(14, 18)), "replicas": replicas,
                            "storage": {"size": draw(st.sampled_from(["1Gi", "10Gi", "500Mi"]))}}  # fmt: skip
    if replicas >= 2 and draw(st.booleans()):
        spec["replication"] = {"mode": "Sync", "syncStandbys": draw(st.integers(1, replicas - 1))}
        if draw(st.booleans()):
            spec["replication"]["dataDurability"] = draw(st.sampled_from(["required", "preferred"]))
    if draw(st.booleans()):
        spec.setdefault("replication", {})["maxReadLag" + suffix] = draw(amounts)
    if draw(st.booleans()):
        failover: dict[str, Any] = {"maxDataLoss" + suffix: draw(amounts)}
        if draw(st.booleans()):
            failover["policy"] = draw(st.sampled_from(["Automatic", "Manual"]))
        if draw(st.booleans()):
            failover["delaySeconds"] = draw(st.integers(0, 3600))
        spec["failover"] = failover
    if draw(st.booleans()):
        spec["deletionPolicy"] = draw(st.sampled_from(["Retain", "Delete"]))
    if draw(st.booleans()):
        spec["upgrade"] = {"approvedVersion": spec["version"], "withoutBackup": draw(st.booleans())}
    if draw(st.booleans()):
        spec["postgresql"] = {"parameters": {"work_mem": "8MB"}}
    return spec


@st.composite
def statuses(draw: st.DrawFn) -> dict[str, Any] | None:
    if draw(st.booleans()):
        return None
    status: dict[str, Any] = {"phase": draw(st.sampled_from(v1alpha1.PHASES)), "readyReplicas": draw(st.integers(0, 9))}
    if draw(st.booleans()):
        status["lastFailover"] = {"time": draw(times), "from": "db-1", "to": "db-2", "dataLossPossible": True,
                                  "lsnGapBytes": draw(st.integers(0, 1 << 40))}  # fmt: skip
    return status


def _manifest(api_version: str, spec: dict[str, Any], status: dict[str, Any] | None) -> dict[str, Any]:
    obj = {"apiVersion": api_version, "kind": "PostgresCluster", "spec": spec,
           "metadata": {"name": "db", "namespace": "prod", "labels": {"team": "a"}, "generation": 3}}  # fmt: skip
    if status is not None:
        obj["status"] = status
    return obj


def _defaulted(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` as its version's model writes it (defaults filled): what the API server stores and converts."""
    model = POSTGRES_CLUSTERS.resources[0] if obj["apiVersion"] == V1BETA1 else PostgresClusterV1Alpha1
    dumped: dict[str, Any] = model.model_validate(obj).model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


@st.composite
def v1alpha1_clusters(draw: st.DrawFn) -> dict[str, Any]:
    return _defaulted(_manifest(V1ALPHA1, draw(specs("Bytes", byte_counts)), draw(statuses())))


@st.composite
def v1beta1_clusters(draw: st.DrawFn, quantities: st.SearchStrategy[str]) -> dict[str, Any]:
    return _defaulted(_manifest(V1BETA1, draw(specs("", quantities)), draw(statuses())))


canonical_quantities = byte_counts.map(v1beta1.byte_quantity)
# The same amounts written otherwise: plain numbers, decimal suffixes, smaller binary suffixes.
other_quantities = st.integers(0, 1 << 20).flatmap(
    lambda n: st.sampled_from([str(n * 1024) + "Ki", f"{n}k", f"{n}M", str(n * MIB)])
)


@settings(max_examples=150, deadline=None)
@given(v1alpha1_clusters())
def test_v1alpha1_to_v1beta1_and_back_is_unchanged(cluster: dict[str, Any]) -> None:
    new = POSTGRES.convert(cluster, V1BETA1)
    assert new["metadata"] == cluster["metadata"]  # v1beta1 holds everything v1alpha1 does: no annotation
    assert new["status"] if "status" in cluster else "status" not in new
    loss = v1beta1.byte_count(new["spec"]["failover"]["maxDataLoss"])
    assert loss == cluster["spec"]["failover"]["maxDataLossBytes"]
    if "maxReadLagBytes" in cluster["spec"]["replication"]:
        lag = new["spec"]["replication"]["maxReadLag"]
        assert v1beta1.byte_count(lag) == cluster["spec"]["replication"]["maxReadLagBytes"]
    else:
        assert "maxReadLag" not in new["spec"]["replication"]  # unset stays unset: the default applies
    assert POSTGRES.convert(new, V1ALPHA1) == cluster


@settings(max_examples=150, deadline=None)
@given(v1beta1_clusters(canonical_quantities))
def test_v1beta1_to_v1alpha1_and_back_is_unchanged(cluster: dict[str, Any]) -> None:
    old = POSTGRES.convert(cluster, V1ALPHA1)
    assert old["metadata"] == cluster["metadata"]  # a canonical quantity is exactly a byte count: no annotation
    assert old.get("status") == cluster.get("status")
    assert POSTGRES.convert(old, V1BETA1) == cluster


@settings(max_examples=100, deadline=None)
@given(v1beta1_clusters(other_quantities))
def test_a_quantity_written_otherwise_comes_back_as_written(cluster: dict[str, Any]) -> None:
    old = POSTGRES.convert(cluster, V1ALPHA1)
    written = cluster["spec"]["failover"]["maxDataLoss"]
    assert old["spec"]["failover"]["maxDataLossBytes"] == v1beta1.byte_count(written)
    if v1beta1.byte_quantity(v1beta1.byte_count(written)) != written:
        assert PRESERVED_V1BETA1 in old["metadata"]["annotations"]
    assert POSTGRES.convert(old, V1BETA1) == cluster


def test_a_change_made_through_v1alpha1_wins_over_the_preserved_quantity() -> None:
    new = _defaulted(_manifest(V1BETA1, {"version": 17, "storage": {"size": "1Gi"},
                                         "failover": {"maxDataLoss": "16384Ki"}}, None))  # fmt: skip
    old = POSTGRES.convert(new, V1ALPHA1)
    old["spec"]["failover"]["maxDataLossBytes"] = 0
    assert POSTGRES.convert(old, V1BETA1)["spec"]["failover"]["maxDataLoss"] == "0"
    old["spec"]["failover"]["maxDataLossBytes"] = 16 * MIB  # unchanged: the way it was written comes back
    assert POSTGRES.convert(old, V1BETA1)["spec"]["failover"]["maxDataLoss"] == "16384Ki"


def test_defaults_are_the_same_whichever_version_a_cluster_is_written_in() -> None:
    spec = {"version": 17, "storage": {"size": "1Gi"}}
    from_old = POSTGRES.convert(_defaulted(_manifest(V1ALPHA1, copy.deepcopy(spec), None)), V1BETA1)
    assert from_old == _defaulted(_manifest(V1BETA1, copy.deepcopy(spec), None))
    assert from_old["spec"]["failover"] == {"policy": "Automatic", "maxDataLoss": "16Mi", "delaySeconds": 0}
    from_new = POSTGRES.convert(_defaulted(_manifest(V1BETA1, copy.deepcopy(spec), None)), V1ALPHA1)
    assert from_new == _defaulted(_manifest(V1ALPHA1, copy.deepcopy(spec), None))


@pytest.mark.parametrize("quantity", ["1500m", "-1Mi", "8Ei", "1.5", "lots"])
def test_a_loss_that_is_no_whole_byte_count_is_refused(quantity: str) -> None:
    cluster = _manifest(
        V1BETA1, {"version": 17, "storage": {"size": "1Gi"}, "failover": {"maxDataLoss": quantity}}, None
    )
    with pytest.raises(ConversionError, match="maxDataLoss"):
        POSTGRES.convert(cluster, V1ALPHA1)


@pytest.mark.parametrize(
    "path", [*sorted((ROOT / "examples/postgres").glob("*.yaml")), ROOT / "examples/postgrescluster.yaml"]
)
def test_the_example_manifests_convert_both_ways(path: Path) -> None:
    for document in yaml.safe_load_all(path.read_text()):
        if not document or document.get("kind") not in ("PostgresCluster", "PostgresBackup"):
            continue
        stored = _defaulted(document) if document["kind"] == "PostgresCluster" else document
        new = POSTGRES.convert(stored, V1BETA1)
        assert new["apiVersion"] == V1BETA1
        assert POSTGRES.convert(new, V1ALPHA1) == stored


backup_statuses = st.fixed_dictionaries(
    {"phase": st.sampled_from(v1alpha1.BACKUP_PHASES)},
    optional={"startedAt": times, "sizeBytes": st.integers(0, 1 << 50), "timeline": st.integers(1, 99),
              "beginWAL": st.just("000000010000000000000002"), "reason": st.sampled_from(["Started", "Completed"])},
)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([V1ALPHA1, V1BETA1]), st.none() | backup_statuses)
def test_every_backup_converts_to_the_other_version_and_back(api_version: str, status: dict[str, Any] | None) -> None:
    backup: dict[str, Any] = {"apiVersion": api_version, "kind": "PostgresBackup", "spec": {"cluster": "db"},
                              "metadata": {"name": "b", "namespace": "prod"}}  # fmt: skip
    if status is not None:
        backup["status"] = status
    other = V1BETA1 if api_version == V1ALPHA1 else V1ALPHA1
    converted = POSTGRES_BACKUPS.convert(backup, other)
    assert converted == {**backup, "apiVersion": other}
    assert POSTGRES_BACKUPS.convert(converted, api_version) == backup


def test_a_backup_changes_only_its_api_version() -> None:
    backup = {"apiVersion": V1ALPHA1, "kind": "PostgresBackup", "metadata": {"name": "b"}, "spec": {"cluster": "db"},
              "status": {"phase": "Completed", "beginWAL": "000000010000000000000002", "sizeBytes": 1234}}  # fmt: skip
    new = POSTGRES_BACKUPS.convert(backup, V1BETA1)
    assert new == {**backup, "apiVersion": V1BETA1}
    assert POSTGRES_BACKUPS.convert(new, V1ALPHA1) == backup


pooler_specs = st.fixed_dictionaries(
    {"cluster": st.sampled_from(["db", "orders-main"])},
    optional={"type": st.sampled_from(["rw", "ro"]), "instances": st.integers(0, 16),
              "mode": st.sampled_from(["transaction", "session"]),
              "parameters": st.dictionaries(st.sampled_from(postgres_pooler.USER_PARAMETERS),
                                            st.sampled_from(["0", "20", "on", "SELECT 1"]), max_size=4),
              "resources": st.just({"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}})},
)  # fmt: skip
_READY = {"type": "Ready", "status": "True", "reason": "Ready", "message": "2 of 2",
          "lastTransitionTime": "2026-12-01T10:00:00Z"}  # fmt: skip
pooler_statuses = st.fixed_dictionaries(
    {"conditions": st.sampled_from([[], [_READY]])},  # a default the models write out
    optional={"instances": st.integers(0, 16), "readyInstances": st.integers(0, 16), "service": st.just("db-pooler"),
              "authSecretVersion": st.just("4711"), "configHash": st.just("0" * 64),
              "observedGeneration": st.integers(0, 99)},
)  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(st.sampled_from([V1ALPHA1, V1BETA1]), pooler_specs, st.none() | pooler_statuses)
def test_every_pooler_converts_to_the_other_version_and_back(
    api_version: str, spec: dict[str, Any], status: dict[str, Any] | None
) -> None:
    pooler: dict[str, Any] = {"apiVersion": api_version, "kind": "PostgresPooler", "spec": spec,
                              "metadata": {"name": "db-pooler", "namespace": "prod"}}  # fmt: skip
    if status is not None:
        pooler["status"] = status
    other = V1BETA1 if api_version == V1ALPHA1 else V1ALPHA1
    converted = POSTGRES_POOLERS.convert(pooler, other)
    back = POSTGRES_POOLERS.convert(converted, api_version)
    # The defaults (type, instances, mode, parameters) are filled in; nothing else changes but apiVersion, either way.
    assert converted == {**back, "apiVersion": other}
    assert back == {**pooler, "spec": {"type": "rw", "instances": 2, "mode": "transaction", "parameters": {}, **spec}}
    assert POSTGRES_POOLERS.convert(back, other) == converted


# --- every field of v1alpha1 has its place in v1beta1 ------------------------------------------------------------

RENAMED = {
    "spec.failover.maxDataLossBytes": "spec.failover.maxDataLoss",
    "spec.replication.maxReadLagBytes": "spec.replication.maxReadLag",
}
"""v1alpha1 path -> v1beta1 path of every field v1beta1 moved or renamed (docs/postgrescluster.md, "v1beta1")."""


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [model for arg in get_args(annotation) for model in _models_in(arg)] if get_origin(annotation) else []


def _field_paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    paths = set()
    for name, field in model.model_fields.items():
        path = f"{prefix}{field.alias or name}"
        paths.add(path)
        for inner in _models_in(field.annotation):
            paths |= _field_paths(inner, path + ".")
    return paths


@pytest.mark.parametrize(("old", "new"), [(v1alpha1.PostgresCluster, v1beta1.PostgresCluster),
                                          (v1alpha1.PostgresBackup, v1beta1.PostgresBackup),
                                          (postgres_pooler.PostgresPooler, v1beta1.PostgresPooler)])  # fmt: skip
def test_every_v1alpha1_field_is_in_v1beta1_or_declared_renamed(old: type[BaseModel], new: type[BaseModel]) -> None:
    old_paths, new_paths = _field_paths(old), _field_paths(new)
    expected = {RENAMED.get(path, path) for path in old_paths}
    assert new_paths - expected == set(), "new in v1beta1 without a conversion test: add it to RENAMED or the tests"
    assert expected - new_paths == set(), "a v1alpha1 field has no place in v1beta1: mirror it there"


# --- the generated CRDs ----------------------------------------------------------------------------------------


def _schema(crd: dict[str, Any], version: str) -> dict[str, Any]:
    entry = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    schema: dict[str, Any] = entry["schema"]["openAPIV3Schema"]
    return schema


def _served_as(version: dict[str, Any]) -> dict[str, Any]:
    """A CRD version without what the deprecation changes: storage, the deprecation and the kind's description."""
    served = {k: v for k, v in version.items() if k not in ("storage", "deprecated", "deprecationWarning")}
    schema = {k: v for k, v in version["schema"]["openAPIV3Schema"].items() if k != "description"}
    return {**served, "schema": schema}


def test_the_two_version_crd_stores_v1beta1_and_deprecates_v1alpha1() -> None:
    crd = crd_for(*POSTGRES_CLUSTERS.resources, webhook={"service": {"name": "kanri-webhook", "namespace": "kanri"}})
    versions = {v["name"]: v for v in crd["spec"]["versions"]}
    assert (versions["v1beta1"]["storage"], versions["v1alpha1"]["storage"]) == (True, False)
    assert versions["v1alpha1"]["deprecated"] is True
    assert versions["v1alpha1"]["deprecationWarning"] == DEPRECATION_WARNING
    assert "2027-12-31" in DEPRECATION_WARNING
    assert "deprecated" not in versions["v1beta1"]
    assert crd["spec"]["conversion"]["strategy"] == "Webhook"
    # v1alpha1 is served exactly as deploy/crds/ serves it today (same schema, columns and subresources).
    deployed = yaml.safe_load((ROOT / "deploy/crds/postgresclusters.kanri.dev.yaml").read_text())
    (today,) = deployed["spec"]["versions"]
    assert _served_as(versions["v1alpha1"]) == _served_as(today)
    assert "deprecated version" in _schema(crd, "v1alpha1")["description"]
    failover = _schema(crd, "v1beta1")["properties"]["spec"]["properties"]["failover"]
    assert set(failover["properties"]) == {"policy", "maxDataLoss", "delaySeconds"}
    assert failover["properties"]["maxDataLoss"]["x-kubernetes-int-or-string"] is True
    assert failover["default"]["maxDataLoss"] == "16Mi"
    assert versions["v1beta1"]["additionalPrinterColumns"] == today["additionalPrinterColumns"]


@pytest.mark.parametrize(
    ("conversion", "deployed_file"),
    [(POSTGRES_BACKUPS, "postgresbackups.kanri.dev.yaml"), (POSTGRES_POOLERS, "postgrespoolers.kanri.dev.yaml")],
)
def test_the_backup_and_pooler_crds_have_both_versions_with_one_schema(conversion: Any, deployed_file: str) -> None:
    crd = crd_for(*conversion.resources)
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1beta1", "v1alpha1"]
    deployed = yaml.safe_load((ROOT / "deploy/crds" / deployed_file).read_text())
    new, old = _served_as(crd["spec"]["versions"][0]), _served_as(crd["spec"]["versions"][1])
    assert new == {**old, "name": "v1beta1"}
    assert old == _served_as(deployed["spec"]["versions"][0])
