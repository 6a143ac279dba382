"""The restricted part of the instances' pods users may shape: placement and metadata, nothing that runs."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from kanri.postgres.api.v1alpha1._base import ApiModel
from kanri.postgres.api.v1alpha1.scheduling import AffinityDict, SpreadConstraintDict
from kanri.postgres.api.v1alpha1.storage import DNS_SUBDOMAIN
from kanri.runtime import Rule, cel

__all__ = [
    "OPERATOR_LABEL_PREFIX",
    "RESERVED_POD_LABELS",
    "RESERVED_PRIORITY_CLASS_PREFIX",
    "SECURITY_ANNOTATIONS",
    "PodTemplate",
    "Toleration",
]

OPERATOR_LABEL_PREFIX = "kanri.dev/"
"""Labels and annotations under this prefix are the operator's (roles, cluster name); users may not set them."""


# Refuse (naming the keys) labels and annotations under the operator's prefix; module constants, one per map.
_OWN_KEYS = f"[self.filter(k, k.startsWith('{OPERATOR_LABEL_PREFIX}')).sort()]"
_NO_OPERATOR_LABELS = cel(
    f"self.all(k, !k.startsWith('{OPERATOR_LABEL_PREFIX}'))",
    message_expression=f"'labels under {OPERATOR_LABEL_PREFIX} belong to the operator: %s'.format({_OWN_KEYS})",
    reason="FieldValueForbidden",
)
# The selectors' app labels (docs/postgres-operator.md "Labels and selectors"): a pod template that set them could
# take a pod out of its own Services or into another app's.
_APP_LABELS = ("app.kubernetes.io/name", "app.kubernetes.io/instance")
_APP_KEYS = f"[self.filter(k, k in {list(_APP_LABELS)}).sort()]"
_NO_APP_LABELS = cel(
    f"!self.exists(k, k in {list(_APP_LABELS)})",
    message_expression=f"'labels %s belong to the operator (its selectors use them)'.format({_APP_KEYS})",
    reason="FieldValueForbidden",
)
# Set on every pod by the operator (managed-by) or the StatefulSet controller (its revision, the pod's name and
# index): a user value would be overwritten in the template, and patched onto the pods in place it would confuse them.
_CONTROLLER_LABELS = (
    "app.kubernetes.io/managed-by",
    "controller-revision-hash",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
)
_CONTROLLER_KEYS = f"[self.filter(k, k in {list(_CONTROLLER_LABELS)}).sort()]"
_NO_CONTROLLER_LABELS = cel(
    f"!self.exists(k, k in {list(_CONTROLLER_LABELS)})",
    message_expression=f"'labels %s belong to the operator or the StatefulSet controller'.format({_CONTROLLER_KEYS})",
    reason="FieldValueForbidden",
)
RESERVED_POD_LABELS: frozenset[str] = frozenset((*_APP_LABELS, *_CONTROLLER_LABELS))
"""Pod labels outside kanri.dev/ that are nonetheless not the user's: the selectors' app labels, managed-by, and the
StatefulSet controller's own."""
_NO_OPERATOR_ANNOTATIONS = cel(
    f"self.all(k, !k.startsWith('{OPERATOR_LABEL_PREFIX}'))",
    message_expression=f"'annotations under {OPERATOR_LABEL_PREFIX} belong to the operator: %s'.format({_OWN_KEYS})",
    reason="FieldValueForbidden",
)


SECURITY_ANNOTATIONS: tuple[str, ...] = (
    "security.alpha.kubernetes.io/",  # seccomp.…, container.seccomp.… (profiles), and the old sysctls keys
    "security.beta.kubernetes.io/",  # container.apparmor.… (AppArmor profiles, e.g. unconfined)
    "io.kubernetes.cri-o.",  # CRI-O's runtime knobs (devices, user namespaces, cgroup files) where it allows them
)
"""Annotation keys containing one of these shape the pod's security profile (the kubelet or the container runtime
reads them): the instance's profile is the operator's, so users may not set them."""

_SECURITY_KEY = " || ".join(f"k.contains('{part}')" for part in SECURITY_ANNOTATIONS)
_NO_SECURITY_ANNOTATIONS = cel(
    f"!self.exists(k, {_SECURITY_KEY})",
    message_expression="'annotations that change the security profile of the pod (AppArmor, seccomp, sysctls, runtime "
    f"options) belong to the operator: %s'.format([self.filter(k, {_SECURITY_KEY}).sort()])",
    reason="FieldValueForbidden",
)

RESERVED_PRIORITY_CLASS_PREFIX = "system-"
"""Kubernetes reserves PriorityClass names beginning with this for its own components (system-node-critical,
system-cluster-critical): a database pod under them preempts, and outlives eviction of, the node's own daemons."""
_NOT_SYSTEM_PRIORITY = cel(
    f"!self.startsWith('{RESERVED_PRIORITY_CLASS_PREFIX}')",
    message_expression=f'\'priorityClassName "%s" is reserved for the components of the cluster itself '
    f"(every {RESERVED_PRIORITY_CLASS_PREFIX} class): choose a PriorityClass of the platform'.format([self])",
    reason="FieldValueForbidden",
)

