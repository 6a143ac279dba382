"""What the operator reads from a Cache's pods, and what it concludes (pure): the primary, every pod that claims to be
one, which replicas ``readPolicy`` lets serve reads, and a failover Sentinel made since the last look with the
replication bytes it may have lost."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kanri.cache.agent.fencing import History, missing_bytes
from kanri.cache.agent.readable import MAX_LAG_SECONDS, WITHDRAWN_AT, seen_after, within_bound
from kanri.cache.agent.resp import UNAVAILABLE, Connection, Secret
from kanri.cache.agent.sources import protects
from kanri.cache.api import FailoverRecord, ReadPolicy
from kanri.cache.children import READABLE, ROLE
from kanri.cache.config import VALKEY_PORT

__all__ = ["Assessment", "Lag", "assess", "failover_record", "pod_routing", "probe", "recorded_primary"]


@dataclass(frozen=True)
class Lag:
    """A replica's distance from its primary: replication bytes and seconds since it last heard from it."""

    bytes: int
    seconds: int | None


@dataclass(frozen=True)
class Assessment:
    primaries: list[str]
    """Pods that report themselves primary (more than one: never Ready)."""
    primary: str | None
    """The one primary (None when there are none or several)."""
    linked: list[str]
    """Replicas whose link to the primary is up."""
    readable: list[str]
    """Pods ``-ro`` routes to."""
    lags: dict[str, Lag] = field(default_factory=dict)
    ahead: dict[str, int | None] = field(default_factory=dict)
    """Replicas holding replicated writes the primary lacks (bytes; None: histories diverged, unmeasurable): their
    agents refuse to re-sync from it (:mod:`kanri.cache.agent.sources`) and ask Sentinel for another failover."""


def readable_replica(policy: ReadPolicy, lag: Lag) -> bool:
    """A linked replica may serve reads when its lag is within every bound the policy states."""
    if policy.serve_from == "Primary":
        return False
    if policy.max_lag_bytes is not None and lag.bytes > policy.max_lag_bytes:
        return False
    return policy.max_lag_seconds is None or within_bound(lag.seconds, policy.max_lag_seconds)


def pod_routing(pod: Mapping[str, Any], history: History | None, seen: Assessment, policy: ReadPolicy
                ) -> dict[str, Any] | None:  # fmt: skip
    """The metadata patch that routes one pod, or None when it is routed already: its role label (what its server
    reports; none when it is silent), its readable label, and the seconds bound its agent enforces
    (:mod:`kanri.cache.agent.readable`). A pod its agent withdrew from ``-ro`` comes back only from a look at its
    server taken after the withdrawal (the mark goes with it); only what differs is written, under the pod's
    resourceVersion, so a withdrawal written since the operator's copy of the pod makes the write fail, not undone."""
    meta = pod["metadata"]
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    mark = notes.get(WITHDRAWN_AT)
    readable = meta["name"] in seen.readable and history is not None and seen_after(mark, history)
    bound = policy.max_lag_seconds if policy.serve_from == "Replicas" else None
    wanted_labels = {ROLE: history.role if history is not None else None, READABLE: "true" if readable else None}
    wanted_notes = {MAX_LAG_SECONDS: None if bound is None else str(bound), WITHDRAWN_AT: None if readable else mark}
    patch = {
        "labels": {key: value for key, value in wanted_labels.items() if labels.get(key) != value},
        "annotations": {key: value for key, value in wanted_notes.items() if notes.get(key) != value},
    }
    if not (patch["labels"] or patch["annotations"]):
        return None
    version = {"resourceVersion": meta["resourceVersion"]} if meta.get("resourceVersion") else {}
    return {key: value for key, value in patch.items() if value} | version


def recorded_primary(seen: Assessment, before: str | None) -> str | None:
    """The primary ``status.currentPrimary`` records after this look: the one primary seen, else the one on record
    (``before``). While none or several claim it, the last single one stays, so the next look that sees one primary
    compares with it and records the failover (a failover passing through a moment with two primaries was never
    recorded when this went to None)."""
    return seen.primary or before


def assess(pods: Mapping[str, History | None], io_seconds: Mapping[str, int | None], policy: ReadPolicy,
           former: str | None = None) -> Assessment:  # fmt: skip
    """``pods``: each pod's history (None: it did not answer), keyed by pod name; ``io_seconds``: a replica's
    seconds since its primary last spoke (``master_last_io_seconds_ago``); ``former``: the primary before the last
    failover (its unconfirmed tail is that failover's recorded possible loss, not a replica ahead)."""
    primaries = sorted(name for name, h in pods.items() if h is not None and h.role == "primary")
    primary = primaries[0] if len(primaries) == 1 else None
    lead = pods[primary] if primary else None
    linked: list[str] = []
    lags: dict[str, Lag] = {}
    for name, history in sorted(pods.items()):
        if lead is None or history is None or history.role != "replica" or not history.link_up:
            continue
        if history.primary_host is None or not history.primary_host.startswith(f"{primary}."):
            continue
        linked.append(name)
        lags[name] = Lag(max(0, lead.offset - history.offset), io_seconds.get(name))
    readable = [name for name in linked if readable_replica(policy, lags[name])]
    if primary is not None and not readable:
        readable = [primary]  # Primary policy, or no replica within the bounds: reads go to the primary
    ahead = {name: missing_bytes(lead, history) for name, history in sorted(pods.items())
             if lead is not None and history is not None and name not in (primary, former)
             and protects(lead, history)}  # fmt: skip
    return Assessment(primaries, primary, linked, readable, lags, ahead)


def failover_record(before: str | None, before_history: History | None, after: str, after_history: History,
                    now: datetime) -> FailoverRecord:  # fmt: skip
    """A failover from ``before`` to ``after`` as observed: the bytes the old primary had (at the operator's last
    look) that the new one never received. Writes acknowledged with WAIT by a replica that was promoted are never
    among them; what ``WAIT`` did not confirm may be."""
    loss = missing_bytes(after_history, before_history) if before_history is not None else None
    return FailoverRecord(time=now, from_pod=before, to_pod=after, possible_loss_bytes=loss,
                          reason="observed by the operator: Sentinel promoted another pod")  # fmt: skip


async def probe(address: str, password: Secret, timeout: float = 2.0) -> tuple[History | None, int | None]:
    """One pod's history and (for a replica) seconds since its primary last spoke; (None, None) when it does not
    answer."""
    try:
        connection = await Connection.open(address, VALKEY_PORT, password, timeout)
    except UNAVAILABLE:
        return None, None
    try:
        info = await connection.info("replication")
        keyspace = await connection.info("keyspace")
    except UNAVAILABLE:
        return None, None
    finally:
        await connection.close()
    keys = sum(int(db.get("keys", 0)) for db in keyspace.values() if isinstance(db, dict))
    seconds = info.get("master_last_io_seconds_ago")
    return History.from_info(address, info, keys), (int(seconds) if seconds is not None else None)
