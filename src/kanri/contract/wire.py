"""What every wire type between an operator and its in-pod agent shares: camelCase JSON keys over snake_case Python
names, immutable values, and defensive reading.

A model is built on one side with its own, typed values (only the types are checked, so what is sent is exactly what
was built) and read on the other from the network with ``model_validate(body, context=UNTRUSTED)``: then each
:func:`reading` rule applies, and a value of the wrong type or out of range reads as absent instead of refusing the
whole body. Keys a newer peer adds are ignored.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, ValidatorFunctionWrapHandler, WrapValidator
from pydantic.alias_generators import to_camel

from kanri.contract.problems import one_line

__all__ = ["UNTRUSTED", "Count", "Flag", "Name", "Text", "Wire", "count", "reading", "text", "untrusted"]

UNTRUSTED: dict[str, Any] = {"untrusted": True}
"""The validation context of a body read from the network."""


def untrusted(info: ValidationInfo) -> bool:
    """Validation runs on a body from the network (:data:`UNTRUSTED`), not on one side's own build."""
    return isinstance(info.context, dict) and bool(info.context.get("untrusted"))


def text(value: Any) -> str | None:
    """A short one-line string, or None (blank or not a string)."""
    if not isinstance(value, str) or not value.strip():
        return None
    return one_line(value)


def count(value: Any) -> int | None:
    """A non-negative integer (not a bool), or None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def reading(rule: Any) -> WrapValidator:
    """``rule`` applies to a value read from the network; a side's own values are only type-checked."""

    def validate(value: Any, handler: ValidatorFunctionWrapHandler, info: ValidationInfo) -> Any:
        return handler(rule(value) if untrusted(info) else value)

    return WrapValidator(validate)


Text = Annotated[str | None, reading(text)]
"""Free text shown in status and Events: one line of at most ``MAX_MESSAGE`` characters when read."""
Name = Annotated[str | None, reading(lambda v: v if isinstance(v, str) and v else None)]
"""A non-empty string (an LSN, a WAL file name, an error)."""
Count = Annotated[int | None, reading(count)]
"""A non-negative integer (JSON has no other kind worth trusting)."""
Flag = Annotated[bool, reading(lambda v: v is True)]
"""True only when the body says ``true``."""


class Wire(BaseModel):
    """camelCase on the wire, snake_case in Python; immutable; keys a newer peer adds are ignored."""

    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, frozen=True)

    def as_json(self) -> dict[str, Any]:
        """The JSON body: camelCase keys, every field."""
        return self.model_dump(mode="json", by_alias=True)
