"""``kanri status cache/NAME``: one Cache at a glance — its data policy and what it promises, the primary, every pod
(role, whether ``-ro`` reads from it, whether it runs the current template, its state), the Services and where they
route, the rollout, the recorded failovers with their possible loss, conditions and recent Events.

Everything is read through the API (the Cache, its pods, StatefulSet, Services and the namespace's Events), like
``kanri status`` for a PostgresCluster (:mod:`kanri.cli.status`, whose rendering helpers this reuses). Replication
offsets are the operator's to read (pods are not reachable from where the CLI runs): it shows which replicas are
linked and readable, as the operator last saw them. :func:`render` is pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from kanri.cache.api import KIND, LABELS
from kanri.cache.children import READABLE, ROLE
from kanri.cli._render import (
    about_cluster,
    ago,
    conditions_table,
    event_time,
    human_bytes,
    pod_state,
    show_reports,
    titled_table,
)
from kanri.runtime import ApiError, Client
from kanri.runtime.kinds import EVENT, POD, SERVICE, STATEFUL_SET

__all__ = ["CacheSnapshot", "render", "show", "snapshot"]

Obj = dict[str, Any]
RECENT_EVENTS = 10
RECENT_FAILOVERS = 5
REVISION_LABEL = "controller-revision-hash"
PROMISES = {
    "Regenerable": "in memory only; a failover may lose writes not yet replicated (recorded below)",
    "Durable": "append-only file and a volume per pod; every write WAIT confirmed on a replica survives a failover",
}


@dataclass
class CacheSnapshot:
    """What ``kanri status cache/NAME`` shows, as read from the API at one moment."""

    cache: Obj
    pods: list[Obj] = field(default_factory=list)
    statefulset: Obj | None = None
    services: list[Obj] = field(default_factory=list)
    events: list[Obj] = field(default_factory=list)
    """Events of the cache and its pods (Normal and Warning: a rollout's steps are Normal), newest first."""


async def snapshot(client: Client, name: str, namespace: str) -> CacheSnapshot:
    cache = await client.get(KIND, name, namespace)
    selector = ",".join(f"{key}={value}" for key, value in LABELS.selector(name).items())
    pods, _ = await client.list(POD, namespace, label_selector=selector)
    services, _ = await client.list(SERVICE, namespace, label_selector=selector)
    try:
        statefulset: Obj | None = await client.get(STATEFUL_SET, name, namespace)
    except ApiError as exc:
        if not exc.not_found:
            raise
        statefulset = None
    events, _ = await client.list(EVENT, namespace)
    caches, _ = await client.list(KIND, namespace)
    others = {c["metadata"]["name"] for c in caches} - {name}
    names = {pod["metadata"]["name"] for pod in pods}
    ours = sorted((e for e in events if about_cluster(e, name, names, others)), key=event_time, reverse=True)
    pods.sort(key=lambda pod: int(pod["metadata"]["name"].rsplit("-", 1)[1]))
    return CacheSnapshot(cache, pods, statefulset, services, ours[:RECENT_EVENTS])


# --- rendering (pure) ------------------------------------------------------------------------------------------------


def _summary(snap: CacheSnapshot) -> Table:
    meta, spec, status = snap.cache["metadata"], snap.cache.get("spec") or {}, snap.cache.get("status") or {}
    policy = spec.get("dataPolicy", "-")
    read = spec.get("readPolicy") or {}
    bounds = [f"{read['maxLagSeconds']} s"] if "maxLagSeconds" in read else []
    bounds += [human_bytes(read["maxLagBytes"])] if "maxLagBytes" in read else []
    reads = (
        "primary only" if read.get("serveFrom", "Primary") == "Primary" else f"replicas within {' and '.join(bounds)}"
    )
    writable = status.get("writablePrimaries") or []
    rows = [
        ("Phase", str(status.get("phase") or "-")),
        ("Data", f"{policy}: {PROMISES.get(policy, '-')}"),
        ("Valkey", str(spec.get("version", "-"))),
        ("Pods", f"{spec.get('replicas', '-')} (replicas linked: {status.get('readyReplicas', 0)})"),
        ("Primary", str(status.get("currentPrimary") or "-")),
        ("Claiming primary", ", ".join(writable) or "none" if len(writable) != 1 else writable[0]),
        ("Reads (-ro)", f"{reads}; now: {', '.join(status.get('readableReplicas') or []) or 'the primary'}"),
        ("Deletion", f"{spec.get('deletionPolicy', 'Retain')} (volumes and the password Secret)"),
        ("Generation", f"{meta.get('generation', '-')} (observed: {status.get('observedGeneration', '-')})"),
    ]
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, Text(value, style="bold red") if key == "Claiming primary" and len(writable) > 1 else value)
    return table


