"""Finalizers: add and remove ours without ever dropping anyone else's.

Both writes are JSON patches guarded by the ``resourceVersion`` the caller saw: a ``test`` op on
``/metadata/resourceVersion`` comes first, so a patch built from a stale view is refused instead of applied to a list
that has changed since (a merge patch would replace the whole ``finalizers`` list and silently drop a finalizer another
controller added meanwhile). Removal also tests the value at each index it removes, so it only ever removes our own
entry. Either call makes no API request when the object is already in the desired state.

A refused guard surfaces as :class:`ApiError` with ``.conflict`` true (409), like any optimistic-concurrency failure:
re-read the object and try again. (The API server answers a failed ``test`` op with a bare 422, indistinguishable by
status from a validation error; the helpers translate it, see :func:`_guard_failed`.)

:func:`finalizer_step` is the decision table of kube-rs' ``finalizer()`` helper::

    match finalizer_step(obj, FINALIZER):
        case "add":     obj = await add_finalizer(client, kind, obj, FINALIZER)  # then reconcile as "apply"
        case "apply":   ...  # normal, idempotent reconcile
        case "cleanup": ...  # idempotent cleanup; then obj = await remove_finalizer(client, kind, obj, FINALIZER)
        case "done":    ...  # being deleted and our cleanup is finished: nothing to do
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from kanri.runtime._client import Client
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import Kind, name_of, namespace_of

__all__ = [
    "FinalizerStep",
    "add_finalizer",
    "add_finalizer_patch",
    "finalizer_step",
    "has_finalizer",
    "is_being_deleted",
    "remove_finalizer",
    "remove_finalizer_patch",
]

Obj = dict[str, Any]
FinalizerStep = Literal["add", "apply", "cleanup", "done"]


def has_finalizer(obj: Mapping[str, Any], finalizer: str) -> bool:
    """True when ``finalizer`` is in the object's ``metadata.finalizers``."""
    return finalizer in (obj.get("metadata", {}).get("finalizers") or ())


def is_being_deleted(obj: Mapping[str, Any]) -> bool:
    """True once deletion was requested (``metadata.deletionTimestamp`` is set); finalizers still hold the object."""
    return bool(obj.get("metadata", {}).get("deletionTimestamp"))


def finalizer_step(obj: Mapping[str, Any], finalizer: str) -> FinalizerStep:
    """What a reconciler owning ``finalizer`` should do with ``obj`` now: the four cases of two facts.

    ============================  ===============  =========================================================
    being deleted?                has finalizer?   step
    ============================  ===============  =========================================================
    no                            no               ``"add"``: add the finalizer first, then reconcile normally
    no                            yes              ``"apply"``: reconcile normally
    yes                           yes              ``"cleanup"``: clean up, then remove the finalizer
    yes                           no               ``"done"``: our cleanup already ran (or never had to)
    ============================  ===============  =========================================================

    Adding before the first write guarantees that everything the reconciler creates outside the object's ownership
    tree is cleaned up later. A deleted object never gets the finalizer (again): the API server would refuse it.
    """
    deleting = is_being_deleted(obj)
    present = has_finalizer(obj, finalizer)
    if deleting:
        return "cleanup" if present else "done"
    return "apply" if present else "add"


def _resource_version(obj: Mapping[str, Any]) -> str:
    version = obj.get("metadata", {}).get("resourceVersion")
    if not version:
        raise ValueError("the object has no metadata.resourceVersion: read it from the API before patching it")
    return str(version)


def add_finalizer_patch(obj: Mapping[str, Any], finalizer: str) -> list[Obj] | None:
    """The guarded JSON patch that appends ``finalizer``, or None when the object already has it."""
    if has_finalizer(obj, finalizer):
        return None
    guard = {"op": "test", "path": "/metadata/resourceVersion", "value": _resource_version(obj)}
    if obj.get("metadata", {}).get("finalizers"):
        return [guard, {"op": "add", "path": "/metadata/finalizers/-", "value": finalizer}]
    # No list yet (the server omits an empty one): appending to a missing array would fail, so create it.
    return [guard, {"op": "add", "path": "/metadata/finalizers", "value": [finalizer]}]


