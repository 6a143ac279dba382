"""What a concern's step may use of the reconcile pass: a Protocol, so no concern imports the pass or the reconciler.

The pass (:class:`kanri.postgres.cluster.reconciler.ClusterPass`) satisfies it structurally. Each concern narrows or
extends it with what it needs (``backup.archiving.Pass``, ``upgrade.step.Pass`` …), so the type checker shows which
concern reaches for what. A step reads the cluster as the pass last saw it and hands back what a status write
returned with :meth:`ClusterStep.adopt_status`; it never assigns the pass's fields.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any, Protocol

from kanri.postgres.api.v1alpha1 import PostgresClusterSpec
from kanri.postgres.cluster.problems import Problem
from kanri.postgres.metrics import PostgresMetrics
from kanri.runtime import ApiError, Cache, Client, EventRecorder, Kind

__all__ = ["ChildStep", "ClusterStep"]

Obj = dict[str, Any]


class ClusterStep(Protocol):
    """The cluster one pass works on, and the clients it works with."""

    @property
    def name(self) -> str: ...

    @property
    def namespace(self) -> str: ...

    @property
    def cluster(self) -> Obj:
        """The cluster as last read or written this pass (its status may be newer than the cache's)."""
        ...

    @property
    def status(self) -> Obj: ...

    @property
    def cache(self) -> Cache: ...

    @property
    def client(self) -> Client: ...

    @property
    def events(self) -> EventRecorder: ...

    def adopt_status(self, updated: Obj) -> None:
        """Take the status a status write returned as the pass's own (later steps read it, not the cache's)."""
        ...


class MeasuredStep(ClusterStep, Protocol):
    """A step that reads the spec, whether the instances run, and reports to the operator's metrics."""

    @property
    def spec(self) -> PostgresClusterSpec: ...

    @property
    def running(self) -> bool: ...

    @property
    def metrics(self) -> PostgresMetrics | None: ...


class ChildStep(ClusterStep, Protocol):
    """A step that writes the cluster's children: a write the API server refuses becomes one of the pass's problems
    (and the pass goes on)."""

    @property
    def spec(self) -> PostgresClusterSpec: ...

    @property
    def running(self) -> bool:
        """The cluster's instances run (not hibernated, not stopped for a major upgrade)."""
        ...

    @property
    def problems(self) -> list[Problem]:
        """What this pass found wrong so far (a step appends to it)."""
        ...

    async def apply(self, kind: Kind, desired: Obj) -> str:
        """Server-side apply ``desired`` when it differs: ``created``, ``updated``, ``unchanged``, ``blocked`` or
        ``rejected``."""
        ...

    async def write(self, kind: Kind, name: str, request: Awaitable[Any]) -> bool:
        """Send one write; False when it was refused (recorded as a problem)."""
        ...

    def rejected(self, kind: Kind, name: str, exc: ApiError) -> None: ...
