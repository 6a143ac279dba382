"""Kubernetes' core/v1 Affinity and TopologySpreadConstraint, as schema: what podTemplate passes to the pods.

These models give the CRD the structure (and the enum and range checks) the API server applies to a pod's
``spec.affinity`` and ``spec.topologySpreadConstraints``, so a broken one is refused when the PostgresCluster is
written, not later when the operator creates the pods. The operator still hands the user's dicts to the pods
unchanged (:data:`AffinityDict`, :data:`SpreadConstraintDict`): the models check, they do not rewrite.

Lists carry bounds: the API server estimates the cost of CEL rules from them, and nobody schedules a database pod
with hundreds of terms. Field descriptions are those of the Kubernetes API reference, shortened.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from kanri.postgres.api.v1alpha1._base import ApiModel
from kanri.runtime import cel

__all__ = [
    "Affinity",
    "AffinityDict",
    "LabelSelector",
    "NodeSelectorTerm",
    "PodAffinityTerm",
    "SpreadConstraintDict",
    "TopologySpreadConstraint",
]

_MAX_TERMS = 16
_MAX_EXPRESSIONS = 32
_MAX_VALUES = 64
# A label key is at most 253 + 1 + 63 characters (prefix/name); a value at most 63 (longer is refused by the pod API).
_KEY = Annotated[str, Field(min_length=1, max_length=317)]
_VALUE = Annotated[str, Field(max_length=63)]
_Values = Annotated[list[_VALUE], Field(max_length=_MAX_VALUES)]
_Weight = Annotated[int, Field(ge=1, le=100)]

# In/NotIn need values, Exists/DoesNotExist none; Gt/Lt exactly one integer (node selectors only).
_SET_VALUES = cel(
    "self.operator in ['In', 'NotIn'] ? has(self.values) && size(self.values) > 0 : "
    "self.operator in ['Exists', 'DoesNotExist'] ? !has(self.values) || size(self.values) == 0 : true",
    message_expression="self.operator in ['In', 'NotIn'] ? 'operator ' + self.operator + ' needs at least one value' "
    ": 'operator ' + self.operator + ' takes no values'",
    field_path=".values",
)
_ONE_INTEGER = cel(
    "!(self.operator in ['Gt', 'Lt']) || (has(self.values) && size(self.values) == 1 && "
    "self.values[0].matches('^[-+]?[0-9]{1,18}$'))",
    message_expression="'operator ' + self.operator + ' needs exactly one value, an integer'",
    field_path=".values",
)


class LabelSelectorRequirement(ApiModel, validations=[_SET_VALUES]):
    """A label key, an operator and values: as in a LabelSelector's matchExpressions."""

    key: _KEY
    """The label key the selector applies to. Required."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """In, NotIn, Exists or DoesNotExist. Required."""
    values: _Values | None = None
    """The values for In and NotIn (at least one); empty for Exists and DoesNotExist."""


class LabelSelector(ApiModel):
    """Selects objects by their labels: every matchLabels pair and every matchExpressions requirement must hold.
    An empty selector selects everything."""

    match_labels: Annotated[dict[str, _VALUE], Field(max_length=_MAX_EXPRESSIONS)] | None = None
    """Labels the objects must carry, key: value."""
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=_MAX_EXPRESSIONS)] | None = None
    """Requirements on the objects' labels."""


class NodeSelectorRequirement(ApiModel, validations=[_SET_VALUES, _ONE_INTEGER]):
    """A node label (or field) key, an operator and values."""

    key: _KEY
    """The node label key (or field name, in matchFields) the requirement applies to. Required."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """In, NotIn, Exists, DoesNotExist, Gt or Lt. Required."""
    values: _Values | None = None
    """At least one value for In and NotIn, none for Exists and DoesNotExist, exactly one integer for Gt and Lt."""


class NodeSelectorTerm(ApiModel):
    """Requirements a node must all meet (an empty term matches no node)."""

    match_expressions: Annotated[list[NodeSelectorRequirement], Field(max_length=_MAX_EXPRESSIONS)] | None = None
    """Requirements on the node's labels."""
    match_fields: Annotated[list[NodeSelectorRequirement], Field(max_length=_MAX_EXPRESSIONS)] | None = None
    """Requirements on the node's fields (metadata.name)."""


class NodeSelector(ApiModel):
    """Nodes that match any of the terms."""

    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=_MAX_TERMS)]
    """The terms, ORed. Required."""


class PreferredSchedulingTerm(ApiModel):
    """A node preference with a weight."""

    weight: _Weight
    """Weight of the preference, 1 to 100. Required."""
    preference: NodeSelectorTerm
    """The nodes preferred. Required."""


class NodeAffinity(ApiModel):
    """Which nodes the pods may run on (required) or prefer (preferred)."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes the pods must run on."""
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[PreferredSchedulingTerm], Field(max_length=_MAX_TERMS)] | None
    ) = None
    """Nodes the pods prefer, by weight."""


