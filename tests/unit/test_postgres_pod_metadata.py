"""podTemplate labels and annotations: what is patched onto a running pod, and what the StatefulSet template keeps."""

from __future__ import annotations

import copy
import json
from typing import Any

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.children.statefulset import RESTART, statefulset
from kanri.postgres.cluster.diff import HASH_ANNOTATION, needs_apply
from kanri.postgres.pods.metadata import APPLIED, PodMetadata, kept_template, pod_patch, wanted

Obj = dict[str, Any]


def spec(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None, **more: Any) -> Obj:
    body: Obj = {"version": 15, "replicas": 2, "storage": {"size": "1Gi"}, **more}
    if labels is not None or annotations is not None:
        body["podTemplate"] = {"labels": labels or {}, "annotations": annotations or {}}
    return body


def sts(body: Obj, *, restart: str | None = None, current: Obj | None = None) -> Obj:
    meta: Obj = {"name": "pg", "namespace": "ns", "uid": "u1"}
    if restart:
        meta["annotations"] = {RESTART: restart}
    parsed = PostgresClusterSpec.model_validate(body)
    owner = {"apiVersion": "kanri.dev/v1alpha1", "kind": "PostgresCluster", "metadata": meta}
    desired = statefulset(owner, parsed, "pg-1", role="primary", image="img:15", running=True)
    return kept_template(desired, current, wanted(parsed))


def template_meta(obj: Obj) -> Obj:
    return dict(obj["spec"]["template"]["metadata"])


def pod(labels: dict[str, str], annotations: dict[str, str] | None = None) -> Obj:
    return {"metadata": {"name": "pg-1-0", "labels": labels, "annotations": annotations or {}}}


def record(labels: list[str], annotations: list[str]) -> str:
    return json.dumps({"annotations": annotations, "labels": labels}, separators=(",", ":"))


OPERATOR_LABELS = {"kanri.dev/cluster": "pg", "kanri.dev/role": "primary", "app.kubernetes.io/name": "postgresql"}


def test_a_pod_gets_the_wanted_metadata_and_a_record_of_the_keys() -> None:
    want = PodMetadata(labels={"team": "a"}, annotations={"note": "x"})
    patch = pod_patch(want, pod(dict(OPERATOR_LABELS)))
    assert patch == {"metadata": {"labels": {"team": "a"},
                                  "annotations": {"note": "x", APPLIED: record(["team"], ["note"])}}}  # fmt: skip


def test_a_pod_already_carrying_the_metadata_is_left_alone() -> None:
    want = PodMetadata(labels={"team": "a"}, annotations={"note": "x"})
    current = pod({**OPERATOR_LABELS, "team": "a"}, {"note": "x", APPLIED: record(["team"], ["note"])})
    assert pod_patch(want, current) is None
    assert pod_patch(PodMetadata(), pod(dict(OPERATOR_LABELS))) is None  # nothing wanted, nothing recorded


def test_only_keys_kanri_applied_are_removed_never_others_nor_reserved_ones() -> None:
    current = pod(
        {**OPERATOR_LABELS, "team": "a", "by-hand": "y"},
        {"note": "x", "other": "z", APPLIED: record(["kanri.dev/role", "team"], ["note"])},
    )
    patch = pod_patch(PodMetadata(labels={"tier": "db"}), current)
    assert patch == {"metadata": {"labels": {"tier": "db", "team": None},
                                  "annotations": {"note": None, APPLIED: record(["tier"], [])}}}  # fmt: skip


def test_the_record_goes_when_nothing_is_wanted_any_more_and_a_changed_value_is_replaced() -> None:
    current = pod({**OPERATOR_LABELS, "team": "a"}, {APPLIED: record(["team"], [])})
    assert pod_patch(PodMetadata(), current) == {"metadata": {"labels": {"team": None},
                                                              "annotations": {APPLIED: None}}}  # fmt: skip
    assert pod_patch(PodMetadata(labels={"team": "b"}), current) == {"metadata": {"labels": {"team": "b"}}}


def test_an_unreadable_record_removes_nothing() -> None:
    current = pod({**OPERATOR_LABELS, "team": "a"}, {APPLIED: "not json"})
    patch = pod_patch(PodMetadata(), current)
    assert patch == {"metadata": {"annotations": {APPLIED: None}}}


def test_a_new_statefulset_carries_the_metadata_and_its_record() -> None:
    meta = template_meta(sts(spec({"team": "a"}, {"note": "x"})))
    assert meta["labels"]["team"] == "a"
    assert meta["labels"]["kanri.dev/instance"] == "pg-1"
    assert meta["annotations"] == {"note": "x", APPLIED: record(["team"], ["note"])}


def test_a_metadata_change_alone_keeps_the_template_and_its_hash() -> None:
    current = sts(spec({"team": "a"}, {"note": "x"}))
    changed = sts(spec({"tier": "db"}), current=copy.deepcopy(current))
    assert changed["spec"]["template"] == current["spec"]["template"]  # nothing for the StatefulSet to roll
    assert not needs_apply(changed, current)  # not even a write


def test_a_template_that_changes_anyway_carries_the_new_metadata() -> None:
    current = sts(spec({"team": "a"}, {"note": "x"}))
    rolled = sts(spec({"tier": "db"}), restart="1", current=copy.deepcopy(current))
    meta = template_meta(rolled)
    assert "team" not in meta["labels"]
    assert meta["labels"]["tier"] == "db"
    assert meta["annotations"] == {RESTART: "1", APPLIED: record(["tier"], [])}
    assert needs_apply(rolled, current)
    assert rolled["metadata"]["annotations"][HASH_ANNOTATION] != current["metadata"]["annotations"][HASH_ANNOTATION]


def test_a_statefulset_made_before_the_record_keeps_its_template_without_one() -> None:
    current = sts(spec({"team": "a"}))
    del current["spec"]["template"]["metadata"]["annotations"]  # as the operator made them before this module
    changed = sts(spec({"team": "b"}, {"note": "x"}), current=copy.deepcopy(current))
    assert changed["spec"]["template"] == current["spec"]["template"]


def test_a_pod_born_before_the_record_loses_the_keys_its_template_gave_it_and_only_those() -> None:
    template = {"labels": {**OPERATOR_LABELS, "team": "a"}, "annotations": {"note": "x", RESTART: "1"}}
    current = pod({**OPERATOR_LABELS, "team": "a", "by-hand": "y"}, {"note": "x", RESTART: "1"})
    patch = pod_patch(PodMetadata(labels={"tier": "db"}), current, template)
    assert patch == {"metadata": {"labels": {"tier": "db", "team": None},
                                  "annotations": {"note": None, APPLIED: record(["tier"], [])}}}  # fmt: skip
    recorded = {**template, "annotations": {APPLIED: record([], [])}}  # a template with a record: the pod's counts
    assert pod_patch(PodMetadata(), current, recorded) is None
