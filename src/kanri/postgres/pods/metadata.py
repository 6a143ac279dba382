"""``spec.podTemplate.labels`` and ``.annotations``, applied to the running pods in place: no restart.

A StatefulSet rolls its pod whenever anything in its pod template changes, metadata included, so the user's pod
metadata does not drive the template: :func:`kept_template` keeps the user metadata the template already has unless
the rest of the template changes anyway (the rollout then carries the new metadata along, so later pods are born
with it), and :func:`pod_patch` brings each running pod to the wanted metadata with a patch.

What kanri applied is recorded on the pod (and in the template, so a pod the StatefulSet recreates carries the record
of what it was born with) in :data:`APPLIED`: only those keys are ever removed again. Keys the operator, the
StatefulSet controller or the selectors own (:func:`reserved`) are never set or removed here; the API refuses them in
the spec (``kanri.postgres.api.v1alpha1.pod_template``).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.api.v1alpha1.pod_template import OPERATOR_LABEL_PREFIX, RESERVED_POD_LABELS
from kanri.postgres.cluster.diff import HASH_ANNOTATION, is_subset, with_hash
from kanri.postgres.context import ChildStep
from kanri.runtime import Kind
from kanri.runtime.kinds import POD, STATEFUL_SET

__all__ = ["APPLIED", "PodMetadata", "apply", "kept_template", "pod_patch", "reserved", "wanted"]

Obj = dict[str, Any]

APPLIED = f"{OPERATOR_LABEL_PREFIX}pod-metadata"
"""On pods and pod templates: the podTemplate label and annotation keys kanri applied there (JSON, sorted lists)."""


@dataclass(frozen=True)
class PodMetadata:
    """The user's pod labels and annotations (reserved keys left out)."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def record(self) -> str | None:
        """The :data:`APPLIED` value for these keys (None: nothing applied, no record)."""
        if not self.labels and not self.annotations:
            return None
        return json.dumps({"annotations": sorted(self.annotations), "labels": sorted(self.labels)},
                          separators=(",", ":"))  # fmt: skip


def reserved(key: str) -> bool:
    """Keys the operator, the StatefulSet controller or the selectors own: never the user's to set or remove."""
    return key.startswith(OPERATOR_LABEL_PREFIX) or key in RESERVED_POD_LABELS


def wanted(spec: PostgresClusterSpec) -> PodMetadata:
    """The pod metadata ``spec`` asks for."""
    template = spec.pod_template
    if template is None:
        return PodMetadata()
    return PodMetadata(
        labels={k: v for k, v in template.labels.items() if not reserved(k)},
        annotations={k: v for k, v in template.annotations.items() if not reserved(k)},
    )


def applied(annotations: Mapping[str, str]) -> tuple[frozenset[str], frozenset[str]]:
    """The label and annotation keys :data:`APPLIED` records (none when absent or unreadable)."""
    try:
        record = json.loads(annotations.get(APPLIED) or "{}")
        labels, notes = record.get("labels") or [], record.get("annotations") or []
        return frozenset(str(k) for k in labels), frozenset(str(k) for k in notes)
    except (ValueError, AttributeError, TypeError):
        return frozenset(), frozenset()


def _changes(want: Mapping[str, str], have: Mapping[str, str], before: frozenset[str]) -> dict[str, str | None]:
    changes: dict[str, str | None] = {k: v for k, v in want.items() if have.get(k) != v}
    changes.update({k: None for k in before - want.keys() if k in have and not reserved(k)})
    return changes


def _unrecorded(template: Mapping[str, Any]) -> tuple[frozenset[str], frozenset[str]]:
    """The user keys of a pod template made before :data:`APPLIED` existed: the operator put them there (the spec)."""
    labels = frozenset(k for k in template.get("labels") or {} if not reserved(k))
    return labels, frozenset(k for k in template.get("annotations") or {} if not reserved(k))


