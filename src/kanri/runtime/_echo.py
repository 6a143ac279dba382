"""Recognising the watch event that only reports a reconcile's own write (its "echo").

A reconcile that writes an object (status, a child) gets a watch event for that write a moment later. Queueing a
reconcile for it costs a no-op reconcile per write (2.9 reconciles per object in bench/runtime_operator.py instead of
1). The rule, applied by the controller to live watch events only (never to lists or resyncs):

    An event is our echo, and queues nothing, when (1) a reconcile of the same controller for the same key wrote the
    object and the server returned exactly this resourceVersion, and (2) the change from the previous state the watch
    delivered for that object lies entirely within what the write sent: every changed field was sent with the value
    the event shows, and no other manager's ``managedFields`` entry moved. Anything else queues the key.

(2) matters because the resourceVersion alone does not prove who made a change: a write that changes nothing
returns the object as it is — possibly just changed by someone else (a spec edit, a kubelet's status), whose event
carries that same resourceVersion. Such an event differs from its predecessor in fields we did not send, so it
queues. Server-side defaults or normalisation of what we sent also make an event "not ours": that errs on the side
of one extra reconcile, never of a missed one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import orjson

from kanri.runtime._client import Write
from kanri.runtime._kinds import Kind
from kanri.runtime._queue import Request
from kanri.runtime._resource_versions import newer

if TYPE_CHECKING:
    from kanri.runtime._informer import Event

Obj = dict[str, Any]
_MISSING: Any = object()

# Metadata the server sets on every write: never evidence of someone else's change on its own. (A spec change moves
# generation too, but the spec shows it.)
_SERVER_SET = frozenset({"resourceVersion", "generation", "managedFields"})
# ...and on creation.
_SET_ON_CREATE = frozenset({"uid", "creationTimestamp"})


def only_this_write(write: Write, old: Obj | None, new: Obj) -> bool:
    """Whether the change ``old`` → ``new`` (consecutive watch states of one object) is exactly ``write``."""
    meta = new.get("metadata") or {}
    if meta.get("resourceVersion") != write.resource_version or meta.get("uid") != write.uid:
        return False
    if old is not None and (old.get("metadata") or {}).get("resourceVersion") == write.resource_version:
        return False  # not a change at all: nothing to attribute
    sent = orjson.loads(write.sent)
    if not isinstance(sent, dict):
        return False
    old = old if old is not None else {}
    old_meta = old.get("metadata") or {}
    for key in new.keys() | old.keys():
        if key != "metadata" and not _covered(old.get(key, _MISSING), new.get(key, _MISSING), sent.get(key, _MISSING)):
            return False
    skip = _SERVER_SET | (_SET_ON_CREATE if not old else frozenset())
    sent_meta = sent.get("metadata") or {}
    for key in (meta.keys() | old_meta.keys()) - skip:
        if not _covered(old_meta.get(key, _MISSING), meta.get(key, _MISSING), sent_meta.get(key, _MISSING)):
            return False
    return _others_unmoved(write, old_meta.get("managedFields") or [], meta.get("managedFields") or [])


def _covered(old: Any, new: Any, sent: Any) -> bool:
    """Whether every difference between ``old`` and ``new`` is a field ``sent`` set to the value ``new`` has."""
    if old == new:
        return True
    if sent is _MISSING:
        return False
    if isinstance(sent, dict) and isinstance(new, dict):
        old_map = old if isinstance(old, dict) else {}
        return all(
            _covered(old_map.get(key, _MISSING), new.get(key, _MISSING), sent.get(key, _MISSING))
            for key in new.keys() | old_map.keys()
        )
    if sent is None and new is _MISSING:
        return True  # a merge patch's null removes the field
    # Lists (atomic in a merge patch; for server-side apply another manager's items would show as a difference)
    # and scalars: exactly what was sent.
    return bool(new == sent)


def _others_unmoved(write: Write, old: list[Obj], new: list[Obj]) -> bool:
    """Every ``managedFields`` entry but this write's own manager/operation/subresource is as it was."""

    def others(entries: list[Obj]) -> list[Obj]:
        return sorted(
            (
                e
                for e in entries
                if not (
                    e.get("manager") == write.manager
                    and e.get("operation") == write.operation
                    and (e.get("subresource") or None) == write.subresource
                )
            ),
            key=lambda e: (str(e.get("manager")), str(e.get("operation")), str(e.get("subresource"))),
        )

    return others(old) == others(new)


