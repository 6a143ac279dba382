"""What a concern's step may use of the reconcile pass: a Protocol, so no concern imports the pass or the reconciler.

The pass (:class:`kanri.postgres.cluster.reconciler.ClusterPass`) satisfies it structurally. Each concern narrows or
extends it with what it needs (``backup.archiving.Pass``, ``upgrade.step.Pass`` …), so the type checker shows which
concern reaches for what. A step reads the cluster as the pass last saw it and hands back what a status write
returned with :meth:`ClusterStep.adopt_status`; it never assigns the pass's fields.
"""

from __future__ import annotations

from typing import Any, Protocol

from kanri.runtime import Cache, Client, EventRecorder

__all__ = ["ClusterStep"]

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
