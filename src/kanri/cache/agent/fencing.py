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
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "Demote",
    "Fence",
    "Follow",
    "History",
    "Lead",
    "StartDecision",
    "decide_catch_up",
    "decide_running",
    "decide_start",
    "holds",
    "linked_to",
    "missing_bytes",
]

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
    silent_seconds: int | None = field(default=None, compare=False)
    """A replica's seconds without a word from its primary: since its last byte while the link is up
    (``master_last_io_seconds_ago``), since the link went down otherwise (``master_link_down_since_seconds``); None
    for a primary, or a replica that never had a link (how stale it is, not which history it holds: not compared)."""

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
            silent_seconds=_silent_seconds(info) if replica else None,
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


def _silent_seconds(info: Mapping[str, Any]) -> int | None:
    key = "master_last_io_seconds_ago" if info.get("master_link_status") == "up" else "master_link_down_since_seconds"
    seconds = int(info.get(key, -1))
    return seconds if seconds >= 0 else None  # -1: never linked since the server started


def holds(source: History, other: History) -> bool:
    """``source`` holds every write of ``other``'s history: it may be ``other``'s source without losing anything."""
    if other.empty:
        return True
    if other.replid == source.replid:
        return other.offset <= source.offset
    if other.replid == source.replid2 and source.replid2 != NO_ID:
        return other.offset < source.second_offset  # Valkey's second_repl_offset is the first byte not held
    return False


def missing_bytes(source: History, other: History) -> int | None:
    """Replication bytes ``other`` holds that ``source`` lacks (0 when ``source`` holds them all; None when their
    histories diverged and the gap cannot be measured)."""
    if holds(source, other):
        return 0
    if other.replid in (source.replid, source.replid2):
        return other.offset - (source.offset if other.replid == source.replid else source.second_offset - 1)
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


def linked_to(peer: History, me: History) -> bool:
    """``peer`` is a replica streaming from ``me`` on ``me``'s own history: everything it holds came from ``me``.
    Its offset may still read ahead of ``me``'s, because ``me`` was read a moment earlier while writes flowed (a pod
    Sentinel promoted during a planned switchover while its agent was still deciding took itself for one that came
    back without writes, and asked for a second failover)."""
    return peer.role == "replica" and peer.primary_host == me.host and peer.link_up and peer.replid == me.replid


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
    ahead = [peer.host for peer in peers if not holds(me, peer) and not linked_to(peer, me)]
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


@dataclass(frozen=True)
class Demote:
    """Stop being a primary: replicate from ``primary``, the one a majority of the Sentinels name."""

    primary: str
    reason: str
    lost_bytes: int | None = 0
    """Replication bytes this pod holds that ``primary`` lacks (None: histories diverged, unmeasurable): writes it
    accepted after the failover, none of them confirmed by a replica of the new primary's lineage."""


def decide_running(
    me: History, claims: Sequence[tuple[str, int]], named: History | None, *, underway: bool = False
) -> Demote | None:
    """Whether a running primary must step down: a second primary (a replica frozen through a failover that
    executes a promotion queued on its connection when it resumes, an old primary cut off and healed) accepts
    writes that are discarded when Sentinel finally reconfigures it. The agent does it at once instead.

    ``claims`` are the Sentinels' answers that answered: the primary each names and its configuration epoch
    (``SENTINEL MASTER``'s ``config-epoch``). The newest epoch is the last failover a majority authorised: a Sentinel
    that missed it names the old primary with an older epoch, so it never demotes the new one; a tie between two
    addresses at the newest epoch decides nothing. ``named`` is the newest named primary's history (None when it did
    not answer): a pod steps down only towards a primary that answers as one, never towards a node that is down.

    ``underway``: a Sentinel reports a failover in progress. Then nothing is decided: the leader keeps naming the old
    primary with the old epoch until the failover ends, so a pod it has just promoted would read a majority naming
    the old primary — which answers as one again the moment its frozen node resumes — and step down, discarding the
    writes its replicas confirmed (seen in the chaos e2e: 178 lost after a freeze).
    """
    if me.role != "primary" or not claims or underway:
        return None
    newest = max(epoch for _, epoch in claims)
    chosen = {address for address, epoch in claims if epoch == newest}
    if len(chosen) != 1 or me.host in chosen:
        return None
    (primary,) = chosen
    if named is None or named.host != primary or named.role != "primary":
        return None
    agreeing = sum(1 for address, _ in claims if address == primary)
    reason = f"{agreeing} of {len(claims)} Sentinels name {primary} the primary (epoch {newest}): this pod steps down"
    return Demote(primary, reason, missing_bytes(named, me))


def decide_catch_up(me: History, primary: History | None, peers: Sequence[History]) -> Follow | None:
    """Whether a replica whose primary stopped answering must first catch up from a peer replica that holds more.

    Sentinel promotes by the offsets it last read (``INFO`` every 1-10 s), so it may pick the replica that is
    behind; the other one, re-pointed at it, is fully re-synced and loses writes ``WAIT 1`` confirmed on it alone.
    So while the primary (``primary``: None when it does not answer) is gone, a replica behind a peer of the same
    primary and the same history replicates from that peer (a partial re-sync of the missing bytes): whichever one
    Sentinel then promotes holds every write either held. Harmless if the primary was only slow: Sentinel points the
    replica back at it once it answers again.
    """
    if me.role != "replica" or me.primary_host is None or primary is not None:
        return None
    ahead = [peer for peer in peers if peer.role == "replica" and peer.primary_host == me.primary_host
             and peer.replid == me.replid and peer.offset > me.offset]  # fmt: skip
    if not ahead:
        return None
    best = max(ahead, key=lambda peer: peer.offset)
    return Follow(best.host, f"{me.primary_host} does not answer and {best.host} holds {best.offset - me.offset} "
                             "bytes more of its history: catching up from it first")  # fmt: skip
