"""What one pass over a DatabaseInstance works with, once its class and provider are resolved."""

from __future__ import annotations

from dataclasses import dataclass

from kanri import kit
from kanri.cloud.api import DatabaseClassSpec, DatabaseInstanceSpec
from kanri.cloud.budget.gateway import Gateway
from kanri.cloud.metrics import CloudMetrics
from kanri.cloud.providers.base import Desired
from kanri.cloud.sync.polling import poll_delay

__all__ = ["CloudContext", "PollMemory"]


@dataclass
class PollMemory:
    """How often in a row the database was seen in one state (the poll backoff); may be lost at a restart."""

    state: str = ""
    looks: int = 0
    scale: float = 1.0
    """Multiplies every poll delay (tests run the emulator's minutes in seconds)."""

    def seen(self, state: str) -> int:
        """Count a look at ``state``; the looks before this one in the same state."""
        if state != self.state:
            self.state, self.looks = state, 0
        else:
            self.looks += 1
        return self.looks

    def delay(self, state: str) -> float:
        """Seconds until the next look at a database in ``state`` (backing off while it stays there)."""
        return poll_delay(state, self.seen(state)) * self.scale


@dataclass
class CloudContext:
    """The kit's pass plus the typed spec, the class, the provider behind its budget and the resolved Desired."""

    ctx: kit.ObjectPass
    spec: DatabaseInstanceSpec
    cls: DatabaseClassSpec
    class_name: str
    gateway: Gateway
    desired: Desired
    metrics: CloudMetrics
    poll: PollMemory

    @property
    def ledger(self) -> kit.StatusLedger:
        return self.ctx.ledger

    @property
    def uid(self) -> str:
        return str(self.ctx.obj["metadata"]["uid"])

    @property
    def generation(self) -> int | None:
        generation = self.ctx.obj["metadata"].get("generation")
        return int(generation) if generation is not None else None

    @property
    def external_id(self) -> str | None:
        """The database's provider ID once known (status), else the one to adopt."""
        return self.ledger.status.get("externalId") or self.spec.adopt_external_id
