"""Growing the nodes' volumes (pure): a StatefulSet's claim template cannot change once made, so a bigger
``spec.storage.size`` is carried out on the claims themselves — each bound claim whose request is below it gets the
new request (the StorageClass's expander grows the volume, the claim's capacity follows) — while the template keeps
the size it was made with (new nodes' claims then grow the same way).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kanri.runtime import parse_quantity

Obj = dict[str, Any]


def _request(claim: Obj) -> str | None:
    return (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")


def _capacity(claim: Obj) -> str | None:
    return ((claim.get("status") or {}).get("capacity") or {}).get("storage")


def template_size(statefulset: Obj | None) -> str | None:
    """The size the StatefulSet's claim template was made with (None: no StatefulSet yet)."""
    templates = ((statefulset or {}).get("spec") or {}).get("volumeClaimTemplates") or []
    return _request(templates[0]) if templates else None


def to_grow(claims: Iterable[Obj], size: str) -> list[str]:
    """Bound claims whose request is below ``size`` (an unbound claim's spec cannot change: it grows once bound)."""
    want = parse_quantity(size)
    found = []
    for claim in claims:
        request = _request(claim)
        bound = (claim.get("status") or {}).get("phase") == "Bound"
        if bound and request is not None and parse_quantity(request) < want:
            found.append(claim["metadata"]["name"])
    return sorted(found)


def resizing(claims: Iterable[Obj]) -> list[str]:
    """Bound claims whose capacity is still below their request (the volume is being grown)."""
    found = []
    for claim in claims:
        request, capacity = _request(claim), _capacity(claim)
        if request is not None and capacity is not None and parse_quantity(capacity) < parse_quantity(request):
            found.append(claim["metadata"]["name"])
    return sorted(found)
