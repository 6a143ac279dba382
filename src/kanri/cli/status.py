"""``kanri status [KIND/]NAME``: a bare NAME is one PostgresCluster at a glance — instances (role, node, zone, pod
state, LSNs, lag), replication, backups, the last failover and its gap, conditions and recent Warning Events.
``cache/NAME`` is a Cache (:mod:`kanri.cli.status_cache`); :data:`KINDS` is the table of kinds.

Everything is read through the API (the cluster, its pods, their nodes, the namespace's Events), so it works as
``kubectl kanri status`` for anyone allowed to read those; a user who may not read Nodes sees ``?`` as the zone.
:func:`render` is pure (a :class:`Snapshot` and the time in, rich renderables out) so the layout is testable alone.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from kanri.cli import status_cache, status_kafka
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
from kanri.postgres.api.v1alpha1 import DEFAULT_MAX_DATA_LOSS_BYTES
from kanri.postgres.kinds import POSTGRES_CLUSTER
from kanri.postgres.labels import CLUSTER, INSTANCE, ROLE, belongs
from kanri.runtime import ApiError, Client
from kanri.runtime._connection import ConfigError  # not re-exported by kanri.runtime; raised by from_kubeconfig
from kanri.runtime.kinds import EVENT, NODE, POD

__all__ = ["KINDS", "Snapshot", "follow", "parse_target", "render", "snapshot", "status"]

Obj = dict[str, Any]
ZONE_LABEL = "topology.kubernetes.io/zone"
RECENT_EVENTS = 10


@dataclass
class Snapshot:
    """What ``kanri status`` shows, as read from the API at one moment."""

    cluster: Obj
    pods: dict[str, Obj] = field(default_factory=dict)
    """Instance name -> its pod."""
    zones: dict[str, str] = field(default_factory=dict)
    """Node name -> its zone label ("" without one, "?" when the Node could not be read)."""
    events: list[Obj] = field(default_factory=list)
    """Warning Events of the cluster and its children, newest first."""


async def snapshot(client: Client, name: str, namespace: str) -> Snapshot:
    """Read the cluster, its pods (by the ``kanri.dev/cluster`` label and PostgreSQL's app name), their Nodes and the
    recent Warning Events."""
    cluster = await client.get(POSTGRES_CLUSTER, name, namespace)
    labelled, _ = await client.list(POD, namespace, label_selector=f"{CLUSTER}={name}")
    pods = [pod for pod in labelled if belongs(pod, name)]  # a pod made before the app name label has none
    zones: dict[str, str] = {}
    for node in sorted({pod["spec"].get("nodeName") for pod in pods} - {None}):
        try:
            labels = (await client.get(NODE, node))["metadata"].get("labels") or {}
            zones[node] = labels.get(ZONE_LABEL, "")
        except ApiError:  # forbidden (Nodes are cluster-scoped) or gone: say so instead of failing
            zones[node] = "?"
    warnings, _ = await client.list(EVENT, namespace, field_selector="type=Warning")
    clusters, _ = await client.list(POSTGRES_CLUSTER, namespace)
    others = {c["metadata"]["name"] for c in clusters} - {name}
    names = {pod["metadata"]["name"] for pod in pods}
    ours = [event for event in warnings if about_cluster(event, name, names, others)]
    ours.sort(key=event_time, reverse=True)
    # An instance is a StatefulSet of one pod (``orders-1`` runs pod ``orders-1-0``): match them by the label.
    by_instance = {(pod["metadata"].get("labels") or {}).get(INSTANCE) or pod["metadata"]["name"]: pod for pod in pods}
    return Snapshot(cluster, by_instance, zones, ours[:RECENT_EVENTS])


# --- rendering (pure) ------------------------------------------------------------------------------------------------


def _summary(cluster: Obj) -> Table:
    meta, spec, status = cluster["metadata"], cluster.get("spec") or {}, cluster.get("status") or {}
    replication, failover = spec.get("replication") or {}, spec.get("failover") or {}
    mode = replication.get("mode", "Async")
    sync = f", {replication.get('syncStandbys', 1)} synchronous standby(s) required" if mode == "Sync" else ""
    max_loss = failover.get("maxDataLossBytes", DEFAULT_MAX_DATA_LOSS_BYTES)
    rows = [
        ("Phase", str(status.get("phase") or "-")),
        ("PostgreSQL", f"{spec.get('version', '-')} (data: {status.get('postgresMajor', '-')})"),
        ("Instances", f"{status.get('readyReplicas', 0)}/{spec.get('replicas', '-')} ready"),
        ("Primary", f"{status.get('currentPrimary') or '-'} (timeline {status.get('timeline') or '-'})"),
        ("Replication", f"{mode}{sync}"),
        ("Failover", f"{failover.get('policy', 'Automatic')}, up to {human_bytes(max_loss)} of WAL at risk"),
        ("Generation", f"{meta.get('generation', '-')} (observed: {status.get('observedGeneration', '-')})"),
    ]
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table


def _instances(snap: Snapshot) -> Table:
    status = snap.cluster.get("status") or {}
    columns = ("Name", "Role", "Ready", "Pod", "Node", "Zone", "Received LSN", "Replayed LSN", "Lag", "Timeline")
    table = titled_table("Instances", *columns)
    reported = {instance["name"]: instance for instance in status.get("instances") or []}
    for name in sorted(reported.keys() | snap.pods.keys()):
        instance, pod = reported.get(name, {}), snap.pods.get(name)
        node = (pod or {}).get("spec", {}).get("nodeName") or "-"
        role = instance.get("role") or ((pod or {}).get("metadata", {}).get("labels") or {}).get(ROLE, "-")
        # Per-instance timelines when status has them; else the cluster's, which is the primary's.
        primary = name == status.get("currentPrimary")
        timeline = instance.get("timeline") or (status.get("timeline") if primary else None)
        table.add_row(
            name,
            str(role),
            "yes" if instance.get("ready") else "no",
            pod_state(pod),
            node,
            snap.zones.get(node, "-") or "-",
            instance.get("receivedLSN") or "-",
            instance.get("replayedLSN") or "-",
            human_bytes(instance.get("lagBytes")) if role != "Primary" else "-",
            str(timeline or "-"),
        )
    return table


def _failover(status: Obj, now: datetime) -> RenderableType:
    last = status.get("lastFailover")
    if not last:
        return Text("Last failover: none recorded")
    loss = "DATA LOSS POSSIBLE" if last.get("dataLossPossible") else "no data lost"
    gap = human_bytes(last.get("lsnGapBytes")) if last.get("lsnGapBytes") is not None else "unknown"
    return Text.assemble(
        ("Last failover: ", "bold"),
        f"{last.get('from', '?')} -> {last.get('to', '?')} at {last.get('time')} ({ago(last.get('time'), now)}), "
        f"timeline {last.get('timeline') or '-'}, WAL gap {gap}, ",
        (loss, "bold red" if last.get("dataLossPossible") else "green"),
        f", reason {last.get('reason') or '-'}",
    )


def _backups(cluster: Obj, now: datetime) -> RenderableType:
    if not (cluster.get("spec") or {}).get("backup"):
        return Text("Backups: not configured (spec.backup)")
    backup = (cluster.get("status") or {}).get("backup") or {}
    test = backup.get("lastRestoreTest") or {}
    rehearsal = f"{test.get('result')} {ago(test.get('time'), now)} in {test.get('durationSeconds')}s" if test else "-"
    return Text.assemble(
        ("Backups: ", "bold"),
        f"last successful {ago(backup.get('lastSuccessful'), now)}, last failed {ago(backup.get('lastFailed'), now)}, "
        f"recoverable from {backup.get('firstRecoverabilityPoint') or '-'}, last restore rehearsal {rehearsal}",
    )


def _events(events: list[Obj], now: datetime) -> RenderableType:
    if not events:
        return Text("Warning events: none recent")
    table = titled_table("Warning events", "Last seen", "Object", "Reason", "Count", "Message")
    for event in events:
        involved = event.get("involvedObject") or {}
        count = event.get("count") or (event.get("series") or {}).get("count") or 1
        table.add_row(ago(event_time(event), now),
                      f"{involved.get('kind', '')}/{involved.get('name', '')}", event.get("reason") or "", str(count),
                      event.get("message") or "")  # fmt: skip
    return table


def render(snap: Snapshot, now: datetime) -> Group:
    """The whole report for one snapshot."""
    meta, status = snap.cluster["metadata"], snap.cluster.get("status") or {}
    parts: list[RenderableType] = [
        Text(f"PostgresCluster {meta['namespace']}/{meta['name']}", style="bold underline"),
        _summary(snap.cluster),
        Text(""),
        _instances(snap),
        Text(""),
        _failover(status, now),
    ]
    if split := status.get("splitBrain"):
        fenced = ", ".join(side["name"] for side in split.get("fenced") or [])
        parts.append(Text(f"Split brain: kept {split['kept']['name']} ({split.get('keptBy')}), fenced {fenced}",
                          style="bold red"))  # fmt: skip
    parts += [_backups(snap.cluster, now), Text(""), conditions_table(status, now), Text(""), _events(snap.events, now)]
    return Group(*parts)


# --- the command -----------------------------------------------------------------------------------------------------


async def follow(
    client: Client,
    name: str,
    namespace: str,
    console: Console,
    *,
    interval: float = 2.0,
    frames: int | None = None,
    after_frame: Callable[[int], Awaitable[None]] | None = None,
) -> None:
    """``--watch``: redraw in place on a terminal; elsewhere print each new snapshot after a rule (like
    ``kubectl get -w``). ``frames`` and ``after_frame`` bound and observe the loop (tests)."""

    async def report() -> Group:
        return render(await snapshot(client, name, namespace), datetime.now(UTC))

    await show_reports(report, console, watch=True, interval=interval, frames=frames, after_frame=after_frame)


def _console() -> Console:
    # Piped output (grep, a file, a test) would otherwise be cut at 80 columns; COLUMNS still wins.
    width = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS") or 200)
    return Console(width=width, soft_wrap=False)


Viewer = Callable[[Client, str, str, Console, bool, float], Awaitable[None]]
"""Shows one object: (client, name, namespace, console, watch, interval)."""


async def _show_postgres(client: Client, name: str, namespace: str, console: Console, watch: bool,
                         interval: float) -> None:  # fmt: skip
    if watch:
        await follow(client, name, namespace, console, interval=interval)
    else:
        console.print(render(await snapshot(client, name, namespace), datetime.now(UTC)))


async def _show_cache(client: Client, name: str, namespace: str, console: Console, watch: bool,
                      interval: float) -> None:  # fmt: skip
    await status_cache.show(client, name, namespace, console, watch, interval)


KINDS: dict[str, tuple[str, Viewer]] = {
    # ``kanri status KIND/NAME``: the kind as typed (lower case) -> its name in messages and its viewer
    "postgrescluster": ("PostgresCluster", _show_postgres),
    "cache": ("Cache", _show_cache),
    "kafkatopic": ("KafkaTopic", status_kafka.show),
}
DEFAULT_KIND = "postgrescluster"
"""A bare NAME."""


def parse_target(target: str) -> tuple[str, str]:
    """``KIND/NAME`` (or a bare NAME: a PostgresCluster) -> (kind key, name); an unknown kind raises ValueError."""
    kind, _, name = target.rpartition("/")
    kind = kind.lower() or DEFAULT_KIND
    if kind not in KINDS and kind.endswith("s") and kind[:-1] in KINDS:
        kind = kind[:-1]  # caches/NAME, as kubectl accepts plurals
    if kind not in KINDS or not name:
        raise ValueError(f"unknown kind {kind!r} in {target!r}: one of {', '.join(sorted(KINDS))} (KIND/NAME)")
    return kind, name


async def _status(kind: str, name: str, namespace: str, kubeconfig: str | None, context: str | None, watch: bool,
                  interval: float) -> None:  # fmt: skip
    async with await Client.from_kubeconfig(kubeconfig, context) as client:
        await KINDS[kind][1](client, name, namespace, _console(), watch, interval)


def status(
    target: Annotated[
        str, typer.Argument(metavar="[KIND/]NAME", help="A PostgresCluster's name, or KIND/NAME (cache/NAME).")
    ],
    namespace: Annotated[str, typer.Option("--namespace", "-n", help="Its namespace.")] = "default",
    kubeconfig: Annotated[
        Path | None, typer.Option(help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config).")
    ] = None,
    context: Annotated[str | None, typer.Option(help="kubeconfig context (default: the current one).")] = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Keep showing it, refreshed every --interval.")] = False,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes with --watch.", min=0.5)] = 2.0,
) -> None:
    """Show a PostgresCluster (instances, replication, backups, last failover) or a Cache (cache/NAME: policy, pods,
    Services, failovers), with conditions and recent events."""
    try:
        kind, name = parse_target(target)
    except ValueError as exc:
        typer.echo(f"kanri status: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        asyncio.run(_status(kind, name, namespace, str(kubeconfig) if kubeconfig else None, context, watch, interval))
    except ApiError as exc:
        what = f"{KINDS[kind][0]} {namespace}/{name} not found" if exc.status == 404 else str(exc)
        typer.echo(f"kanri status: {what}", err=True)
        raise typer.Exit(1) from None
    except ConfigError as exc:
        typer.echo(f"kanri status: {exc}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        pass