EchoKey = tuple[Kind, str, str]


class Echoes:
    """One controller's finished writes whose watch events have not arrived yet, and the reconciles running now.

    Events for a key whose reconcile is running are held back until it ends (its writes' responses may arrive after
    their events); then each is checked against that reconcile's writes and queues the key unless it is an echo.
    """

    def __init__(self) -> None:
        self._expected: dict[EchoKey, dict[str, tuple[Request, Write]]] = {}
        self._running: dict[Request, _Running] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._expected.values())

    def start(self, request: Request) -> list[Write]:
        """A reconcile of ``request`` starts; returns the list its writes are recorded in."""
        running = self._running[request] = _Running()
        return running.writes

    def to_queue(self, kind: Kind, event: Event, requests: Iterable[Request]) -> list[Request]:
        """Which of ``requests`` (the keys a live ``event`` of ``kind`` maps to) to queue: all but the one whose own
        finished reconcile wrote exactly this, and those being reconciled now (held back until they finish)."""
        echo = self._take(kind, event)
        queue = []
        for request in requests:
            running = self._running.get(request)
            if running is not None:
                running.held.append((kind, event, echo))
            elif not (echo is not None and echo[0] == request and only_this_write(echo[1], event.old, event.obj)):
                queue.append(request)
        return queue

    def forget(self, kind: Kind, event: Event) -> None:
        """A listed event still settles the writes it supersedes."""
        self._take(kind, event)

    def finish(self, request: Request, delivered: Callable[[Write], str | None]) -> bool:
        """The reconcile of ``request`` ended: expect the echoes of its writes; True when an event held back meanwhile
        was not an echo, so ``request`` must be queued again.

        ``delivered(write)`` is the resourceVersion the watch last delivered for the written object ("" when none
        yet), or None for a kind the controller does not watch (no event will ever settle such a write)."""
        running = self._running.pop(request)
        requeue = False
        pending = list(running.writes)
        for kind, event, echo in running.held:
            if echo is not None and echo[0] == request and only_this_write(echo[1], event.old, event.obj):
                continue
            mine = next(
                (w for w in pending if _same(w, kind, event) and only_this_write(w, event.old, event.obj)), None
            )
            if mine is None:
                requeue = True
            else:
                pending.remove(mine)
        for write in pending:
            seen = delivered(write)
            if seen is None:
                continue
            if not seen or newer(write.resource_version, seen):  # its event is still to come
                key = (write.kind, write.namespace, write.name)
                self._expected.setdefault(key, {})[write.resource_version] = (request, write)
        return requeue

    def _take(self, kind: Kind, event: Event) -> tuple[Request, Write] | None:
        """Settle the expected writes of ``event``'s object up to its version; the one with exactly that version."""
        meta = event.obj.get("metadata") or {}
        key = (kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        expected = self._expected.get(key)
        if expected is None:
            return None
        version = str(meta.get("resourceVersion", ""))
        echo = expected.pop(version, None)
        if event.type == "DELETED":
            expected.clear()
        else:
            for stale in [v for v in expected if not newer(v, version)]:
                del expected[stale]  # superseded: the watch has moved past it (a no-op write's old version)
        if not expected:
            del self._expected[key]
        return echo


@dataclass
class _Running:
    writes: list[Write] = field(default_factory=list)
    held: list[tuple[Kind, Event, tuple[Request, Write] | None]] = field(default_factory=list)


def _same(write: Write, kind: Kind, event: Event) -> bool:
    meta = event.obj.get("metadata") or {}
    return (
        write.kind == kind
        and write.name == meta.get("name")
        and write.namespace == (meta.get("namespace") or "")
        and write.resource_version == meta.get("resourceVersion")
    )