_LabelKeys = Annotated[list[_KEY], Field(max_length=_MAX_EXPRESSIONS)]


class PodAffinityTerm(ApiModel):
    """Pods (selected by labels, in some namespaces) that the pod must or must not share a topology domain with."""

    label_selector: LabelSelector | None = None
    """The pods this term is about."""
    namespace_selector: LabelSelector | None = None
    """Namespaces of those pods, by label (empty: every namespace)."""
    namespaces: Annotated[list[Annotated[str, Field(max_length=63)]], Field(max_length=_MAX_VALUES)] | None = None
    """Namespaces of those pods, by name. Default (with no namespaceSelector): the pod's own namespace."""
    topology_key: Annotated[str, Field(min_length=1, max_length=317)]
    """Node label whose value defines the domain, e.g. kubernetes.io/hostname or topology.kubernetes.io/zone.
    Required."""
    match_label_keys: _LabelKeys | None = None
    """Label keys whose values (taken from the incoming pod) are added to labelSelector as In requirements."""
    mismatch_label_keys: _LabelKeys | None = None
    """Label keys whose values (taken from the incoming pod) are added to labelSelector as NotIn requirements."""


class WeightedPodAffinityTerm(ApiModel):
    """A pod affinity term with a weight."""

    weight: _Weight
    """Weight of the term, 1 to 100. Required."""
    pod_affinity_term: PodAffinityTerm
    """The term. Required."""


class PodAffinity(ApiModel):
    """Pods the instances must (required) or should (preferred) run next to, or away from for podAntiAffinity."""

    required_during_scheduling_ignored_during_execution: (
        Annotated[list[PodAffinityTerm], Field(max_length=_MAX_TERMS)] | None
    ) = None
    """Terms that must all hold."""
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[WeightedPodAffinityTerm], Field(max_length=_MAX_TERMS)] | None
    ) = None
    """Terms the scheduler prefers, by weight."""


class Affinity(ApiModel):
    """A pod's spec.affinity: node affinity, pod affinity and pod anti-affinity."""

    node_affinity: NodeAffinity | None = None
    """Nodes the pods must or should run on."""
    pod_affinity: PodAffinity | None = None
    """Pods the instances must or should run next to."""
    pod_anti_affinity: PodAffinity | None = None
    """Pods the instances must or should run away from (e.g. each other)."""


class TopologySpreadConstraint(ApiModel):
    """How to spread the pods over a topology (nodes, zones), as in a pod's spec.topologySpreadConstraints."""

    max_skew: Annotated[int, Field(ge=1)]
    """How unevenly the pods may be spread: the largest allowed difference between two domains. Required, at
    least 1."""
    topology_key: Annotated[str, Field(min_length=1, max_length=317)]
    """Node label whose value defines the domain, e.g. topology.kubernetes.io/zone. Required."""
    when_unsatisfiable: Literal["DoNotSchedule", "ScheduleAnyway"]
    """DoNotSchedule (keep the pod pending) or ScheduleAnyway (schedule, preferring less skew). Required."""
    label_selector: LabelSelector | None = None
    """The pods counted in each domain."""
    min_domains: Annotated[int, Field(ge=1)] | None = None
    """With DoNotSchedule: the fewest eligible domains (at least 1)."""
    node_affinity_policy: Literal["Honor", "Ignore"] | None = None
    """Whether the pod's node affinity and selector limit the domains: Honor (default) or Ignore."""
    node_taints_policy: Literal["Honor", "Ignore"] | None = None
    """Whether node taints limit the domains: Honor or Ignore (default)."""
    match_label_keys: _LabelKeys | None = None
    """Label keys whose values (taken from the incoming pod) select the pods counted, with labelSelector."""


class _SchemaOf:
    """Gives a ``dict[str, Any]`` field the JSON schema of ``model`` (so the CRD checks its structure) and checks it
    in Python with the same model, leaving the dict itself unchanged for the operator to pass on."""

    def __init__(self, model: type[ApiModel]) -> None:
        self.model = model

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return handler(self.model.__pydantic_core_schema__)


def _checked(model: type[ApiModel]) -> AfterValidator:
    def check(value: dict[str, Any]) -> dict[str, Any]:
        model.model_validate(value)
        return value

    return AfterValidator(check)


AffinityDict = Annotated[dict[str, Any], _checked(Affinity), _SchemaOf(Affinity)]
"""A pod's spec.affinity as the user wrote it, checked against :class:`Affinity`."""

SpreadConstraintDict = Annotated[
    dict[str, Any], _checked(TopologySpreadConstraint), _SchemaOf(TopologySpreadConstraint)
]
"""One of a pod's spec.topologySpreadConstraints as the user wrote it, checked against
:class:`TopologySpreadConstraint`."""