def pod_patch(want: PodMetadata, pod: Mapping[str, Any], template: Mapping[str, Any] | None = None) -> Obj | None:
    """The merge patch that gives ``pod`` the wanted metadata and removes what kanri applied before and is no longer
    wanted (None: nothing to do). Keys kanri never applied are left alone, whoever set them. ``template``: the pod
    template metadata of the pod's StatefulSet; for a pod born before the record existed, its user keys are what kanri
    applied."""
    meta = pod.get("metadata") or {}
    labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
    had_labels, had_annotations = applied(annotations)
    if APPLIED not in annotations and template is not None and APPLIED not in (template.get("annotations") or {}):
        had_labels, had_annotations = _unrecorded(template)
    label_changes = _changes(want.labels, labels, had_labels)
    annotation_changes = _changes(want.annotations, annotations, had_annotations)
    record = want.record()
    if annotations.get(APPLIED) != record:  # canonical: the same keys always read the same
        annotation_changes[APPLIED] = record
    if not label_changes and not annotation_changes:
        return None
    patch: Obj = {}
    if label_changes:
        patch["labels"] = label_changes
    if annotation_changes:
        patch["annotations"] = annotation_changes
    return {"metadata": patch}


def _template_meta(sts: Mapping[str, Any]) -> Obj:
    return dict(((sts.get("spec") or {}).get("template") or {}).get("metadata") or {})


def _operators(values: Mapping[str, str] | None) -> dict[str, str]:
    return {k: v for k, v in (values or {}).items() if reserved(k) and k != APPLIED}


def _with_meta(desired: Obj, labels: dict[str, str], annotations: dict[str, str]) -> Obj:
    """``desired`` with this pod template metadata, its hash recorded anew."""
    template = {**desired["spec"]["template"], "metadata": {"labels": labels}}
    if annotations:
        template["metadata"]["annotations"] = annotations
    meta = dict(desired["metadata"])
    meta["annotations"] = {k: v for k, v in (meta.get("annotations") or {}).items() if k != HASH_ANNOTATION}
    return with_hash({**desired, "metadata": meta, "spec": {**desired["spec"], "template": template}})


def kept_template(desired: Obj, current: Obj | None, want: PodMetadata) -> Obj:
    """The StatefulSet to apply: ``desired`` (:func:`kanri.postgres.children.statefulset.statefulset`) with the pod
    template's user metadata as ``current`` has it, when nothing else in the template changes — a metadata change
    alone must not roll the pod (:func:`pod_patch` applies it in place). When the template changes anyway, or for a
    new StatefulSet, the template carries ``want`` and its :data:`APPLIED` record."""
    ours = _template_meta(desired)
    labels, annotations = _operators(ours.get("labels")), _operators(ours.get("annotations"))
    if current is not None:
        theirs = _template_meta(current)
        old_labels = {k: v for k, v in (theirs.get("labels") or {}).items() if not reserved(k)}
        old_notes = {k: v for k, v in (theirs.get("annotations") or {}).items() if not reserved(k) or k == APPLIED}
        kept = _with_meta(desired, {**old_labels, **labels}, {**old_notes, **annotations})
        if is_subset(kept["spec"]["template"], (current.get("spec") or {}).get("template")):
            return kept
    record = want.record()
    notes = {**want.annotations, **annotations, **({APPLIED: record} if record else {})}
    return _with_meta(desired, {**want.labels, **labels}, notes)


class Pass(ChildStep, Protocol):
    """What applying pod metadata needs of the reconcile pass: the spec, and a write that may be refused."""

    async def write(self, kind: Kind, name: str, request: Awaitable[Any]) -> bool: ...


async def apply(step: Pass, pods: Mapping[str, Obj]) -> None:
    """Each running pod of the cluster gets the podTemplate's labels and annotations in place (a patch, no restart)."""
    want = wanted(step.spec)
    for instance, pod in pods.items():
        if pod["metadata"].get("deletionTimestamp"):
            continue
        sts = step.cache.get(STATEFUL_SET, instance, step.namespace)
        if (patch := pod_patch(want, pod, _template_meta(sts) if sts is not None else None)) is not None:
            name = pod["metadata"]["name"]
            await step.write(POD, name, step.client.patch(POD, name, patch, step.namespace))
