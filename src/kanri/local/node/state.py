"""What the chaos verbs did to one node, and the gate its API traffic and kubelet wait on.

A node is ``stopped`` (its containers were killed, its agent and kubelet act no more), ``frozen`` (its pods'
processes are stopped by the freezer, and so are its heartbeats and kubelet) and/or ``partitioned`` (its pods are cut
off by nftables; the node's own API traffic is paused here, in code, as the node process shares the host's network).
While any of them holds, :meth:`NodeState.active` blocks: every call of the node's :class:`GatedClient`, every
heartbeat and kubelet reconcile waits there. Probes and container (re)starts wait only while the node is stopped or
frozen (:meth:`NodeState.running`): a cut-off kubelet still looks after its containers locally. ``close()`` (the
host shutting down) releases every waiter for good, so nothing hangs on a stopped node while the process ends.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

from kanri.runtime import Client, EventRecorder

Obj = dict[str, Any]

CONDITIONS = ("stopped", "frozen", "partitioned")


class NodeState:
    """The node's chaos conditions (any combination) and the gate they close."""

    def __init__(self) -> None:
        self.stopped = False
        self.frozen = False
        self.partitioned = False
        self.closing = False
        """The host is shutting down: the gate stays open whatever the conditions say."""
        self._open = asyncio.Event()
        self._open.set()
        self._alive = asyncio.Event()
        self._alive.set()

    def set(self, condition: str, value: bool) -> bool:
        """Set ``condition`` (one of :data:`CONDITIONS`); whether it changed."""
        if condition not in CONDITIONS:
            raise ValueError(f"unknown node condition {condition!r}")
        changed = bool(getattr(self, condition)) != value
        setattr(self, condition, value)
        self._update()
        return changed

    def close(self) -> None:
        self.closing = True
        self._update()

    def _update(self) -> None:
        for event, down in ((self._open, self.stopped or self.frozen or self.partitioned),
                            (self._alive, self.stopped or self.frozen)):  # fmt: skip
            if self.closing or not down:
                event.set()
            else:
                event.clear()

    @property
    def acting(self) -> bool:
        """Whether the node's agent and kubelet may act now."""
        return self._open.is_set()

    async def active(self) -> None:
        """Return once the node may act (at once when it may)."""
        await self._open.wait()

    @property
    def alive(self) -> bool:
        """Whether the node's own machine runs (not stopped, not frozen): it probes and restarts its containers,
        partitioned or not."""
        return self._alive.is_set()

    async def running(self) -> None:
        """Return once the node's machine runs (see :attr:`alive`)."""
        await self._alive.wait()

    def describe(self) -> str:
        """``Running``, or the conditions that hold (``Stopped``, ``Frozen,Partitioned``, …)."""
        held = [c.capitalize() for c in CONDITIONS if getattr(self, c)]
        return ",".join(held) or "Running"


class GatedClient(Client):
    """A node's own client: the shared client's connection, every request waiting for :meth:`NodeState.active`
    first — a stopped, frozen or partitioned node reaches the API server no more."""

    def __init__(self, inner: Client, state: NodeState, *, user_agent: str = "kanri-local-node") -> None:
        super().__init__(inner._connection, user_agent=user_agent)
        self.state = state

    async def _request(self, *args: Any, **kwargs: Any) -> Any:
        await self.state.active()
        return await super()._request(*args, **kwargs)


class NodeEvents(EventRecorder):
    """A node's Event recorder: while the node does not act, its Events are dropped (a stopped or cut-off kubelet's
    never arrive either) instead of blocking the caller — a container loop must never hang on one."""

    def __init__(self, client: Client, state: NodeState, *, component: str) -> None:
        super().__init__(client, component=component)
        self.state = state

    async def event(self, obj: Obj, event_type: Literal["Normal", "Warning"], reason: str, message: str) -> None:
        if self.state.acting:
            await super().event(obj, event_type, reason, message)
