"""The informer's cache of one kind: raw objects by namespace/name, with indexes. Reads never touch the API."""

from __future__ import annotations

import builtins
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

Obj = dict[str, Any]
Key = tuple[str, str]
IndexFunc = Callable[[Obj], Iterable[str]]


def key_of(obj: Obj) -> Key:
    meta = obj["metadata"]
    return str(meta.get("namespace") or ""), str(meta["name"])


def _namespace_index(obj: Obj) -> Iterable[str]:
    return (str(obj["metadata"].get("namespace") or ""),)


def _owner_index(obj: Obj) -> Iterable[str]:
    return (str(ref["uid"]) for ref in obj["metadata"].get("ownerReferences") or ())


def _label_index(obj: Obj) -> Iterable[str]:
    return (f"{k}={v}" for k, v in (obj["metadata"].get("labels") or {}).items())


NAMESPACE_INDEX = "namespace"
OWNER_INDEX = "owner"
LABEL_INDEX = "label"


class Store:
    """Objects keyed by (namespace, name), with the built-in indexes ``namespace``, ``owner`` (owner uid) and
    ``label`` (``key=value``), plus any added with :meth:`add_index`.

    Objects handed out are the cached dicts themselves: callers must treat them as read-only (copy before changing),
    which is what keeps 10,000 cached objects cheap.
    """

    def __init__(self) -> None:
        self._objects: dict[Key, Obj] = {}
        self._index_funcs: dict[str, IndexFunc] = {
            NAMESPACE_INDEX: _namespace_index,
            OWNER_INDEX: _owner_index,
            LABEL_INDEX: _label_index,
        }
        self._indexes: dict[str, defaultdict[str, set[Key]]] = {name: defaultdict(set) for name in self._index_funcs}

    def add_index(self, name: str, func: IndexFunc) -> None:
        """Index objects by the values ``func`` returns; existing objects are indexed at once."""
        self._index_funcs[name] = func
        index: defaultdict[str, set[Key]] = defaultdict(set)
        for key, obj in self._objects.items():
            for value in func(obj):
                index[value].add(key)
        self._indexes[name] = index

    def __len__(self) -> int:
        return len(self._objects)

    def get(self, namespace: str, name: str) -> Obj | None:
        return self._objects.get((namespace, name))

    def list(self, namespace: str | None = None, labels: dict[str, str] | None = None) -> list[Obj]:
        """Objects in ``namespace`` (all when None) whose labels include every pair of ``labels``."""
        keys: set[Key] | None = None
        if namespace is not None:
            keys = set(self._indexes[NAMESPACE_INDEX].get(namespace, ()))
        for label, value in (labels or {}).items():
            matching = self._indexes[LABEL_INDEX].get(f"{label}={value}", set())
            keys = set(matching) if keys is None else keys & matching
        if keys is None:
            return list(self._objects.values())
        return [self._objects[k] for k in sorted(keys)]

    def by_index(self, index: str, value: str) -> builtins.list[Obj]:
        return [self._objects[k] for k in sorted(self._indexes[index].get(value, ()))]

    def owned_by(self, uid: str) -> builtins.list[Obj]:
        """Objects with an ownerReference to ``uid``."""
        return self.by_index(OWNER_INDEX, uid)

    def object_keys(self) -> builtins.list[Key]:
        return list(self._objects)

    def upsert(self, obj: Obj) -> Obj | None:
        """Insert or replace; returns the previous object."""
        key = key_of(obj)
        old = self._objects.get(key)
        self._objects[key] = obj
        for name, func in self._index_funcs.items():
            values = set(func(obj))
            if old is not None:
                before = set(func(old))
                if before == values:
                    continue  # the usual update (status, data): same namespace, owners and labels
                index = self._indexes[name]
                for value in before - values:
                    self._discard(index, value, key)
                values -= before
            for value in values:
                self._indexes[name][value].add(key)
        return old

    def remove(self, key: Key) -> Obj | None:
        old = self._objects.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def _unindex(self, key: Key, obj: Obj) -> None:
        for name, func in self._index_funcs.items():
            index = self._indexes[name]
            for value in func(obj):
                self._discard(index, value, key)

    @staticmethod
    def _discard(index: defaultdict[str, set[Key]], value: str, key: Key) -> None:
        keys = index.get(value)
        if keys is not None:
            keys.discard(key)
            if not keys:
                del index[value]
