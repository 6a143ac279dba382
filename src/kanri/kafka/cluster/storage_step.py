"""The nodes' volumes grown to ``spec.storage.size`` (:mod:`.storage` decides): each bound claim below it is patched
to the new request; a claim the API server refuses to grow (its StorageClass has no ``allowVolumeExpansion``, or
the volume was not dynamically provisioned) is named in ``Degraded=True, VolumeExpansionRefused`` with the API
server's words, once per pass, never retried into a loop of Events. ``status.resizingVolumes`` lists the claims
whose capacity has not caught up yet."""

from __future__ import annotations

from kanri import kit
from kanri import runtime as kr
from kanri.kafka.api import LABELS
from kanri.kafka.cluster import storage
from kanri.kafka.cluster.context import ClusterContext
from kanri.runtime import ApiError
from kanri.runtime.kinds import PVC

EXPANSION_REFUSED = "VolumeExpansionRefused"


async def grow(ctx: ClusterContext) -> kr.Result | None:
    claims = ctx.cache.list(PVC, ctx.namespace, LABELS.selector(ctx.name))
    size = ctx.spec.storage.size
    for name in storage.to_grow(claims, size):
        patch = {"spec": {"resources": {"requests": {"storage": size}}}}
        try:
            await ctx.client.patch(PVC, name, patch, ctx.namespace)
        except ApiError as exc:
            message = f"claim {name} cannot grow to {size}: {exc.message} (its StorageClass must allow volume " \
                "expansion; see docs/kafka.md#volumes)"  # fmt: skip
            ctx.problems.add(kit.Problem(EXPANSION_REFUSED, message))
            continue
        await ctx.events.normal(ctx.obj, "VolumeGrowing", f"claim {name}: request raised to {size}")
    ctx.ledger.stage("resizingVolumes", storage.resizing(claims) or None)
    return None
