"""The nodes' volumes grown to ``spec.storage.size`` (:func:`kanri.kit.grow_claims`): each bound claim below it is
patched to the new request; a claim the API server refuses to grow (its StorageClass has no
``allowVolumeExpansion``, or the volume was not dynamically provisioned) is named in ``Degraded=True,
VolumeExpansionRefused`` with the API server's words. ``status.resizingVolumes`` lists the claims whose capacity has
not caught up yet."""

from __future__ import annotations

from kanri import kit
from kanri import runtime as kr
from kanri.kafka.cluster.context import ClusterContext


async def grow(ctx: ClusterContext) -> kr.Result | None:
    resizing = await kit.grow_claims(ctx, ctx.spec.storage.size, "docs/kafka.md#volumes")
    ctx.ledger.stage("resizingVolumes", resizing or None)
    return None
