"""API field types every stateful operator's spec shares, with their CEL rules, so each kind refuses the same bad
input with the same message."""

from __future__ import annotations

from typing import Annotated

from kanri.runtime import Quantity, cel

__all__ = ["VolumeSize"]

_SIZE = "quantity(string(self))"
_BOTH_QUANTITIES = "isQuantity(string(self)) && isQuantity(string(oldSelf))"

VolumeSize = Annotated[
    Quantity,
    cel(f"!isQuantity(string(self)) || {_SIZE}.compareTo(quantity('1Mi')) >= 0", "size must be at least 1Mi"),
    cel(
        f"!({_BOTH_QUANTITIES}) || {_SIZE}.compareTo(quantity(string(oldSelf))) >= 0",
        message_expression="'storage.size may not shrink (from ' + string(oldSelf) + ' to ' + string(self) + "
        "'): a volume can only grow'",
        reason="FieldValueForbidden",
    ),
]
"""A volume's capacity (a quantity of at least 1Mi) that may grow and never shrink: the API server refuses a shrink
(a transition rule), since no volume can give space back without losing data."""