def _pods(snap: CacheSnapshot) -> Table:
    status = snap.cache.get("status") or {}
    revision = ((snap.statefulset or {}).get("status") or {}).get("updateRevision")
    wanted = int((snap.cache.get("spec") or {}).get("replicas") or 0)
    readable = set(status.get("readableReplicas") or [])
    table = titled_table("Pods", "Name", "Role", "Reads", "Template", "Pod", "Node")
    for pod in snap.pods:
        meta = pod["metadata"]
        labels = meta.get("labels") or {}
        name = meta["name"]
        role = labels.get(ROLE) or "-"
        if name == status.get("currentPrimary"):
            role = "primary"
        reads = "yes" if labels.get(READABLE) == "true" or name in readable else "no"
        template = "-" if revision is None else ("current" if labels.get(REVISION_LABEL) == revision else "outdated")
        if int(name.rsplit("-", 1)[1]) >= wanted:
            template = f"{template}, leaving"
        table.add_row(name, role, reads, template, pod_state(pod), (pod.get("spec") or {}).get("nodeName") or "-")
    return table


def _services(snap: CacheSnapshot) -> Table:
    table = titled_table("Services", "Name", "Routes to")
    for service in sorted(snap.services, key=lambda s: s["metadata"]["name"]):
        selector = (service.get("spec") or {}).get("selector") or {}
        matching = [p["metadata"]["name"] for p in snap.pods
                    if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())]  # fmt: skip
        table.add_row(service["metadata"]["name"], ", ".join(matching) or "no pod")
    return table


def _failovers(status: Obj, now: datetime) -> RenderableType:
    records = (status.get("failovers") or [])[-RECENT_FAILOVERS:]
    if not records:
        return Text("Failovers: none recorded")
    table = titled_table("Failovers (newest last)", "When", "From", "To", "Possibly lost", "Reason")
    for record in records:
        loss = record.get("possibleLossBytes")
        style = "bold red" if loss is None or loss > 0 else "green"
        text = Text("unknown" if loss is None else human_bytes(loss), style=style)
        table.add_row(ago(record.get("time"), now), record.get("fromPod") or "?", record.get("toPod") or "?", text,
                      record.get("reason") or "")  # fmt: skip
    return table


def _events(events: list[Obj], now: datetime) -> RenderableType:
    if not events:
        return Text("Events: none recent")
    table = titled_table("Events", "Last seen", "Type", "Object", "Reason", "Message")
    for event in events:
        involved = event.get("involvedObject") or {}
        kind = event.get("type") or ""
        table.add_row(ago(event_time(event), now), Text(kind, style="red" if kind == "Warning" else ""),
                      f"{involved.get('kind', '')}/{involved.get('name', '')}", event.get("reason") or "",
                      event.get("message") or "")  # fmt: skip
    return table


def render(snap: CacheSnapshot, now: datetime) -> Group:
    """The whole report for one snapshot."""
    meta, status = snap.cache["metadata"], snap.cache.get("status") or {}
    return Group(
        Text(f"Cache {meta.get('namespace', '')}/{meta['name']}", style="bold underline"),
        _summary(snap),
        Text(""),
        _pods(snap),
        Text(""),
        _services(snap),
        Text(""),
        _failovers(status, now),
        Text(""),
        conditions_table(status, now),
        Text(""),
        _events(snap.events, now),
    )


# --- the command (kanri.cli.status dispatches cache/NAME here) -------------------------------------------------------


async def show(client: Client, name: str, namespace: str, console: Console, watch: bool, interval: float) -> None:
    """Print the report once, or with ``watch`` keep printing it every ``interval`` seconds (redrawn in place on a
    terminal)."""

    async def report() -> Group:
        return render(await snapshot(client, name, namespace), datetime.now(UTC))

    await show_reports(report, console, watch=watch, interval=interval)
