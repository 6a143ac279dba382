"""One shared informer per kind: the read side of every controller in a manager."""

from __future__ import annotations

import asyncio
import builtins
from typing import Any

from kanri.runtime._client import Client
from kanri.runtime._informer import Informer, WatchTiming
from kanri.runtime._kinds import Kind
from kanri.runtime._store import Store

Obj = dict[str, Any]


class NotWatchedError(LookupError):
    """A cache read of a kind the cache has no informer for: nothing declared it, so nothing is cached."""


class Cache:
    """Informers keyed by kind, shared by all controllers (one LIST+WATCH per kind, however many controllers read it).

    Reads (``get``, ``list``, ``owned_by``) come from memory and never block on the API. Objects returned are the
    cached dicts: copy before changing them.

    Only kinds with an informer are cached: those of every controller added to the manager (``for_kind``, ``owns``,
    ``watches``) and those started with :meth:`wait_for_sync`. Reading any other kind raises
    :class:`NotWatchedError` (an empty answer would be a lie). Controllers start reconciling only once every
    informer of the cache has synced, so a reconcile may read the kinds of the manager's other controllers too.
    """

    def __init__(
        self,
        client: Client,
        *,
        namespace: str | None = None,
        namespaces: tuple[str, ...] | None = None,
        timing: WatchTiming | None = None,
    ) -> None:
        """Namespaced kinds are watched in ``namespace``, or in each of ``namespaces``, or (neither) everywhere."""
        self._client = client
        self._namespaces = (namespace,) if namespace is not None else namespaces
        self._timing = timing
        self._informers: dict[Kind, Informer] = {}
        self._group: asyncio.TaskGroup | None = None

    def informer(self, kind: Kind) -> Informer:
        """The informer of ``kind``, created on first use (and started at once when the cache runs)."""
        informer = self._informers.get(kind)
        if informer is None:
            namespaces = self._namespaces if kind.namespaced else None
            informer = Informer(self._client, kind, namespaces=namespaces, timing=self._timing)
            self._informers[kind] = informer
            if self._group is not None:
                self._group.create_task(informer.run(), name=f"informer {kind}")
        return informer

    def observe_write(self, kind: Kind, obj: Obj) -> None:
        """Take in an object that a write of ours returned, ahead of its watch event (``Client.add_write_listener``).

        Without this, a reconcile queued while the previous one was writing (say by the child it just created) reads
        the state before that write and writes it again. Only a newer version of an object already cached is taken
        (creations, other namespaces and unwatched kinds arrive through the watch as usual), and it stays until the
        watch has caught up with it (an older event does not replace it); handlers are not told, the watch event
        that follows does that. resourceVersions are compared as numbers (they are etcd revisions), and only when
        both are decimal: otherwise nothing is taken. ``obj`` becomes the cache's (the Client hands each listener a
        copy of its own).
        """
        informer = self._informers.get(kind)
        if informer is not None:
            informer.take_write(obj)

    def informer_of(self, kind: Kind) -> Informer | None:
        """The informer of ``kind`` if one exists (unlike :meth:`informer`, never creates one)."""
        return self._informers.get(kind)

    def store(self, kind: Kind) -> Store:
        """The store of ``kind``'s informer (created, unstarted until the cache runs, when there is none)."""
        return self.informer(kind).store

    def _watched(self, kind: Kind) -> Store:
        informer = self._informers.get(kind)
        if informer is None:
            raise NotWatchedError(
                f"{kind} is not in the cache: no controller owns or watches it. Declare it on a controller "
                "(Controller.owns(kind) or .watches(kind, mapper)), or start its informer before reading it with "
                "`await manager.cache.wait_for_sync([kind])`, or read it from the API with client.get/list"
            )
        return informer.store

    def get(self, kind: Kind, name: str, namespace: str = "") -> Obj | None:
        """The cached object (None when there is none); raises :class:`NotWatchedError` for an uncached kind."""
        return self._watched(kind).get(namespace if kind.namespaced else "", name)

    def list(
        self, kind: Kind, namespace: str | None = None, labels: dict[str, str] | None = None
    ) -> builtins.list[Obj]:
        """Cached objects of ``kind`` (in ``namespace``, all when None; with all of ``labels``)."""
        return self._watched(kind).list(namespace, labels)

    def owned_by(self, kind: Kind, uid: str) -> builtins.list[Obj]:
        """Objects of ``kind`` with an ownerReference to ``uid``."""
        return self._watched(kind).owned_by(uid)

    def synced(self, kinds: builtins.list[Kind] | None = None) -> bool:
        return all(self.informer(k).synced.is_set() for k in (kinds or builtins.list(self._informers)))

    async def wait_for_sync(self, kinds: builtins.list[Kind] | None = None) -> None:
        """Return once every informer of ``kinds`` (all, when None) has completed its first list.

        A kind without an informer gets one, started at once when the cache runs (else when it starts): this is how
        a reconciler reads a kind no controller declares (changes to it then queue nothing)."""
        for kind in kinds or builtins.list(self._informers):
            await self.informer(kind).synced.wait()

    async def run(self) -> None:
        """Run every informer (including ones added later) until cancelled."""
        async with asyncio.TaskGroup() as group:
            self._group = group
            try:
                for kind, informer in builtins.list(self._informers.items()):
                    group.create_task(informer.run(), name=f"informer {kind}")
                await asyncio.Event().wait()
            finally:
                self._group = None
