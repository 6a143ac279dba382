"""An operator's API rights as data: what its chart's RBAC grants and its tests check against the code."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kanri.runtime import Kind

__all__ = ["Permission", "grant", "needed"]


@dataclass(frozen=True)
class Permission:
    """Verbs an operator needs on a kind, or on one of its subresources (``status``, ``finalizers``)."""

    kind: Kind
    subresource: str
    verbs: frozenset[str]


def grant(kind: Kind, *verbs: str, subresource: str = "") -> Permission:
    """``verbs`` on ``kind`` (or its ``subresource``)."""
    return Permission(kind, subresource, frozenset(verbs))


def needed(watched: Iterable[Kind], writes: Iterable[Permission]) -> dict[tuple[Kind, str], frozenset[str]]:
    """Everything an operator needs outside leader election: list + watch on each kind its informers watch, plus its
    writes, merged per (kind, subresource)."""
    found: dict[tuple[Kind, str], frozenset[str]] = {(kind, ""): frozenset({"list", "watch"}) for kind in watched}
    for permission in writes:
        key = (permission.kind, permission.subresource)
        found[key] = found.get(key, frozenset()) | permission.verbs
    return found
