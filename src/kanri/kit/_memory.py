"""Per-object memory a reconciler keeps between passes, keyed by the object's uid and dropped when it is gone.

Anything that must survive an operator restart belongs in status; memory is for what may be lost at the price of
a little delay (since when a primary has looked unhealthy, when an instance was last asked to restart). Keyed by
uid, an object deleted and created again under the same name starts with fresh memory; :meth:`ObjectMemory.drop`
forgets a name the cache no longer has, so a long-lived operator's memory stays the size of what exists.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["ObjectMemory"]

T = TypeVar("T")


class ObjectMemory(Generic[T]):
    """``memory.of(obj)`` is the object's own ``T`` (made by ``factory`` the first time); ``memory.drop(namespace,
    name)`` when the reconciler finds the object gone."""

    def __init__(self, factory: Callable[[], T]) -> None:
        self._factory = factory
        self._by_uid: dict[str, T] = {}
        self._uid_of: dict[tuple[str, str], str] = {}

    def of(self, obj: Mapping[str, Any]) -> T:
        """The memory of ``obj`` (read from the API: it needs a uid); a new object under an old name gets new memory."""
        meta = obj["metadata"]
        uid = meta.get("uid")
        if not uid:
            raise ValueError("the object has no metadata.uid: memory is kept per object, read it from the API")
        key = (str(meta.get("namespace") or ""), str(meta["name"]))
        previous = self._uid_of.get(key)
        if previous is not None and previous != uid:
            self._by_uid.pop(previous, None)  # the name was deleted and created again
        self._uid_of[key] = uid
        if uid not in self._by_uid:
            self._by_uid[uid] = self._factory()
        return self._by_uid[uid]

    def get(self, obj: Mapping[str, Any]) -> T | None:
        """The memory of ``obj`` if there is any (nothing is made)."""
        return self._by_uid.get(str(obj["metadata"].get("uid") or ""))

    def drop(self, namespace: str, name: str) -> bool:
        """Forget the object of that name (call when the cache no longer has it); True when something was kept."""
        uid = self._uid_of.pop((namespace, name), None)
        return uid is not None and self._by_uid.pop(uid, None) is not None

    def __len__(self) -> int:
        return len(self._by_uid)

    def __iter__(self) -> Iterator[tuple[tuple[str, str], T]]:
        for key, uid in list(self._uid_of.items()):
            if uid in self._by_uid:
                yield key, self._by_uid[uid]