def remove_finalizer_patch(obj: Mapping[str, Any], finalizer: str) -> list[Obj] | None:
    """The guarded JSON patch that removes every occurrence of ``finalizer``, or None when it is absent.

    Each removal is preceded by a ``test`` that the entry at that index is ours; indexes go from last to first so an
    earlier removal never shifts a later one.
    """
    current: list[str] = list(obj.get("metadata", {}).get("finalizers") or ())
    indexes = [i for i, name in enumerate(current) if name == finalizer]
    if not indexes:
        return None
    patch: list[Obj] = [{"op": "test", "path": "/metadata/resourceVersion", "value": _resource_version(obj)}]
    for i in reversed(indexes):
        patch.append({"op": "test", "path": f"/metadata/finalizers/{i}", "value": finalizer})
        patch.append({"op": "remove", "path": f"/metadata/finalizers/{i}"})
    return patch


def _guard_failed(error: ApiError) -> bool:
    """Whether a 422 answer to a guarded patch means a ``test`` op failed (our view was stale).

    kube-apiserver reports a JSON-patch application failure as 422 ``Invalid`` with empty ``details`` (the JSON-patch
    library's message is not passed on), while a validation failure of the patched object always names the object in
    ``details``. Only the former is a conflict; a real validation error (say, a malformed finalizer name) stays a 422
    so the caller does not retry it forever.
    """
    return error.status == 422 and error.reason == "Invalid" and not error.body.get("details")


async def _guarded_patch(client: Client, kind: Kind, obj: Mapping[str, Any], patch: list[Obj]) -> Obj:
    try:
        return await client.patch(kind, name_of(obj), patch, namespace_of(obj) or None, patch_type="json")
    except ApiError as exc:
        if not _guard_failed(exc):
            raise
        version = obj["metadata"]["resourceVersion"]
        raise ApiError(
            409,
            {
                "kind": "Status",
                "status": "Failure",
                "reason": "Conflict",
                "code": 409,
                "message": f"{kind.kind} {name_of(obj)!r} changed since resourceVersion {version}: read it again",
            },
            method=exc.method,
            path=exc.path,
        ) from exc


def _unchanged(obj: Mapping[str, Any]) -> Obj:
    # The object itself (a typed view is that very dict); only another kind of Mapping is copied.
    return obj if isinstance(obj, dict) else dict(obj)


async def add_finalizer(client: Client, kind: Kind, obj: Mapping[str, Any], finalizer: str) -> Obj:
    """Append ``finalizer`` to ``obj`` (as last read, with its ``resourceVersion``) and return the updated object.

    No request when ``obj`` already has it. Raises :class:`ApiError` — ``.conflict`` when ``obj`` is stale (re-read
    and retry), 422 when the server refuses the finalizer (for instance on an object already being deleted).
    """
    patch = add_finalizer_patch(obj, finalizer)
    if patch is None:
        return _unchanged(obj)
    return await _guarded_patch(client, kind, obj, patch)


async def remove_finalizer(client: Client, kind: Kind, obj: Mapping[str, Any], finalizer: str) -> Obj:
    """Remove ``finalizer`` from ``obj`` (as last read) and return the updated object; other finalizers stay.

    No request when ``obj`` does not have it. Raises :class:`ApiError` — ``.conflict`` when ``obj`` is stale (re-read
    and retry), ``.not_found`` when the object is gone. When this removes the last finalizer of an object being
    deleted, the server deletes it right after; the returned object is its final state.
    """
    patch = remove_finalizer_patch(obj, finalizer)
    if patch is None:
        return _unchanged(obj)
    return await _guarded_patch(client, kind, obj, patch)
