"""The failed primary's last known WAL position, and where it comes from: the input of the RPO guard in mode Async
(issue 29 item 11).

Two sources, each a lower bound of where the primary's WAL ended:

- **Memory**: the operator's own last healthy answer from the primary (``write_lsn``, probed every
  :data:`~kanri.postgres.ha.failover.PROBE_INTERVAL` s). Lost when the operator restarts.
- **Replicas**: what each replica's WAL receiver last heard of the primary's WAL end (``upstream`` in its report,
  remembered by its instance manager, :mod:`kanri.instance.upstream`). It survives an operator outage. While a
  replica streams, every flush on the primary is sent to it at once, so its evidence bounds the primary's position
  as of the last time it streamed. What the primary wrote after that is bounded by nothing the operator can read:
  a primary cut off from its replicas but not from the API server keeps running (its isolation check passes). So
  the evidence is used only when a replica streamed from it at most :data:`EVIDENCE_WINDOW` seconds before the
  operator found it failed — as recent as the operator's own probes would have been, give or take one detection
  window. Older evidence (all replicas had lost the primary long before) leaves the position unknown
  (``DataLossUnknown``), and the message says which evidence there was and how old.

The operator's first failed probe is a late anchor after a long outage: the primary may have died long before the
operator came back. A better one once Kubernetes knows the node is gone: a node whose kubelet stops renewing its
Lease is marked ``Ready=Unknown`` (reason ``NodeStatusUnknown``) by the node lifecycle controller once no renewal
came for its grace period (``--node-monitor-grace-period``: 20 s in kanri's local control plane, 40 s or 50 s by
upstream default). Assuming the shortest, :data:`NODE_GRACE`, only ever makes the anchor later, never earlier: its
last renewal was at least :data:`NODE_GRACE` before that transition; it went silent at most
:data:`NODE_HEARTBEAT` after it, and a primary that reaches neither its replicas nor the API server stops itself
within ~5 s (the isolation check). The evidence then also counts when a replica streamed from the primary at most
:data:`EVIDENCE_WINDOW` seconds before the node's last renewal, however long the operator was away: what the
primary may have written unseen is bounded by one heartbeat and one detection window (Patroni's leader position in
its DCS is up to one ``loop_wait``, 10 s, old). A node still Ready proves nothing (its primary may run cut off from
its replicas only): the operator's anchor applies, and a failover blocked for want of a position is decided again
each pass, so it goes on by itself once the node is marked. Not covered: a double fault, a kubelet dead while its
node's primary runs on cut off from its replicas but not from the API server. The transition's time is the
controller's clock: the nodes' and the control plane's clocks are assumed to agree (NTP), as Kubernetes' own node
lifecycle does.

The higher position wins when both are known. Only evidence of the primary's timeline counts (the cluster's
``status.timeline``, or the timeline the memory saw): a replica's memory of an earlier primary says nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from kanri.postgres.cluster.instances import InstanceReport
from kanri.postgres.metrics import lsn_bytes
from kanri.runtime import parse_time

__all__ = [
    "EVIDENCE_WINDOW",
    "NODE_GRACE",
    "NODE_HEARTBEAT",
    "LastPosition",
    "Source",
    "Witness",
    "anchor",
    "last_position",
    "node_silence",
    "witnesses",
]

EVIDENCE_WINDOW = 6.0
"""Seconds a replica's last streaming from the primary may precede the operator's first failed probe of it for its
evidence to bound the loss: one detection window (``UNREACHABLE_WINDOW``). With the operator up, the replicas
stream until after it first misses the primary (a receiver notices a dead primary within ~6 s), so the evidence
is at least as recent as the operator's memory."""

NODE_HEARTBEAT = 10.0
"""Seconds between two renewals of a node's Lease (the kubelet's: a quarter of its 40 s ``leaseDurationSeconds``)."""
NODE_GRACE = 20.0
"""The default grace assumed of the node lifecycle controller before it marks a silent node ``Ready=Unknown``: the
shortest known in use (kanri's local control plane; upstream defaults are 40 s and 50 s). A grace assumed shorter
than the real one only makes the anchor later (safe, but the evidence then rarely counts); longer would make it
earlier than the truth. ``kanri run --node-monitor-grace`` sets the cluster's real one."""

Source = Literal["Memory", "Replicas"]


