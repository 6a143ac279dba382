"""Growing a StatefulSet's volumes: its claim template cannot change once made (the API server refuses the whole
StatefulSet update), so a bigger size is carried out on the claims themselves — each bound claim whose request is
below it gets the new request (the StorageClass's expander grows the volume, the claim's capacity follows) — while
the template keeps the size it was made with (a new pod's claim then grows the same way once bound).

:func:`claim_template_size` gives the builder the size to keep; :func:`grow_claims` is the step's action; the rest
decides (pure).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kanri.kit._pass import PassContext
from kanri.kit._problems import Problem
from kanri.runtime import ApiError, parse_quantity
from kanri.runtime.kinds import PVC

__all__ = ["EXPANSION_REFUSED", "claim_template_size", "claims_resizing", "claims_to_grow", "grow_claims"]

Obj = dict[str, Any]
EXPANSION_REFUSED = "VolumeExpansionRefused"


def _request(claim: Obj) -> str | None:
    return (((claim.get("spec") or {}).get("resources") or {}).get("requests") or {}).get("storage")


def _capacity(claim: Obj) -> str | None:
    return ((claim.get("status") or {}).get("capacity") or {}).get("storage")


def claim_template_size(statefulset: Obj | None) -> str | None:
    """The size the StatefulSet's claim template was made with (None: no StatefulSet yet)."""
    templates = ((statefulset or {}).get("spec") or {}).get("volumeClaimTemplates") or []
    return _request(templates[0]) if templates else None


def claims_to_grow(claims: Iterable[Obj], size: str) -> list[str]:
    """Bound claims whose request is below ``size`` (an unbound claim's spec cannot change: it grows once bound)."""
    want = parse_quantity(size)
    found = []
    for claim in claims:
        request = _request(claim)
        bound = (claim.get("status") or {}).get("phase") == "Bound"
        if bound and request is not None and parse_quantity(request) < want:
            found.append(claim["metadata"]["name"])
    return sorted(found)


def claims_resizing(claims: Iterable[Obj]) -> list[str]:
    """Bound claims whose capacity is still below their request (the volume is being grown)."""
    found = []
    for claim in claims:
        request, capacity = _request(claim), _capacity(claim)
        if request is not None and capacity is not None and parse_quantity(capacity) < parse_quantity(request):
            found.append(claim["metadata"]["name"])
    return sorted(found)


async def grow_claims(ctx: PassContext, size: str, docs: str) -> list[str]:
    """Raise every bound claim of ``ctx``'s object (its label set's selector) below ``size`` to it; a claim the API
    server refuses to grow adds ``VolumeExpansionRefused`` naming it, the reason and ``docs`` (where the user reads
    what to do). Returns the claims still resizing (capacity below request), for status."""
    claims = ctx.cache.list(PVC, ctx.namespace, ctx.labels.selector(ctx.name))
    for name in claims_to_grow(claims, size):
        patch = {"spec": {"resources": {"requests": {"storage": size}}}}
        try:
            await ctx.client.patch(PVC, name, patch, ctx.namespace)
        except ApiError as exc:
            message = f"claim {name} cannot grow to {size}: {exc.message} (its StorageClass must allow volume " \
                f"expansion; see {docs})"  # fmt: skip
            ctx.problems.add(Problem(EXPANSION_REFUSED, message))
            continue
        await ctx.events.normal(ctx.obj, "VolumeGrowing", f"claim {name}: request raised to {size}")
    return claims_resizing(claims)
