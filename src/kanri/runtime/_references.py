"""A reference to an object (core/v1 ObjectReference), as controller-runtime's ``reference.GetReference`` builds.

Events name the object they are about with one (``involvedObject``); so do status fields that point at another
object (a CronJob's ``status.active`` lists the Jobs it runs).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kanri.runtime._kinds import Kind

__all__ = ["object_reference"]


def object_reference(obj: Mapping[str, Any], kind: Kind | None = None) -> dict[str, Any]:
    """``{"apiVersion", "kind", "name", "namespace", "uid", "resourceVersion"}`` of ``obj``; empty fields are left
    out, as the API leaves them out (a cluster-scoped object has no namespace, one not created yet no uid).

    ``kind`` supplies ``apiVersion``/``kind`` when the object does not carry them (one built in code; objects read
    through the client or the cache always do). Raises ``ValueError`` when they are unknown, when the object has no
    ``metadata.name``, or when ``kind`` disagrees with what the object says it is.
    """
    meta = obj.get("metadata") or {}
    api_version = obj.get("apiVersion") or (kind.api_version if kind is not None else "")
    kind_name = obj.get("kind") or (kind.kind if kind is not None else "")
    if kind is not None and (api_version, kind_name) != (kind.api_version, kind.kind):
        raise ValueError(f"the object is a {kind_name}.{api_version}, not a {kind}")
    if not api_version or not kind_name:
        raise ValueError("the object has no apiVersion/kind: pass its Kind (object_reference(obj, KIND))")
    if not meta.get("name"):
        raise ValueError(f"the {kind_name} has no metadata.name")
    reference = {
        "apiVersion": api_version,
        "kind": kind_name,
        "name": meta["name"],
        "namespace": meta.get("namespace") or "",
        "uid": meta.get("uid") or "",
        "resourceVersion": meta.get("resourceVersion") or "",
    }
    return {key: value for key, value in reference.items() if value}
