"""The pass context: what one reconcile of one object hands its steps, and how steps end.

A step is a free function ``async def step(ctx: PassContext, ...) -> Result | None`` written against the small
:class:`PassContext` Protocol, never against a reconciler class: it reads ``ctx.obj`` and the cache, writes children
through ``ctx.children``, stages status on ``ctx.ledger``, adds to ``ctx.problems`` and may ask to be looked at again
with ``ctx.requeue(seconds)``. It returns ``None`` to let the pass go on, or a :class:`~kanri.runtime.Result` to end
the pass there (status is still written). Requeue requests merge: the soonest wins (:func:`soonest`).

:class:`ObjectPass` is the kit's implementation; :meth:`ObjectPass.run` runs the steps in order and then
:meth:`ObjectPass.finish` writes the pass's status once — ``observedGeneration``, ``Degraded`` from the problems,
everything staged — and sends one Warning Event per new problem.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

from kanri.kit._children import ChildWriter
from kanri.kit._labels import LabelSet
from kanri.kit._ledger import StatusLedger
from kanri.kit._problems import Problems
from kanri.runtime import Cache, Client, EventRecorder, Kind, Result

__all__ = ["ObjectPass", "PassContext", "Step", "soonest"]

Obj = dict[str, Any]


def soonest(*results: Result | None) -> Result | None:
    """Merge requeue requests: the soonest ``requeue_after`` wins; None (nothing asked) when none asks."""
    delays = [r.requeue_after for r in results if r is not None and r.requeue_after is not None]
    return Result(requeue_after=min(delays)) if delays else None


class PassContext(Protocol):
    """What a step may use: one object's pass. Steps depend on this, never on a reconciler."""

    @property
    def obj(self) -> Obj:
        """The object as last read or written this pass."""
        ...

    @property
    def name(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def client(self) -> Client: ...

    @property
    def cache(self) -> Cache: ...

    @property
    def events(self) -> EventRecorder: ...

    @property
    def labels(self) -> LabelSet: ...

    @property
    def ledger(self) -> StatusLedger: ...

    @property
    def problems(self) -> Problems: ...

    @property
    def children(self) -> ChildWriter: ...

    def requeue(self, after: float) -> None:
        """Look at the object again within ``after`` seconds (the soonest request of the pass wins)."""
        ...


Step = Callable[[PassContext], Awaitable[Result | None]]


class ObjectPass:
    """One reconcile of one object of ``kind`` (read from the cache); implements :class:`PassContext`.

    ``severity`` orders problem reasons (most serious first) for the ``Degraded`` condition. A child another owner
    holds is looked at again within ``conflict_retry`` seconds: usually that owner was deleted and the garbage
    collector is about to remove its children (None: wait for the next change).
    """

    def __init__(
        self,
        *,
        client: Client,
        cache: Cache,
        events: EventRecorder,
        kind: Kind,
        obj: Obj,
        labels: LabelSet,
        field_manager: str,
        severity: Sequence[str] = (),
        conflict_retry: float | None = 10.0,
    ) -> None:
        self._conflict_retry = conflict_retry
        self._client = client
        self._cache = cache
        self._events = events
        self._labels = labels
        self._problems = Problems(severity)
        self._ledger = StatusLedger(client, kind, obj, field_manager=field_manager)
        self._children = ChildWriter(client, cache, obj, field_manager=field_manager,
                                     hash_annotation=labels.key("applied-hash"), problems=self._problems)  # fmt: skip
        self._requeue: Result | None = None

    @property
    def obj(self) -> Obj:
        return self._ledger.obj

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.obj["metadata"].get("namespace") or "")

    @property
    def client(self) -> Client:
        return self._client

    @property
    def cache(self) -> Cache:
        return self._cache

    @property
    def events(self) -> EventRecorder:
        return self._events

    @property
    def labels(self) -> LabelSet:
        return self._labels

    @property
    def ledger(self) -> StatusLedger:
        return self._ledger

    @property
    def problems(self) -> Problems:
        return self._problems

    @property
    def children(self) -> ChildWriter:
        return self._children

    def requeue(self, after: float) -> None:
        self._requeue = soonest(self._requeue, Result(requeue_after=after))

    @property
    def writes(self) -> int:
        """Every write of the pass so far (children and status): zero on a converged object."""
        return self._children.writes + self._ledger.writes

    async def run(self, steps: Iterable[Step]) -> Result | None:
        """Run ``steps`` in order until one returns a Result, then :meth:`finish`."""
        for step in steps:
            ended = await step(self)
            if ended is not None:
                self._requeue = soonest(self._requeue, ended)
                break
        return await self.finish()

    async def finish(self) -> Result | None:
        """Write the pass's status once and announce new problems; the merged requeue request."""
        generation = self.obj["metadata"].get("generation")
        if generation is not None:
            self._ledger.stage("observedGeneration", generation)
        self._ledger.condition(**self._problems.condition())
        await self._ledger.flush()
        for problem in self._problems.new_since(self._ledger.before):
            await self._events.warning(self._ledger.obj, problem.reason, problem.event or problem.message)
        if self._children.conflicts and self._conflict_retry is not None:
            self.requeue(self._conflict_retry)
        return self._requeue
