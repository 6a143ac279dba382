"""Deciding whether a child needs a write, with the PostgreSQL operator's hash annotation (``kanri.dev/applied-hash``).

The rule itself is the kit's (:mod:`kanri.kit`: ``needs_apply``, ``is_subset``, ``spec_hash``, ``with_hash``): a child
is (re)applied when the hash recorded on it differs from the one of what we would apply, or when what we would apply
is not a subset of what is there (quantities compared by value). This module only binds the annotation, so the
children the operator made before keep their recorded hashes.
"""

from __future__ import annotations

from typing import Any

from kanri import kit
from kanri.kit import is_subset, spec_hash

__all__ = ["HASH_ANNOTATION", "is_subset", "needs_apply", "spec_hash", "with_hash"]

Obj = dict[str, Any]

HASH_ANNOTATION = "kanri.dev/applied-hash"


def with_hash(desired: Obj) -> Obj:
    """``desired`` with its own hash recorded in :data:`HASH_ANNOTATION` (computed before it is added)."""
    return kit.with_hash(desired, HASH_ANNOTATION)


def needs_apply(desired: Obj, current: Obj | None) -> bool:
    """Whether ``desired`` (already carrying its hash, see :func:`with_hash`) must be applied over ``current``."""
    return kit.needs_apply(desired, current, HASH_ANNOTATION)
