"""List-then-watch into a :class:`Store`, forever: the level-triggered view of one kind.

A paginated LIST fills the cache; a WATCH from the list's resourceVersion keeps it current. Bookmarks keep that
version fresh; the server ends each watch after a jittered ``timeoutSeconds`` and the informer resumes from the last
version it saw; a watch silent for longer than the inactivity timeout is abandoned and resumed (silent watches are a
known failure mode of long-lived Python operators); 410 Gone (the version was compacted) means relist; any other
failure is retried with exponential backoff.
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
from kanri.runtime._store import Key, Store, key_of

Obj = dict[str, Any]
EventType = Literal["ADDED", "MODIFIED", "DELETED"]

log = structlog.get_logger("kanri.informer")


@dataclass(frozen=True)
class Event:
    """A change the informer applied to its store. ``from_list`` marks changes found by a (re)list, not a watch."""

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
        label_selector: str | None = None,
        timing: WatchTiming | None = None,
    ) -> None:
        self.client = client
        self.kind = kind
        self.namespace = namespace
        self.label_selector = label_selector
        self.store = Store()
        self.synced = asyncio.Event()
        self._timing = timing or WatchTiming()
        self._handlers: list[Handler] = []
        self.relists = 0
        self.rewatches = 0
        # Where the next watch starts: the version of the last event applied (None: relist first). Kept as events
        # arrive, so a stream that breaks mid-way resumes after what it delivered instead of replaying it.
        self._resource_version: str | None = None

    def add_handler(self, handler: Handler) -> None:
        self._handlers.append(handler)

    async def run(self) -> None:
        """Run until cancelled. ``synced`` is set after the first complete list."""
        failures = 0
        while True:
            try:
                if self._resource_version is None:
                    self._resource_version = await self._relist()
                await self._watch(self._resource_version)
                failures = 0
            except ApiError as exc:
                if exc.gone:
                    log.info("watch expired; relisting", kind=str(self.kind), resource_version=self._resource_version)
                    self._resource_version = None
                    continue
                failures += 1
                await self._back_off(failures, exc)
            except (TimeoutError, OSError) as exc:
                failures += 1
                await self._back_off(failures, exc)

    async def _back_off(self, failures: int, exc: BaseException) -> None:
        delay = min(self._timing.backoff_max, self._timing.backoff_base * 2 ** (failures - 1))
        delay = random.uniform(delay / 2, delay)
        log.warning("watch failed; retrying", kind=str(self.kind), error=str(exc) or type(exc).__name__, delay=delay)
        await asyncio.sleep(delay)

    async def _relist(self) -> str:
        items, resource_version = await self.client.list(self.kind, self.namespace, label_selector=self.label_selector)
        self.relists += 1
        seen: set[Key] = set()
        for obj in items:
            key = key_of(obj)
            seen.add(key)
            old = self.store.upsert(obj)
            # Unchanged objects are reported too: a relist is also a periodic chance to look again.
            self._notify(Event("ADDED" if old is None else "MODIFIED", obj, old, from_list=True))
        for key in set(self.store.object_keys()) - seen:
            gone = self.store.remove(key)
            if gone is not None:
                self._notify(Event("DELETED", gone, gone, from_list=True))
        self.synced.set()
        return resource_version

    async def _watch(self, resource_version: str) -> None:
        """One watch stream, until the server ends it; ``_resource_version`` follows the events applied."""
        self.rewatches += 1
        timeout = self._timing.min_timeout + random.randint(0, self._timing.min_timeout)
        async for event in self.client.watch(
            self.kind,
            self.namespace,
            resource_version=resource_version,
            timeout_seconds=timeout,
            inactivity_timeout=self._timing.inactivity,
            label_selector=self.label_selector,
        ):
            obj: Obj = event["object"]
            resource_version = str(obj.get("metadata", {}).get("resourceVersion") or resource_version)
            kind = event["type"]
            if kind == "BOOKMARK":
                self._resource_version = resource_version
                continue
            obj.setdefault("apiVersion", self.kind.api_version)
            obj.setdefault("kind", self.kind.kind)
            if kind == "DELETED":
                old = self.store.remove(key_of(obj))
                self._notify(Event("DELETED", obj, old))
            else:
                old = self.store.upsert(obj)
                self._notify(Event("ADDED" if old is None else "MODIFIED", obj, old))
            self._resource_version = resource_version

    def _notify(self, event: Event) -> None:
        for handler in self._handlers:
            handler(event)