@dataclass(frozen=True)
class Witness:
    """One replica's evidence of the failed primary's WAL end, aged at this pass."""

    name: str
    position: str
    timeline: int | None
    streaming_seconds: float
    """Since the replica was last seen streaming from the primary."""
    heard_seconds: float
    """Since its last message from the primary."""


def witnesses(reports: Mapping[str, InstanceReport], primary: str) -> list[Witness]:
    """The replicas that reported evidence (an older instance manager reports none)."""
    found = []
    for name, report in sorted(reports.items()):
        upstream = report.upstream
        if name == primary or report.role != "replica" or upstream is None or upstream.position is None:
            continue
        streaming = upstream.streaming_seconds if upstream.streaming_seconds is not None else float("inf")
        heard = upstream.heard_seconds if upstream.heard_seconds is not None else streaming
        found.append(Witness(name, upstream.position, upstream.timeline, streaming, heard))
    return found


@dataclass(frozen=True)
class LastPosition:
    """The failed primary's last known position (None: unknown), its source, and what the replicas said."""

    lsn: str | None
    source: Source | None
    evidence: str
    """The replicas' evidence in words (which, how old), for the failover's messages; empty when none."""


def _describe(w: Witness, since: float, what: str) -> str:
    before = w.streaming_seconds - since
    when = "still streaming" if w.streaming_seconds < 1 else (
        f"last streamed {before:.0f} s before {what}" if before >= 0 else
        f"last streamed {-before:.0f} s after {what}")  # fmt: skip
    return f"{w.name} heard WAL end {w.position} ({when})"


def node_silence(node: Mapping[str, Any] | None, now: datetime, grace: float = NODE_GRACE) -> float | None:
    """At least how many seconds before ``now`` the node last renewed its Lease: known only once the node lifecycle
    controller marked it ``Ready=Unknown`` (``NodeStatusUnknown``), ``grace`` (the controller's node-monitor grace,
    at most) before that transition; None for a node that is Ready, or not known."""
    conditions = ((node or {}).get("status") or {}).get("conditions") or []
    ready = next((c for c in conditions if c.get("type") == "Ready"), None)
    if ready is None or ready.get("status") != "Unknown" or ready.get("reason") != "NodeStatusUnknown":
        return None
    try:
        marked = parse_time(str(ready["lastTransitionTime"]))
    except (KeyError, ValueError):
        return None
    return max((now - marked).total_seconds() + grace, 0.0)


def anchor(watched: float, node_silent: float | None) -> tuple[float, str]:
    """Seconds ago of the moment the replicas' evidence is measured against, and what it is: the primary's node's
    last Lease renewal when the node has missed one since (``node_silent``: seconds since that renewal, None when
    unknown), else the operator's detection (``watched``: seconds since it first found the primary failed)."""
    if node_silent is not None and node_silent - NODE_HEARTBEAT > watched:
        return node_silent, "its node last renewed its Lease"
    return watched, "it was found failed"


def last_position(
    memory: str | None,
    found: list[Witness],
    *,
    timeline: int | None,
    watched: float,
    node_silent: float | None = None,
) -> LastPosition:
    """The position to bound the loss with. ``memory``: the write LSN the operator last saw (None after a restart);
    ``found``: the replicas' evidence (:func:`witnesses`); ``timeline``: the failed primary's; ``watched``: seconds
    since the operator first found the primary failed; ``node_silent``: seconds since the primary's node last
    renewed its Lease (None: unknown). The replicas' ages are measured at this same pass."""
    if timeline is None and found:
        timeline = max((w.timeline or 0) for w in found) or None
    relevant = [w for w in found if timeline is None or w.timeline == timeline]
    since, what = anchor(watched, node_silent)
    fresh = [w for w in relevant if w.streaming_seconds - since <= EVIDENCE_WINDOW]
    words = "; ".join(_describe(w, since, what) for w in relevant)
    if not relevant:
        words = "no replica reported evidence of its WAL end" + (f" on timeline {timeline}" if timeline else "")
    elif not fresh:
        words += f" — older than {EVIDENCE_WINDOW:.0f} s before {what}: it may have written after"
    # any replica's evidence is a lower bound of the primary's position; the freshest one bounds what came after it
    best = max(relevant, key=lambda w: lsn_bytes(w.position) or 0) if fresh else None
    if best is not None and (memory is None or (lsn_bytes(best.position) or 0) > (lsn_bytes(memory) or 0)):
        return LastPosition(best.position, "Replicas", words)
    if memory is not None:
        return LastPosition(memory, "Memory", words)
    return LastPosition(None, None, words)
