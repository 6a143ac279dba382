"""List-then-watch into a :class:`Store`, forever: the level-triggered view of one kind.

A paginated LIST fills the cache; a WATCH from the list's resourceVersion keeps it current. Bookmarks keep that
version fresh; the server ends each watch after a jittered ``timeoutSeconds`` and the informer resumes from the last
version it saw; a watch silent for longer than the inactivity timeout is abandoned and resumed (silent watches are a
known failure mode of long-lived Python operators); 410 Gone (the version was compacted) means relist; any other
failure is retried with exponential backoff.

An informer watches one namespace, all of them, or a list of them: a list runs one LIST+WATCH stream per namespace
(each with its own resourceVersion) into the one store, and is synced once every stream has listed.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import structlog

from kanri.runtime._client import Client
from kanri.runtime._errors import ApiError
from kanri.runtime._kinds import Kind
from kanri.runtime._resource_versions import newer
from kanri.runtime._store import Key, Store, key_of

Obj = dict[str, Any]
EventType = Literal["ADDED", "MODIFIED", "DELETED"]

log = structlog.get_logger("kanri.informer")


@dataclass(frozen=True, slots=True)
class Event:
    """A change the informer applied to its store. ``from_list`` marks changes found by a (re)list, not a watch.

    ``old`` is the previous state the informer had *from the API server* (never a write's result taken in ahead of
    its event, see :meth:`Informer.take_write`), so ``old`` → ``obj`` is one change as the server made it."""

    type: EventType
    obj: Obj
    old: Obj | None = None
    from_list: bool = False


Handler = Callable[[Event], None]


@dataclass(frozen=True)
class WatchTiming:
    """Watch timeouts. The server closes each watch after ``min_timeout``..``2*min_timeout`` seconds (jittered so a
    fleet of informers does not reconnect at once, as client-go does); the client gives up on a stream that delivered
    nothing (not even a bookmark) for ``inactivity``."""

    min_timeout: int = 300
    inactivity: float = 150.0
    backoff_base: float = 0.5
    backoff_max: float = 30.0


class Informer:
    """Keeps a :class:`Store` of ``kind`` in step with the API server and tells handlers about every change."""

    def __init__(
        self,
        client: Client,
        kind: Kind,
        *,
        namespace: str | None = None,
        namespaces: tuple[str, ...] | None = None,
        label_selector: str | None = None,
        timing: WatchTiming | None = None,
    ) -> None:
        if namespace is not None and namespaces is not None:
            raise ValueError("give namespace or namespaces, not both")
        self.client = client
        self.kind = kind
        self.namespaces: tuple[str, ...] | None = (namespace,) if namespace is not None else namespaces
        """The namespaces watched (None: all); for a cluster-scoped kind always None."""
        if self.namespaces is not None and not self.namespaces:
            raise ValueError("namespaces must name at least one namespace (None watches all)")
        self.label_selector = label_selector
        self.store = Store()
        self.synced = asyncio.Event()
        self._timing = timing or WatchTiming()
        self._handlers: list[Handler] = []
        self.relists = 0
        self.rewatches = 0
        # Where each stream's next watch starts: the version of the last event applied (absent: relist first). Kept
        # as events arrive, so a stream that breaks mid-way resumes after what it delivered instead of replaying it.
        self._resource_versions: dict[str | None, str] = {}
        self._listed: set[str | None] = set()
        # Keys whose stored object is a write's result the watch has not delivered yet: the watch's own latest object
        # for each, so events keep reporting real transitions and the store never moves back to an older version.
        self._ahead: dict[Key, Obj] = {}

    @property
    def namespace(self) -> str | None:
        """The one namespace watched, or None (all of them, or several: see :attr:`namespaces`)."""
        return self.namespaces[0] if self.namespaces is not None and len(self.namespaces) == 1 else None

    def covers(self, namespace: str) -> bool:
        """Whether objects of ``namespace`` reach this informer (always, for a cluster-scoped kind)."""
        return self.namespaces is None or namespace in self.namespaces

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    async def run(self) -> None:
        """Run until cancelled. ``synced`` is set after the first complete list (of every watched namespace)."""
        streams: tuple[str | None, ...] = self.namespaces if self.namespaces is not None else (None,)
        if len(streams) == 1:
            await self._stream(streams[0])
            return
        async with asyncio.TaskGroup() as group:
            for namespace in streams:
                group.create_task(self._stream(namespace), name=f"informer {self.kind} in {namespace}")

    async def _stream(self, namespace: str | None) -> None:
        failures = 0
        while True:
            try:
                if namespace not in self._resource_versions:
                    self._resource_versions[namespace] = await self._relist(namespace)
                await self._watch(namespace, self._resource_versions[namespace])
                failures = 0
            except ApiError as exc:
                if exc.gone:
                    log.info("watch expired; relisting", kind=str(self.kind), namespace=namespace,
                             resource_version=self._resource_versions.get(namespace))  # fmt: skip
                    self._resource_versions.pop(namespace, None)
                    continue
                failures += 1
                await self._back_off(failures, exc)
            except (TimeoutError, OSError) as exc:
                failures += 1
                await self._back_off(failures, exc)

    def take_write(self, obj: Obj) -> bool:
        """Store ``obj``, the object a write of ours returned (a copy the store may keep), ahead of its watch event;
        True when taken.

        Only a newer version of an object already stored is taken (creations, other namespaces and unwatched kinds
        arrive through the watch as usual); handlers are not told: the watch event that follows does that.
        """
        meta = obj.get("metadata") or {}
        if not meta.get("name"):
            return False
        key = key_of(obj)
        cached = self.store.get(*key)
        if cached is None or cached["metadata"].get("uid") != meta.get("uid"):
            return False
        if not newer(str(meta.get("resourceVersion", "")), str(cached["metadata"].get("resourceVersion", ""))):
            return False
        self._ahead.setdefault(key, cached)
        self.store.upsert(obj)
        return True

    def watched(self, namespace: str, name: str) -> Obj | None:
        """The latest state of an object the API server delivered (the store may hold a newer write of ours)."""
        key = (namespace, name)
        return self._ahead[key] if key in self._ahead else self.store.get(namespace, name)

    async def _back_off(self, failures: int, exc: BaseException) -> None:
        delay = min(self._timing.backoff_max, self._timing.backoff_base * 2 ** (failures - 1))
        delay = random.uniform(delay / 2, delay)
        error = str(exc) or type(exc).__name__
        if isinstance(exc, ApiError) and exc.not_found:
            # The kind is not served (yet): a CRD not installed, or installed but not Established.
            error += f" ({self.kind} is not served: is its CRD installed and Established? see install_crd)"
        log.warning("watch failed; retrying", kind=str(self.kind), error=error, delay=delay)
        await asyncio.sleep(delay)

    async def _relist(self, namespace: str | None) -> str:
        items, resource_version = await self.client.list(self.kind, namespace, label_selector=self.label_selector)
        self.relists += 1
        # the list is the server's word now (for its namespace: other streams' objects are not in it)
        for key in [k for k in self._ahead if namespace is None or k[0] == namespace]:
            del self._ahead[key]
        seen: set[Key] = set()
        for obj in items:
            key = key_of(obj)
            seen.add(key)
            old = self.store.upsert(obj)
            # Unchanged objects are reported too: a relist is also a periodic chance to look again.
            self._notify(Event("ADDED" if old is None else "MODIFIED", obj, old, from_list=True))
        mine = {key for key in self.store.object_keys() if namespace is None or key[0] == namespace}
        for key in mine - seen:
            gone = self.store.remove(key)
            if gone is not None:
                self._notify(Event("DELETED", gone, gone, from_list=True))
        self._listed.add(namespace)
        if len(self._listed) == (len(self.namespaces) if self.namespaces is not None else 1):
            self.synced.set()
        return resource_version

    async def _watch(self, namespace: str | None, resource_version: str) -> None:
        """One watch stream, until the server ends it; the stream's resourceVersion follows the events applied."""
        self.rewatches += 1
        timeout = self._timing.min_timeout + random.randint(0, self._timing.min_timeout)
        async for event in self.client.watch(
            self.kind,
            namespace,
            resource_version=resource_version,
            timeout_seconds=timeout,
            inactivity_timeout=self._timing.inactivity,
            label_selector=self.label_selector,
        ):
            obj: Obj = event["object"]
            resource_version = str(obj.get("metadata", {}).get("resourceVersion") or resource_version)
            kind = event["type"]
            if kind == "BOOKMARK":
                self._resource_versions[namespace] = resource_version
                continue
            obj.setdefault("apiVersion", self.kind.api_version)
            obj.setdefault("kind", self.kind.kind)
            key = key_of(obj)
            if kind == "DELETED":
                old = self._ahead.pop(key, None)
                stored = self.store.remove(key)
                self._notify(Event("DELETED", obj, old if old is not None else stored))
            elif key in self._ahead:
                old = self._ahead.pop(key)
                ahead = self.store.get(*key)
                if ahead is not None and newer(str(ahead["metadata"].get("resourceVersion", "")), resource_version):
                    self._ahead[key] = obj  # still behind our write: keep the newer object in the store
                else:
                    self.store.upsert(obj)
                self._notify(Event("MODIFIED", obj, old))
            else:
                old = self.store.upsert(obj)
                self._notify(Event("ADDED" if old is None else "MODIFIED", obj, old))
            self._resource_versions[namespace] = resource_version

    def _notify(self, event: Event) -> None:
        for handler in self._handlers:
            handler(event)
