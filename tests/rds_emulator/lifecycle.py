"""What moto does not keep: each instance's status over time, its modifications waiting for the maintenance window and
when its storage last changed.

moto answers ``available`` the moment an instance exists; RDS walks documented statuses instead. A :class:`Timeline` is
a list of (status, until) steps ending in a final status; the status at a moment is read off it, so nothing runs in the
background and a test's clock decides (a real one, or one it advances by hand).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]

AVAILABLE = "available"
GONE = "deleted"
"""The final status of a deletion: the emulator deletes the instance in moto; RDS answers DBInstanceNotFound."""


@dataclass(frozen=True)
class Delays:
    """How long each status lasts, in seconds of the emulator's clock. RDS takes minutes to hours; tests want less."""

    creating: float = 1.0
    backing_up: float = 0.5
    modifying: float = 1.0
    storage_optimization: float = 1.0
    storage_cooldown: float = 6 * 3600.0
    """RDS refuses another storage change for six hours after one (or until its optimization ends, if longer)."""
    deleting: float = 1.0

    @classmethod
    def instant(cls) -> Delays:
        return cls(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)


@dataclass
class Timeline:
    steps: list[tuple[str, float]]
    final: str

    def status(self, now: float) -> str:
        for status, until in self.steps:
            if now < until:
                return status
        return self.final


def steps(start: float, final: str, *durations: tuple[str, float]) -> Timeline:
    """A timeline from ``start`` through ``durations`` (status, seconds) to ``final``; zero-length steps are skipped."""
    out: list[tuple[str, float]] = []
    at = start
    for status, seconds in durations:
        if seconds > 0:
            at += seconds
            out.append((status, at))
    return Timeline(out, final)


@dataclass
class Instance:
    """The emulator's own record of one DB instance."""

    timeline: Timeline
    pending: dict[str, str] = field(default_factory=dict)
    """Modifications waiting for the maintenance window, by parameter name (RDS's ``PendingModifiedValues``)."""
    storage_changed_at: float | None = None
    headers: dict[str, str] = field(default_factory=dict)
    """The signed headers of the call that started a deletion, reused to finish it in moto (same account and region)."""
    final_snapshot: str | None = None


class Lifecycles:
    """Every instance's record, keyed by (region, identifier) as RDS scopes identifiers."""

    def __init__(self, delays: Delays, clock: Clock) -> None:
        self.delays = delays
        self.clock = clock
        self._instances: dict[tuple[str, str], Instance] = {}
        self._snapshots: dict[tuple[str, str], float] = {}
        """Final snapshots being taken: (region, snapshot id) -> when they become available (the deletion's end)."""

    def get(self, key: tuple[str, str]) -> Instance | None:
        return self._instances.get(key)

    def status(self, key: tuple[str, str]) -> str | None:
        record = self._instances.get(key)
        return record.timeline.status(self.clock()) if record else None

    def created(self, key: tuple[str, str]) -> Instance:
        d = self.delays
        record = Instance(steps(self.clock(), AVAILABLE, ("creating", d.creating), ("backing-up", d.backing_up)))
        self._instances[key] = record
        return record

    def adopted(self, key: tuple[str, str]) -> Instance:
        """A record for an instance moto knows but the emulator does not (made before it started): available."""
        return self._instances.setdefault(key, Instance(Timeline([], AVAILABLE)))

    def modified(self, key: tuple[str, str], *, storage: bool) -> None:
        d, now = self.delays, self.clock()
        record = self.adopted(key)
        optimizing = ("storage-optimization", d.storage_optimization if storage else 0.0)
        record.timeline = steps(now, AVAILABLE, ("modifying", d.modifying), optimizing)
        if storage:
            record.storage_changed_at = now

    def storage_locked(self, key: tuple[str, str]) -> bool:
        """True while a new storage change is refused: within the cooldown or the optimization of the last one."""
        record = self._instances.get(key)
        if record is None or record.storage_changed_at is None:
            return False
        d = self.delays
        free_at = record.storage_changed_at + max(d.storage_cooldown, d.modifying + d.storage_optimization)
        return self.clock() < free_at

    def deleting(self, key: tuple[str, str], headers: dict[str, str], snapshot: str | None) -> None:
        record = self.adopted(key)
        record.timeline = steps(self.clock(), GONE, ("deleting", self.delays.deleting))
        record.headers = headers
        record.final_snapshot = snapshot
        if snapshot is not None:
            self._snapshots[(key[0], snapshot.lower())] = self.clock() + self.delays.deleting

    def snapshot_status(self, region: str, snapshot: str) -> str | None:
        """``creating`` while a final snapshot is being taken (RDS's status until the deletion ends), else None."""
        until = self._snapshots.get((region, snapshot.lower()))
        return "creating" if until is not None and self.clock() < until else None

    def finished_deletions(self) -> list[tuple[tuple[str, str], Instance]]:
        """Removes and returns the instances whose deletion has run its course (to be deleted in moto now)."""
        now = self.clock()
        done = [(k, r) for k, r in self._instances.items() if r.timeline.status(now) == GONE]
        for key, _ in done:
            del self._instances[key]
        return done

    def forget(self, key: tuple[str, str]) -> None:
        self._instances.pop(key, None)
