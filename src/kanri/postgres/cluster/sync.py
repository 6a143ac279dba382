"""Writing children only when they differ (controller-runtime's ``CreateOrPatch``, reporting what happened).

Desired children are server-side applied with the operator's field manager when :func:`needs_apply` says so, and
left alone otherwise — a converged reconcile sends no write at all. A child of the right name that another object
controls (typically one whose owner was deleted and is waiting for the garbage collector, while a cluster of the same
name is being recreated) is never taken over: the outcome is ``blocked`` and the reconcile looks again shortly.

Server-side apply keeps list entries another field manager added (say, a port added to ``-rw`` by hand): the apply
succeeds and the object still differs from ours, so every pass would apply again and the extra entry would stay.
When the applied object is still not what we asked for, the top-level fields we set are sent once more as a JSON
merge patch, which replaces lists as a whole: the child is reverted exactly, and the next pass writes nothing.
"""

from __future__ import annotations

from typing import Any, Literal

from kanri.postgres.cluster.diff import is_subset, needs_apply
from kanri.runtime import Cache, Client, Kind, controller_of

__all__ = ["FIELD_MANAGER", "Outcome", "ensure"]

Obj = dict[str, Any]
Outcome = Literal["created", "updated", "unchanged", "blocked"]
FIELD_MANAGER = "kanri-postgres"


async def ensure(client: Client, cache: Cache, kind: Kind, desired: Obj, owner_uid: str) -> Outcome:
    """Make the child ``desired`` exist as described; read the current one from the cache."""
    meta = desired["metadata"]
    current = cache.get(kind, meta["name"], meta.get("namespace") or "")
    if current is not None:
        controller = controller_of(current)
        if controller is not None and controller.get("uid") != owner_uid:
            return "blocked"
    if not needs_apply(desired, current):
        return "unchanged"
    applied = await client.apply(kind, desired, field_manager=FIELD_MANAGER)
    if not is_subset(desired, applied):
        body = {key: value for key, value in desired.items() if key not in ("apiVersion", "kind", "metadata")}
        await client.patch(kind, meta["name"], body, meta.get("namespace") or None)
    return "created" if current is None else "updated"
