"""Finalizer and ``deletionPolicy`` in the shape of kube-rs' ``finalizer()``: the operator writes two branches only.

:func:`finalize` matches the two facts (has our finalizer? being deleted?) and calls ``apply(obj)`` for a live
object — after adding the finalizer first, so whatever the pass creates outside the ownership tree is cleaned up
later — or ``cleanup(obj)`` for one being deleted, then removes the finalizer. Both branches must be idempotent.
``cleanup`` returns None when it is done, or a :class:`~kanri.runtime.Result` to be called again later (the
finalizer stays meanwhile). Removal is guarded (``kanri.runtime.remove_finalizer``): another controller's finalizer
is never dropped.

Children with an owner reference go with the object through garbage collection whatever the policy. Data kept
*without* an owner reference (volumes, generated credentials) is what ``deletionPolicy`` decides about
(:func:`carry_out`): ``Retain`` (the default: losing data must be asked for) keeps it — and drops any owner
reference to the deleted object someone added by hand, which would let the garbage collector take it after all —
so a new object of the same name adopts it; ``Delete`` deletes it. The data is found by the operator's
:class:`~kanri.kit.LabelSet` selector, which names the operator's ``app.kubernetes.io/name``: another operator's
objects of the same owner name are never touched.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Literal

from kanri.kit._labels import LabelSet
from kanri.runtime import (
    ApiError,
    Cache,
    Client,
    EventRecorder,
    Kind,
    Result,
    add_finalizer,
    finalizer_step,
    remove_finalizer,
)

__all__ = ["DeletionPolicy", "carry_out", "data_of", "deletion_policy", "finalize"]

Obj = dict[str, Any]
DeletionPolicy = Literal["Retain", "Delete"]
Branch = Callable[[Obj], Awaitable[Result | None]]


async def finalize(client: Client, kind: Kind, obj: Obj, finalizer: str, *, apply: Branch, cleanup: Branch
                   ) -> Result | None:  # fmt: skip
    """Run ``apply`` or ``cleanup`` for ``obj`` (read from the cache) as its finalizer state says (see above)."""
    match finalizer_step(obj, finalizer):
        case "add":
            return await apply(await add_finalizer(client, kind, obj, finalizer))
        case "apply":
            return await apply(obj)
        case "cleanup":
            later = await cleanup(obj)
            if later is not None:
                return later
            await _remove(client, kind, obj, finalizer)
            return None
        case _:  # "done": being deleted, our cleanup already ran; another finalizer holds the object
            return None


async def _remove(client: Client, kind: Kind, obj: Obj, finalizer: str) -> None:
    """Drop our finalizer once cleanup is done. A cleanup may itself have written the object (its status, a record of
    what it deleted): then ``obj`` is stale and the guarded patch conflicts, so the latest object is read and the
    finalizer removed from it — the cleanup is not run again for a conflict it caused."""
    try:
        try:
            await remove_finalizer(client, kind, obj, finalizer)
        except ApiError as exc:
            if not exc.conflict:
                raise
            meta = obj["metadata"]
            await remove_finalizer(client, kind, await client.get(kind, meta["name"], meta.get("namespace")), finalizer)
    except ApiError as exc:
        if not exc.not_found:  # gone already: an earlier pass removed the finalizer
            raise


def deletion_policy(obj: Obj, *, field: str = "deletionPolicy") -> DeletionPolicy:
    """``spec.<field>`` as it is now; anything but ``Delete`` retains (data is only ever deleted when asked)."""
    return "Delete" if (obj.get("spec") or {}).get(field) == "Delete" else "Retain"


def data_of(cache: Cache, kinds: Sequence[Kind], labels: LabelSet, owner: Obj) -> list[tuple[Kind, Obj]]:
    """The owner's data in the cache: objects of ``kinds`` carrying the operator's selector for the owner's name."""
    meta = owner["metadata"]
    selector = labels.selector(meta["name"])
    return [(kind, o) for kind in kinds for o in cache.list(kind, meta.get("namespace"), selector)]


async def carry_out(
    policy: DeletionPolicy, client: Client, events: EventRecorder, owner: Obj, data: Sequence[tuple[Kind, Obj]]
) -> None:
    """Keep or delete ``data`` (see the module docstring) and say which in a Normal Event. Idempotent."""
    uid = owner["metadata"]["uid"]
    described = ", ".join(f"{kind.kind} {o['metadata']['name']}" for kind, o in data) or "none"
    if policy == "Delete":
        for kind, found in data:
            meta = found["metadata"]
            await client.delete(kind, meta["name"], meta.get("namespace"), uid=meta.get("uid"))
        await events.normal(owner, "DataDeleted", f"deletionPolicy Delete: deleted {described}")
        return
    for kind, found in data:
        await _release(client, kind, found, uid)
    await events.normal(owner, "DataRetained", f"deletionPolicy Retain: kept {described}; a new "
                        f"{owner['kind']} named {owner['metadata']['name']} adopts them")  # fmt: skip


async def _release(client: Client, kind: Kind, found: Obj, owner_uid: str) -> None:
    refs = found["metadata"].get("ownerReferences") or []
    kept = [ref for ref in refs if ref.get("uid") != owner_uid]
    if len(kept) == len(refs):
        return
    meta = found["metadata"]
    body = {"metadata": {"ownerReferences": kept or None, "resourceVersion": meta["resourceVersion"]}}
    await client.patch(kind, meta["name"], body, meta.get("namespace"))
