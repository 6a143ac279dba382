"""Pydantic building blocks for Kubernetes API types: ``KubeModel``, quantities, conditions and schema markers.

Markers (``cel``, ``list_map``, ``list_set``) go inside ``Annotated[...]`` on a field; ``cel`` rules can also be
given to a whole model with the class keyword ``validations=``. They only add ``x-kubernetes-*`` keys to the JSON
schema; ``kanri.runtime._crd`` turns that schema into a structural CRD schema.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, localcontext
from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetJsonSchemaHandler,
    PlainSerializer,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

from kanri.runtime._time import parse_time

__all__ = [
    "Condition",
    "Conditions",
    "IntOrString",
    "KubeModel",
    "ListType",
    "Quantity",
    "Rule",
    "Time",
    "cel",
    "list_map",
    "list_set",
    "parse_quantity",
]

# The reasons a CEL rule may report (apiextensions v1 ValidationRule.reason).
_RULE_REASONS = frozenset({"FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"})


@dataclass(frozen=True)
class Rule:
    """One CEL validation rule (an entry of ``x-kubernetes-validations``). Build it with :func:`cel`."""

    rule: str
    message: str | None = None
    message_expression: str | None = None
    reason: str | None = None
    field_path: str | None = None
    optional_old_self: bool | None = None

    def __post_init__(self) -> None:
        # The API server refuses these too, but only when the CRD is installed; fail at import time instead.
        if not self.rule.strip():
            raise ValueError("a CEL rule must not be empty")
        if self.message is not None and (not self.message.strip() or "\n" in self.message):
            raise ValueError(f"CEL message must be non-empty and on one line: {self.message!r}")
        if self.reason is not None and self.reason not in _RULE_REASONS:
            raise ValueError(f"CEL reason must be one of {sorted(_RULE_REASONS)}, not {self.reason!r}")

    def to_schema(self) -> dict[str, Any]:
        """The ``x-kubernetes-validations`` entry."""
        entry: dict[str, Any] = {"rule": self.rule}
        optional = {
            "message": self.message,
            "messageExpression": self.message_expression,
            "reason": self.reason,
            "fieldPath": self.field_path,
            "optionalOldSelf": self.optional_old_self,
        }
        entry.update({key: value for key, value in optional.items() if value is not None})
        return entry

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        # Never mutate what the handler returns: it may be a shared dict (a ``$ref`` or a fixed schema).
        schema = dict(handler(core_schema))
        schema["x-kubernetes-validations"] = [*schema.get("x-kubernetes-validations", []), self.to_schema()]
        return schema


def cel(
    rule: str,
    message: str | None = None,
    *,
    message_expression: str | None = None,
    reason: str | None = None,
    field_path: str | None = None,
    optional_old_self: bool | None = None,
) -> Rule:
    """A CEL validation rule, checked by the API server on every write.

    Use it on a field, ``size: Annotated[Quantity, cel("self == oldSelf", "size is immutable")]``, or on a model,
    ``class Spec(KubeModel, validations=[cel("self.min <= self.max", "min must not exceed max")])``. ``self`` is the
    value at that level; a rule mentioning ``oldSelf`` is a transition rule and only runs on updates where the old
    value exists (unless ``optional_old_self=True``). ``reason`` is one of ``FieldValueInvalid`` (default),
    ``FieldValueForbidden``, ``FieldValueRequired``, ``FieldValueDuplicate``.
    """
    return Rule(rule, message, message_expression, reason, field_path, optional_old_self)


@dataclass(frozen=True)
class ListType:
    """How the API server merges a list (``x-kubernetes-list-type``); see :func:`list_map`, :func:`list_set`."""

    list_type: Literal["atomic", "set", "map"]
    map_keys: tuple[str, ...] = ()

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = dict(handler(core_schema))
        schema["x-kubernetes-list-type"] = self.list_type
        if self.map_keys:
            schema["x-kubernetes-list-map-keys"] = list(self.map_keys)
        return schema


def list_map(*keys: str) -> ListType:
    """Mark a list of objects as a map keyed by ``keys`` (each item unique by them; server-side apply merges by key).

    Every key must be a required (or defaulted) scalar field of the item model.
    """
    if not keys:
        raise ValueError("list_map needs at least one key")
    return ListType("map", tuple(keys))


def list_set() -> ListType:
    """Mark a list of scalars as a set (unique items, merged by value). ``set[str]`` fields get this automatically."""
    return ListType("set")


class KubeModel(BaseModel):
    """Base for Kubernetes API types.

    Python names are snake_case and the wire names camelCase (``max_connections`` <-> ``maxConnections``); both are
    accepted on input and ``model_dump()`` writes camelCase. Attribute docstrings become field descriptions, hence
    CRD descriptions and ``kubectl explain`` text.

    Unknown fields are refused (``extra="forbid"``): the API server prunes objects to the CRD schema generated from
    these very models, so anything unknown comes from code (a typo) and should fail loudly rather than vanish.
    Free-form parts are typed ``dict[str, Any]``.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
        use_attribute_docstrings=True,
        extra="forbid",
    )

    # CEL rules for this model, its own plus those inherited (set by __init_subclass__ from `validations=`).
    __kanri_validations__: ClassVar[tuple[Rule, ...]] = ()

    def __init_subclass__(cls, *, validations: Sequence[Rule] = (), **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__kanri_validations__ = (*cls.__kanri_validations__, *validations)

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        schema = super().__get_pydantic_json_schema__(core_schema, handler)
        if cls.__kanri_validations__:
            # The model's own definition (behind its $ref) carries the rules, so every use of the model gets them.
            target = handler.resolve_ref_schema(schema)
            target["x-kubernetes-validations"] = [rule.to_schema() for rule in cls.__kanri_validations__]
        return schema


# --- quantities -------------------------------------------------------------------------------------------------

# The serialised form of resource.Quantity: a signed decimal, then a binary suffix, a decimal suffix or an exponent.
QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(([KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(?:([KMGTPE]i|[numkMGTPE])|[eE]([+-]?[0-9]+))?")
_BINARY = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}


def parse_quantity(value: str | int) -> Decimal:
    """The exact value of a Kubernetes quantity: ``parse_quantity("1Gi") == 1073741824``, ``"500m"`` -> ``0.5``.

    Raises ``ValueError`` for anything the API server would not accept as a quantity.
    """
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise ValueError(f"not a quantity: {value!r}")
    number, suffix, exponent = match.groups()
    # Enough precision that no realistic quantity (up to exabytes with many decimals) is rounded.
    with localcontext() as context:
        context.prec = 64
        if suffix in _BINARY:
            parsed = Decimal(number) * (1 << _BINARY[suffix])
        else:
            parsed = Decimal(number).scaleb(_DECIMAL[suffix] if suffix else int(exponent or 0))
    return parsed


def _quantity_text(value: object) -> object:
    # Manifests may carry plain numbers (`size: 10`); keep one textual form in Python.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return str(value)
    return value


def _check_quantity(value: str) -> str:
    parse_quantity(value)
    return value


class _IntOrStringSchema:
    """JSON schema of an int-or-string value, optionally with a pattern for the string form."""

    def __init__(self, pattern: str | None = None) -> None:
        self.pattern = pattern

    def __get_pydantic_json_schema__(self, core_schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        # A fresh dict per call, so markers added later (cel) never leak between fields.
        schema: dict[str, Any] = {
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "x-kubernetes-int-or-string": True,
        }
        if self.pattern:
            schema["pattern"] = self.pattern
        return schema


Quantity = Annotated[
    str,
    BeforeValidator(_quantity_text),
    AfterValidator(_check_quantity),
    _IntOrStringSchema(QUANTITY_PATTERN),
]
"""A resource quantity (``"10Gi"``, ``"500m"``, ``2``): int-or-string on the wire, ``str`` in Python.

Compare with :func:`parse_quantity`; in CEL use ``quantity(string(self))`` (``string()`` also accepts a number)."""

IntOrString = Annotated[int | str, _IntOrStringSchema()]
"""An int-or-string value (``x-kubernetes-int-or-string``), e.g. a port number or name, or ``1`` vs ``"25%"``."""


# --- times ------------------------------------------------------------------------------------------------------


def _aware_time(value: object) -> datetime:
    # Only what the API writes: an RFC 3339 string with a zone, or an aware datetime from code. pydantic alone also
    # takes naive times, bare dates and Unix numbers, and a naive datetime breaks the first comparison with an
    # aware one (TypeError) far from where it came in.
    if isinstance(value, str):
        return parse_time(value)
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("times must be timezone-aware (use datetime.now(UTC) or the injected clock)")
        return value.astimezone(UTC)
    raise ValueError(f"not an RFC 3339 time: {value!r}")


def _time_text(moment: datetime) -> str:
    # metav1.Time's form (whole seconds, "Z"); a MicroTime's sub-second part is kept when there is one.
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


Time = Annotated[
    datetime,
    BeforeValidator(_aware_time),
    PlainSerializer(_time_text, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}),
]
"""A point in time (metav1.Time): RFC 3339 on the wire, an aware ``datetime`` in UTC in Python.

Validation accepts only RFC 3339 with a zone (``2026-05-01T12:00:00Z``, ``...+02:00``) or an aware datetime, so a
model never holds a naive time; JSON output is UTC with a ``Z``. Prefer it to a bare ``datetime`` field."""


# --- conditions -------------------------------------------------------------------------------------------------


class Condition(KubeModel):
    """One aspect of the current state of this object (metav1.Condition)."""

    type: Annotated[
        str,
        Field(
            max_length=316,
            pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$",
        ),
    ]
    """Type of condition in CamelCase, e.g. Ready."""
    status: Literal["True", "False", "Unknown"]
    """Status of the condition: True, False or Unknown."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The .metadata.generation the condition was set from; older than the object's means the condition is stale."""
    last_transition_time: Time
    """When the condition last changed from one status to another."""
    reason: Annotated[str, Field(min_length=1, max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")]
    """A programmatic identifier (CamelCase) for the condition's last transition."""
    message: Annotated[str, Field(max_length=32768)]
    """A human-readable message with details about the transition; may be empty."""


Conditions = Annotated[list[Condition], list_map("type")]
"""The conventional ``status.conditions`` list: one entry per ``type`` (``x-kubernetes-list-type: map``)."""
