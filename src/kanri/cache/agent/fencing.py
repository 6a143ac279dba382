"""Who may be a source of data: the run-id (replication id) and offset check, and the role a starting pod takes.

Valkey replicas follow whatever primary they are pointed at: one that restarted empty (no persistence) or behind
(the last second of an ``everysec`` append-only file) is re-synced from and wipes them — the anchors' data-wiping bug.
A node's history is its replication id and offset (``INFO replication``): node A *holds* node B's history when B's
id is A's current id (or the id A took over from at a promotion, ``master_replid2``) and B's offset is not beyond
A's. A node may be a source only for nodes whose history it holds.

A pod therefore always starts fenced (a replica of nothing: it refuses writes, and a replica without a primary link
refuses to be synced from, ``NOMASTERLINK``), reads its own history once its data is loaded, and only then takes a
role with :func:`decide_start`. Pure: the agent (:mod:`kanri.cache.agent.node`) acts on the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = ["Fence", "Follow", "History", "Lead", "StartDecision", "decide_start", "holds", "missing_bytes"]

NO_ID = "0" * 40


@dataclass(frozen=True)
class History:
    """One node's replication history and role, as ``INFO replication`` reports it."""

    host: str
    """Its address, ``host:port``."""
    role: Literal["primary", "replica"]
    replid: str
    offset: int
    replid2: str = NO_ID
    second_offset: int = -1
    primary_host: str | None = None
    """A replica's primary, ``host:port`` (None for a primary)."""
    link_up: bool = False
    """A replica's link to its primary is up."""
    keys: int = 0
    """Keys it holds (``DBSIZE``): data loaded from disk has keys but no replication history yet."""
    good_replicas: int | None = None
    """A primary's replicas within ``min-replicas-max-lag`` (None when ``min-replicas-to-write`` is off)."""

    @classmethod
    def from_info(cls, host: str, info: Mapping[str, Any], keys: int = 0) -> History:
        """From the parsed ``INFO replication`` section (valkey-py's dict) and ``DBSIZE``."""
        replica = info.get("role") in ("slave", "replica")
        return cls(
            host=host,
            role="replica" if replica else "primary",
            replid=str(info.get("master_replid", NO_ID)),
            offset=int(info.get("master_repl_offset", 0)),
            replid2=str(info.get("master_replid2", NO_ID) or NO_ID),
            second_offset=int(info.get("second_repl_offset", -1)),
            primary_host=f"{info['master_host']}:{info.get('master_port', 6379)}" if replica else None,
            link_up=replica and info.get("master_link_status") == "up",
            keys=keys,
            good_replicas=int(info["min_slaves_good_slaves"]) if "min_slaves_good_slaves" in info else None,
        )

    @property
    def empty(self) -> bool:
        """No data at all: never received or accepted a write, and loaded nothing from disk."""
        return self.offset == 0 and self.keys == 0

    @property
    def writable(self) -> bool:
        """A primary that accepts writes: with ``min-replicas-to-write 1`` (Durable), only while a replica is good."""
        return self.role == "primary" and (self.good_replicas is None or self.good_replicas >= 1)

    @property
    def from_disk(self) -> bool:
        """Data loaded from its append-only file at start, with no replication history since (unknown lineage)."""
        return self.offset == 0 and self.keys > 0


def holds(source: History, other: History) -> bool:
    """``source`` holds every write of ``other``'s history: it may be ``other``'s source without losing anything."""
    if other.empty:
        return True
    if other.replid == source.replid:
        return other.offset <= source.offset
    if other.replid == source.replid2 and source.replid2 != NO_ID:
        return other.offset <= source.second_offset
    return False


def missing_bytes(source: History, other: History) -> int | None:
    """Replication bytes ``other`` holds that ``source`` lacks (0 when ``source`` holds them all; None when their
    histories diverged and the gap cannot be measured)."""
    if holds(source, other):
        return 0
    if other.replid in (source.replid, source.replid2):
        return other.offset - (source.offset if other.replid == source.replid else source.second_offset)
    return None


@dataclass(frozen=True)
class Follow:
    """Replicate from ``primary``."""

    primary: str
    reason: str


@dataclass(frozen=True)
class Lead:
    """Become the primary (``REPLICAOF NO ONE``)."""

    reason: str


@dataclass(frozen=True)
class Fence:
    """Stay a replica of nothing; with ``failover``, ask Sentinel to promote the replica that holds the most."""

    reason: str
    failover: bool = False


StartDecision = Follow | Lead | Fence


def decide_start(me: History, peers: Sequence[History], named: str | None, *, bootstrap: bool) -> StartDecision:
    """The role a starting pod takes once its data is loaded.

    ``peers`` are the other pods that answered; ``named`` is the primary the Sentinels name (None: none answered);
    ``bootstrap`` is true for the first pod of a cache, the one that leads when nothing has any history yet.
    """
    primaries = [peer for peer in peers if peer.role == "primary" and peer.host != me.host]
    if len(primaries) == 1:
        return Follow(primaries[0].host, f"{primaries[0].host} is the primary")
    if primaries:
        chosen = [peer for peer in primaries if peer.host == named]
        if chosen:
            return Follow(chosen[0].host, f"{named} is the primary the Sentinels name (of {len(primaries)})")
        return Fence(f"{len(primaries)} pods claim to be primary and the Sentinels name none of them")
    if named is not None and named != me.host:
        return Fence(f"the Sentinels name {named} the primary, which did not answer: waiting for it or a failover")
    ahead = [peer.host for peer in peers if not holds(me, peer)]
    if ahead and me.offset == 0 and all(peer.offset == 0 for peer in peers):
        # every pod restarted from its own disk at once: no lineage to compare; the last primary leads
        if named == me.host or (named is None and bootstrap):
            return Lead("every pod restarted from disk: the last known primary leads")
        return Fence("every pod restarted from disk: waiting for the last known primary")
    if ahead:
        # came back empty or behind: its replicas hold writes it lacks, so one of them must lead
        return Fence(f"came back without writes {', '.join(sorted(ahead))} hold: a replica must be promoted",
                     failover=named == me.host)  # fmt: skip
    if named == me.host:
        return Lead("the Sentinels name this pod the primary and it holds every peer's history")
    if bootstrap and all(peer.empty for peer in peers):
        return Lead("first pod of a new cache: no pod has any data yet")
    return Fence("no primary is known yet: waiting for the Sentinels or the first pod")
