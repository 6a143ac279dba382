"""Volumes and compute resources of a PostgresCluster."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from kanri.postgres.api.v1alpha1._base import ApiModel
from kanri.runtime import Quantity, cel

__all__ = ["DEFAULT_REQUESTS", "DNS_SUBDOMAIN", "Resources", "Volume", "container_resources"]

# A DNS-1123 subdomain: the names of StorageClasses, Secrets and PriorityClasses.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

# Quantities are int-or-string on the wire (dynamic in CEL); string() makes `10Gi` and `10` both parse. The rules
# skip what is not a quantity, so a typo gets only the schema's pattern error instead of a CEL evaluation error too.
_SIZE = "quantity(string(self))"
_IS_QUANTITY = "isQuantity(string(self)) && isQuantity(string(oldSelf))"


class _MaxLength:
    """Adds ``maxLength`` to a field's schema. ``Quantity`` writes its own int-or-string schema and drops pydantic's
    ``Field(max_length=...)``; without a bound, the API server's cost estimate for CEL rules that parse quantities
    in a map exceeds its budget and the CRD is refused."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = dict(handler(core_schema))
        schema["maxLength"] = self.length
        return schema


class Volume(
    ApiModel,
    validations=[
        # Together with the field rule below this makes the class fixed for the volume's life: existing claims keep the
        # class they were created with, so adding or removing it later would silently mix classes.
        cel(
            "has(self.storageClassName) == has(oldSelf.storageClassName)",
            "storageClassName cannot be added or removed after creation: existing volumes keep their class",
            reason="FieldValueForbidden",
        ),
    ],
):
    """A persistent volume the operator claims for each instance (or for a backup repository)."""

    size: Annotated[
        Quantity,
        cel(
            f"!isQuantity(string(self)) || {_SIZE}.compareTo(quantity('1Mi')) >= 0",
            "size must be at least 1Mi (did you mean 1Gi?)",
        ),
        cel(
            f"!({_IS_QUANTITY}) || {_SIZE}.compareTo(quantity(string(oldSelf))) >= 0",
            message_expression="'size may not shrink (from ' + string(oldSelf) + ' to ' + string(self) + '): "
            "a volume can only grow; to move to a smaller one, restore a backup into a new cluster'",
            reason="FieldValueForbidden",
        ),
    ]
    """Capacity of the volume, a quantity such as 10Gi or 500Gi. Required.
    Growing it expands the existing claims online (the StorageClass must allow volume expansion).
    Shrinking is refused by the API server."""

    storage_class_name: (
        Annotated[
            str,
            Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN),
            cel(
                "self == oldSelf",
                message_expression="'storageClassName is immutable (was ' + oldSelf + '): existing volumes keep "
                "their class; restore a backup into a new cluster to change it'",
                reason="FieldValueForbidden",
            ),
        ]
        | None
    ) = None
    """StorageClass of the claims. Default: the cluster's default StorageClass.
    Fixed at creation: changing, adding or removing it is refused by the API server."""


_RESOURCE_NAMES = "k in ['cpu', 'memory', 'ephemeral-storage'] || k.startsWith('hugepages-')"
_KNOWN_RESOURCES = cel(
    f"self.all(k, {_RESOURCE_NAMES})",
    message_expression=f"'unsupported resource name(s): %s'.format([self.filter(k, !({_RESOURCE_NAMES})).sort()])",
)
# Both sides are quantities (a malformed one gets the schema's pattern error only) and the request is the larger.
_OVER_LIMIT = (
    "isQuantity(string(self.requests[k])) && isQuantity(string(self.limits[k])) && "
    "quantity(string(self.requests[k])).compareTo(quantity(string(self.limits[k]))) > 0"
)
# What the API server refuses in a container's resources: a negative quantity (caught here, before a pod is made).
_NEGATIVE = "isQuantity(string(self[k])) && quantity(string(self[k])).isLessThan(quantity('0'))"
_NOT_NEGATIVE = cel(
    f"!self.exists(k, {_NEGATIVE})",
    message_expression=f"'resource quantities may not be negative: %s'.format([self.filter(k, {_NEGATIVE}).sort()])",
)
ResourceList = Annotated[
    dict[str, Annotated[Quantity, _MaxLength(64)]], Field(max_length=8), _KNOWN_RESOURCES, _NOT_NEGATIVE
]


class Resources(
    ApiModel,
    validations=[
        cel(
            f"!has(self.requests) || !has(self.limits) || self.limits.all(k, !(k in self.requests && {_OVER_LIMIT}))",
            message_expression="'requests may not exceed limits: %s'.format([self.limits.filter(k, k in self.requests "
            f"&& {_OVER_LIMIT}).sort()])",
        ),
    ],
):
    """Compute resources of each PostgreSQL container (requests and limits, as for any container)."""

    requests: ResourceList = Field(default_factory=dict)
    """Resources reserved for each instance, e.g. cpu: 500m, memory: 1Gi. Changing them restarts the instances one
    at a time, replicas first and the primary last (after a switchover)."""

    limits: ResourceList = Field(default_factory=dict)
    """Upper bounds for each instance, e.g. memory: 1Gi; each must be at least the matching request. Changing them
    restarts the instances one at a time, like requests."""


DEFAULT_REQUESTS: dict[str, str] = {"cpu": "100m", "memory": "256Mi"}
"""What an instance requests when ``spec.resources`` names neither a request nor a limit of that resource (issue 33):
a request makes the pod Burstable, never BestEffort, so the kernel's CPU weights (``cpu.shares`` 102 against a
BestEffort container's 2) keep its PostgreSQL and instance manager running when other pods saturate the CPUs, and
the scheduler no longer places it on a node whose CPU is all promised. Small enough for several instances per core."""


def container_resources(resources: Resources | None) -> dict[str, dict[str, str]]:
    """The container's ``resources``: the user's requests and limits, and :data:`DEFAULT_REQUESTS` for each resource
    the user names neither a request nor a limit of (a limit alone is the request too, as Kubernetes defaults it)."""
    requests = dict(resources.requests) if resources else {}
    limits = dict(resources.limits) if resources else {}
    for name, quantity in DEFAULT_REQUESTS.items():
        if name not in requests and name not in limits:
            requests[name] = quantity
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}
