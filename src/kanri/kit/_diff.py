"""Whether a child needs a write: the rule that makes a converged pass cost zero writes.

A child is (re)applied when the hash of what we would apply differs from the hash recorded on it (this catches
fields we *stopped* setting, which a subset check cannot see), or when what we would apply is not a subset of what
is there (someone else changed a field we own). The subset check tolerates what the API server adds (defaults,
ports, probes) and compares resource quantities by value (``1000m`` is stored as ``1``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kanri.runtime import parse_quantity

__all__ = ["is_subset", "needs_apply", "spec_hash", "with_hash"]

Obj = dict[str, Any]
_QUANTITY_PARENTS = frozenset({"requests", "limits", "capacity", "storage"})
_RESOURCE_NAMES = frozenset({"cpu", "memory", "ephemeral-storage"})


def spec_hash(desired: Obj) -> str:
    """A stable hash of a desired object (key order does not matter)."""
    text = json.dumps(desired, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def with_hash(desired: Obj, annotation: str) -> Obj:
    """``desired`` with its own hash (computed before it is added) in the annotation ``annotation``."""
    digest = spec_hash(desired)
    meta = desired.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), annotation: digest}
    return desired


def needs_apply(desired: Obj, current: Obj | None, annotation: str) -> bool:
    """Whether ``desired`` (carrying its hash, :func:`with_hash`) must be applied over ``current``."""
    if current is None:
        return True
    wanted = (desired.get("metadata", {}).get("annotations") or {}).get(annotation)
    recorded = (current.get("metadata", {}).get("annotations") or {}).get(annotation)
    return wanted != recorded or not is_subset(desired, current)


def is_subset(desired: Any, current: Any, parent: str = "") -> bool:
    """True when every field of ``desired`` is in ``current`` with the same value (lists element by element)."""
    if isinstance(desired, dict):
        if not isinstance(current, dict):
            return False
        return all(is_subset(value, current.get(key), key) for key, value in desired.items())
    if isinstance(desired, list):
        if not isinstance(current, list) or len(desired) != len(current):
            return False
        return all(is_subset(d, c, parent) for d, c in zip(desired, current, strict=True))
    if desired == current:
        return True
    if parent in _QUANTITY_PARENTS or parent in _RESOURCE_NAMES or parent.startswith("hugepages-"):
        return _same_quantity(desired, current)
    return False


def _same_quantity(a: Any, b: Any) -> bool:
    if not isinstance(a, str | int) or not isinstance(b, str | int):
        return False
    try:
        return parse_quantity(a) == parse_quantity(b)
    except ValueError:
        return False
