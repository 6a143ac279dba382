"""Which source a replica may sync from: never one that lacks writes a replica holds.

Sentinel points replicas at the pod it promoted, and a replica follows at once: it asks its new source for the rest
of its history (``PSYNC``) and, when the source does not hold that history, drops its whole dataset for a copy of
the source's (a full re-sync). Sentinel picks by the offsets it last read, so it may promote a pod that is behind
(stale offsets, or a replica frozen with the promotion queued on its connection that resumes within the failover
timeout: the integration test reproduces it), and the full re-sync then drops every write ``WAIT`` confirmed on the
replica alone.

So a replica authenticates to its source with a password that only that source accepts (each server's replication
user has its own, :func:`source_password`), and its agent sets the password (``masterauth``) for a source only
after checking it (:func:`check_source`): a replica whose source lacks writes some replica holds refuses to sync
(its link stays down, its data stays), and the pod holding them asks Sentinel for another failover, which promotes
the replica with the highest offset. Pure: :mod:`kanri.cache.agent.node` acts on the answers.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Collection, Sequence
from dataclasses import dataclass

from kanri.cache.agent.fencing import History, holds, linked_to
from kanri.cache.agent.resp import Secret

__all__ = ["LOCKED", "REPLICATION_USER", "SourceCheck", "check_source", "pick_source", "protects", "source_password"]

REPLICATION_USER = "kanri-repl"
"""The user replicas authenticate as (``masteruser``): it may only run the replication handshake."""
LOCKED = "locked-until-the-agent-checks-the-source"
"""``masterauth`` while no source is approved: no server's replication user accepts it."""


def source_password(password: Secret, address: str) -> Secret:
    """The password ``address``'s server accepts from its replicas: derived from the cache's password and the
    address (``host:port`` as Sentinel and the agents name it), so a replica holding it can sync from that server
    and no other."""
    digest = hmac.new(password.value.encode(), f"{REPLICATION_USER}:{address.lower()}".encode(), hashlib.sha256)
    return Secret(digest.hexdigest())


def protects(source: History, pod: History, *, own: bool = False) -> bool:
    """``pod`` holds writes a full re-sync from ``source`` would drop that a client may have been told were
    replicated: bytes it received as a replica (it acknowledged them, so ``WAIT`` may have counted it) that
    ``source`` lacks. A primary's bytes are its own, confirmed only through its replicas (pods of their own), and so
    are a former primary's own tail (``own``: its replication id is one its agent saw it generate as a primary)."""
    if pod.host == source.host or pod.offset == 0 or holds(source, pod) or linked_to(pod, source):
        return False
    return pod.role == "replica" and not own


@dataclass(frozen=True)
class SourceCheck:
    """Whether this pod may sync from a source, and why."""

    allowed: bool
    reason: str
    ask_failover: bool = False
    """This pod holds writes its source lacks, and the source is the primary the Sentinels name: only another
    failover (promoting the replica with the highest offset) lets the cache write again without losing them."""


def check_source(source: History | None, me: History, peers: Sequence[History], *, own: Collection[str] = (),
                 named: str | None = None) -> SourceCheck:  # fmt: skip
    """May ``me`` sync from ``source`` (None: it does not answer)? Not while ``source`` lacks writes ``me`` or an
    answering peer protects (:func:`protects`). ``own``: replication ids this pod generated as a primary; ``named``:
    the primary the Sentinels name."""
    if source is None:
        return SourceCheck(False, "the source does not answer")
    if protects(source, me, own=me.replid in own):
        return SourceCheck(False, f"{source.host} lacks writes this pod holds: never re-synced from it",
                           ask_failover=source.role == "primary" and named == source.host)  # fmt: skip
    behind = sorted(peer.host for peer in peers if protects(source, peer))
    if behind:
        return SourceCheck(False, f"{source.host} lacks writes {', '.join(behind)} hold")
    return SourceCheck(True, f"{source.host} holds every write this pod and its peers hold")


def pick_source(me: History, source: History | None, peers: Sequence[History], *, own: Collection[str] = (),
                named: str | None = None) -> tuple[str | None, SourceCheck]:  # fmt: skip
    """The source whose password this replica holds now, with the check of its current source: the current one
    (``source``, its ``primary_host``) when it is a primary, or a replica this one streams from, and passes
    :func:`check_source`; else, while the current one is gone or no primary (a failover is under way), the peer that
    passes it and that Sentinel will most likely promote (a primary first, then the highest offset), so the new
    primary's first ``REPLICAOF`` links at once; else none."""
    current = check_source(source, me, peers, own=own, named=named)
    if source is not None and (source.role == "primary" or linked_to(me, source)):
        return (source.host if current.allowed else None), current
    candidates = [peer for peer in peers if check_source(peer, me, peers, own=own).allowed]
    if not candidates:
        return None, current
    # a fenced old primary (a planned switchover) is never the one promoted: on a tie, another peer
    best = max(candidates, key=lambda peer: (peer.role == "primary", peer.offset, peer.host != me.primary_host))
    return best.host, current