# Kubernetes' own checks (the CEL format library): keys are qualified names ([prefix/]name), label values at most 63
# characters of [-A-Za-z0-9_.] beginning and ending with an alphanumeric, or empty.
_QUALIFIED = "format.qualifiedName().validate(k).hasValue()"
_QUALIFIED_NAME = (
    "qualified names (an optional DNS subdomain prefix and /, then at most 63 letters, digits, -, _ and ., "
    "beginning and ending with a letter or digit)"
)


def _qualified_keys(what: str) -> Rule:
    return cel(
        f"!self.exists(k, {_QUALIFIED})",
        message_expression=f"'{what} keys must be {_QUALIFIED_NAME}: %s'.format([self.filter(k, {_QUALIFIED}).sort()])",
    )


_LABEL_VALUE = cel(
    "!format.labelValue().validate(self).hasValue()",
    "a label value is at most 63 letters, digits, -, _ and ., beginning and ending with a letter or digit, or empty",
)


class Toleration(ApiModel):
    """A toleration, as in a pod's spec.tolerations."""

    key: Annotated[str, Field(max_length=316)] | None = None
    """Taint key to tolerate; empty with operator Exists means every taint."""
    operator: Literal["Exists", "Equal"] | None = None
    """Exists or Equal (Kubernetes' default)."""
    value: Annotated[str, Field(max_length=63)] | None = None
    """Taint value to match with operator Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty means every effect."""
    toleration_seconds: int | None = None
    """With effect NoExecute: how long the pod stays bound after the taint appears."""


class PodTemplate(ApiModel):
    """The part of each instance's pod users may shape: metadata and scheduling, nothing else (containers, volumes,
    security context and probes are the operator's). Unknown fields here, as anywhere in spec, are refused by
    kubectl (strict field validation) and dropped with a warning by clients that do not ask for strict validation.
    Changing it rolls the instances one at a time, replicas first and the primary last (after a switchover);
    label and annotation changes are applied in place without a restart."""

    labels: Annotated[
        dict[str, Annotated[str, Field(max_length=63), _LABEL_VALUE]],
        Field(max_length=64),
        _qualified_keys("label"),
        _NO_OPERATOR_LABELS,
        _NO_APP_LABELS,
        _NO_CONTROLLER_LABELS,
    ] = Field(default_factory=dict)
    """Extra labels for the pods. Keys are qualified names (an optional DNS subdomain prefix and /, then at most 63
    letters, digits, -, _ and ., beginning and ending with a letter or digit); values are at most 63 of the same
    characters, or empty. Keys under kanri.dev/, the selectors' app.kubernetes.io/name and app.kubernetes.io/instance,
    app.kubernetes.io/managed-by and the StatefulSet controller's labels (controller-revision-hash,
    statefulset.kubernetes.io/pod-name, apps.kubernetes.io/pod-index) are refused. Applied to the running pods in
    place, without a restart; a key removed here is removed from the pods."""

    annotations: Annotated[
        dict[str, Annotated[str, Field(max_length=65536)]],
        Field(max_length=64),
        _qualified_keys("annotation"),
        _NO_OPERATOR_ANNOTATIONS,
        _NO_SECURITY_ANNOTATIONS,
    ] = Field(default_factory=dict)
    """Extra annotations for the pods. Keys are qualified names, as for labels; keys under kanri.dev/ are refused, and
    so are keys that change the pod's security profile (any key containing security.alpha.kubernetes.io/ or
    security.beta.kubernetes.io/ — AppArmor, seccomp, sysctls — or io.kubernetes.cri-o.). Applied to the running pods
    in place, without a restart; a key removed here is removed from the pods."""

    node_selector: Annotated[
        dict[str, Annotated[str, Field(max_length=63), _LABEL_VALUE]],
        Field(max_length=32),
        _qualified_keys("node label"),
    ] = Field(default_factory=dict)
    """Node labels the pods must run on, as in a pod's spec.nodeSelector (keys and values as for labels)."""

    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(default_factory=list)
    """Taints the pods tolerate, as in a pod's spec.tolerations."""

    affinity: AffinityDict | None = None
    """A pod's spec.affinity (nodeAffinity, podAffinity, podAntiAffinity), with the structure Kubernetes gives it.
    Default: the operator spreads instances over nodes (preferred pod anti-affinity)."""

    topology_spread_constraints: Annotated[list[SpreadConstraintDict], Field(max_length=8)] = Field(
        default_factory=list
    )
    """A pod's spec.topologySpreadConstraints (e.g. spread over zones), with the structure Kubernetes gives them."""

    priority_class_name: (
        Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN), _NOT_SYSTEM_PRIORITY] | None
    ) = None
    """PriorityClass of the pods. The system- classes (system-node-critical, system-cluster-critical) are refused:
    they are for the cluster's own components."""
