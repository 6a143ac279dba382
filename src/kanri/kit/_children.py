"""The child writer: apply / create-once / delete a child, reporting what happened (controller-runtime's
``CreateOrPatch``), with the two failures every operator meets turned into problems.

- **apply** (server-side apply with the operator's field manager, only when :func:`~kanri.kit._diff.needs_apply`
  says the child differs; a converged pass writes nothing). Server-side apply keeps list entries another manager
  added; when the applied object still is not what we asked for, the top-level fields we set are sent once more as
  a merge patch, which replaces lists whole, so the next pass writes nothing.
- **create-once** (a POST, never an update: generated credentials, claims). An existing object is adopted as it
  is; a 409 means the cache had not seen it yet.
- **delete** only what this owner controls, with the uid the cache saw as precondition (an object of that name
  without an owner is the user's: left alone, outcome ``conflict`` without a problem).

A child of the right name that *another* owner controls is never taken over: the outcome is ``conflict`` and a
``ChildConflict`` problem. A write the API server refuses (a 4xx: invalid, forbidden, quota) is ``rejected`` and a
``ChildRejected`` problem, and the pass goes on with its other children. Throttling and an unavailable server
(429, 5xx) are raised: the controller retries them with backoff.
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import structlog

from kanri.kit._diff import is_subset, needs_apply, with_hash
from kanri.kit._problems import Problems, child_conflict, child_rejected
from kanri.runtime import ApiError, Cache, Client, Kind, controller_of, set_owner

__all__ = ["ChildWriter", "WriteOutcome"]

Obj = dict[str, Any]
WriteOutcome = Literal["created", "updated", "unchanged", "deleted", "absent", "conflict", "rejected"]
log = structlog.get_logger("kanri.kit.children")


class ChildWriter:
    """Writes the children of ``owner`` (an object read from the API) and counts what it sent.

    ``hash_annotation`` is the operator's own key for the applied hash (``<domain>/applied-hash``); ``problems``
    collects conflicts and refusals.
    """

    def __init__(
        self,
        client: Client,
        cache: Cache,
        owner: Obj,
        *,
        field_manager: str,
        hash_annotation: str,
        problems: Problems,
    ) -> None:
        self._client = client
        self._cache = cache
        self._owner = owner
        self._field_manager = field_manager
        self._hash = hash_annotation
        self._problems = problems
        self.writes = 0
        """Writes sent (a converged pass sends none)."""
        self.conflicts: list[str] = []
        """``Kind name`` of each child another owner holds (the pass may look again soon: a deleted owner's
        children go with the garbage collector)."""

    @property
    def _uid(self) -> str:
        return str(self._owner["metadata"]["uid"])

    def _prepared(self, desired: Obj, owned: bool) -> Obj:
        child = copy.deepcopy(desired)
        meta = child.setdefault("metadata", {})
        meta.setdefault("namespace", self._owner["metadata"].get("namespace"))
        if owned:
            set_owner(child, self._owner)
        return child

    def _held_by_other(self, kind: Kind, current: Obj | None) -> bool:
        """Another owner controls ``current``: a problem, and no write."""
        if current is None:
            return False
        ref = controller_of(current)
        if ref is None or ref.get("uid") == self._uid:
            return False
        name = current["metadata"]["name"]
        self.conflicts.append(f"{kind.kind} {name}")
        self._problems.add(child_conflict(kind.kind, name, f"{ref.get('kind', 'an object')} {ref.get('name', '?')}"))
        log.warning("child controlled by another object; not taken over", kind=kind.kind, child=name,
                    owner=ref.get("name"))  # fmt: skip
        return True

    def _refused(self, kind: Kind, name: str, error: ApiError) -> WriteOutcome:
        if error.transient:
            raise error
        log.warning("child write refused", kind=kind.kind, child=name, status=error.status, error=error.message)
        self._problems.add(child_rejected(kind.kind, name, error))
        return "rejected"

    def current(self, kind: Kind, name: str) -> Obj | None:
        """The child as the cache has it (the owner's namespace)."""
        return self._cache.get(kind, name, str(self._owner["metadata"].get("namespace") or ""))

    async def apply(self, kind: Kind, desired: Obj, *, owned: bool = True) -> WriteOutcome:
        """Make the child ``desired`` exist as described (an owner reference added when ``owned``)."""
        child = with_hash(self._prepared(desired, owned), self._hash)
        meta = child["metadata"]
        current = self.current(kind, meta["name"])
        if self._held_by_other(kind, current):
            return "conflict"
        if not needs_apply(child, current, self._hash):
            return "unchanged"
        try:
            applied = await self._client.apply(kind, child, field_manager=self._field_manager)
            self.writes += 1
            if not is_subset(child, applied):
                body = {key: value for key, value in child.items() if key not in ("apiVersion", "kind", "metadata")}
                await self._client.patch(kind, meta["name"], body, meta.get("namespace"))
                self.writes += 1
        except ApiError as exc:
            return self._refused(kind, meta["name"], exc)
        return "created" if current is None else "updated"

    async def create_once(self, kind: Kind, desired: Obj, *, owned: bool = True) -> WriteOutcome:
        """Create the child unless one of its name exists (then it is adopted as it is, never overwritten)."""
        child = self._prepared(desired, owned)
        name = child["metadata"]["name"]
        current = self.current(kind, name)
        if self._held_by_other(kind, current):
            return "conflict"
        if current is not None:
            return "unchanged"
        try:
            await self._client.create(kind, child)
        except ApiError as exc:
            if exc.conflict:
                return "unchanged"  # there already; the cache had not seen it yet
            return self._refused(kind, name, exc)
        self.writes += 1
        return "created"

    async def delete(self, kind: Kind, name: str) -> WriteOutcome:
        """Delete the child ``name`` if this owner controls it (another's is a conflict; none is ``absent``)."""
        current = self.current(kind, name)
        if current is None or current["metadata"].get("deletionTimestamp"):
            return "absent"
        if self._held_by_other(kind, current):
            return "conflict"
        if controller_of(current) is None:
            # not created by an owner (a user's object of that name, say): never deleted by this writer
            log.info("child of that name has no owner; not deleted", kind=kind.kind, child=name)
            return "conflict"
        try:
            await self._client.delete(kind, name, current["metadata"].get("namespace"),
                                      uid=current["metadata"].get("uid"))  # fmt: skip
        except ApiError as exc:
            if exc.conflict:
                return "absent"  # the uid precondition failed: that object is gone, another has the name
            return self._refused(kind, name, exc)
        self.writes += 1
        return "deleted"
