"""What every ``kanri status`` view renders with: ages, byte counts, pod states, titled tables, conditions, and which
Events belong to an object. Pure functions of their arguments, shared by :mod:`kanri.cli.status` (PostgresCluster),
:mod:`kanri.cli.status_cache` and :mod:`kanri.cli.status_kafka`, which import this module and not each other."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from kanri.runtime import parse_time

__all__ = [
    "about_cluster",
    "ago",
    "conditions_table",
    "event_time",
    "human_bytes",
    "pod_state",
    "show_reports",
    "titled_table",
]

Obj = dict[str, Any]


def about_cluster(event: Obj, cluster: str, pods: set[str], others: set[str]) -> bool:
    """The cluster itself, its pods, and its children, which are all named after it (``<cluster>-...``) — but not
    another cluster whose name merely starts with ours (``orders-archive`` and its children, for ``orders``)."""
    involved = (event.get("involvedObject") or {}).get("name") or ""
    if involved == cluster or involved in pods:
        return True
    if not involved.startswith(f"{cluster}-"):
        return False
    return not any(
        involved == other or involved.startswith(f"{other}-") for other in others if len(other) > len(cluster)
    )


def event_time(event: Obj) -> datetime:
    for stamp in (event.get("lastTimestamp"), (event.get("series") or {}).get("lastObservedTime"),
                  event.get("eventTime"), event["metadata"].get("creationTimestamp")):  # fmt: skip
        if stamp:
            return parse_time(stamp)
    return datetime.fromtimestamp(0, UTC)


def ago(stamp: str | datetime | None, now: datetime) -> str:
    """``3m12s ago`` style age of an RFC 3339 time or a datetime (``-`` when absent)."""
    if not stamp:
        return "-"
    moment = parse_time(stamp) if isinstance(stamp, str) else stamp
    seconds = max(0, int((now - moment).total_seconds()))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, seconds = divmod(rest, 60)
    if days:
        return f"{days}d{hours}h ago"
    if hours:
        return f"{hours}h{minutes}m ago"
    return f"{minutes}m{seconds}s ago" if minutes else f"{seconds}s ago"


def human_bytes(value: int | None) -> str:
    """Bytes in binary units (``16 MiB``); ``-`` when unknown."""
    if value is None:
        return "-"
    amount = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{amount:.0f} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def pod_state(pod: Obj | None) -> str:
    """What the pod is doing: Terminating, a container's waiting reason (ImagePullBackOff, CrashLoopBackOff, ...),
    or its phase with readiness and restarts."""
    if pod is None:
        return "no pod"
    if pod["metadata"].get("deletionTimestamp"):
        return "Terminating"
    status = pod.get("status") or {}
    containers = status.get("containerStatuses") or []
    for container in containers:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting and waiting.get("reason"):
            return str(waiting["reason"])
    phase = status.get("phase") or "Pending"
    ready = any(c["type"] == "Ready" and c["status"] == "True" for c in status.get("conditions") or [])
    restarts = sum(int(c.get("restartCount") or 0) for c in containers)
    text = f"{phase}, {'ready' if ready else 'not ready'}"
    return f"{text}, {restarts} restarts" if restarts else text


def titled_table(title: str, *columns: str) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, show_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def conditions_table(status: Obj, now: datetime) -> Table:
    table = titled_table("Conditions", "Type", "Status", "Reason", "Since", "Message")
    for condition in status.get("conditions") or []:
        style = "red" if (condition["type"], condition["status"]) in {("Ready", "False"), ("Degraded", "True")} else ""
        table.add_row(condition["type"], Text(condition["status"], style=style), condition.get("reason") or "",
                      ago(condition.get("lastTransitionTime"), now), condition.get("message") or "")  # fmt: skip
    return table


async def show_reports(
    report: Callable[[], Awaitable[RenderableType]],
    console: Console,
    *,
    watch: bool,
    interval: float = 2.0,
    frames: int | None = None,
    after_frame: Callable[[int], Awaitable[None]] | None = None,
) -> None:
    """Print ``report()`` once; with ``watch``, again every ``interval`` seconds — redrawn in place on a terminal,
    elsewhere each after a rule with the time (like ``kubectl get -w``). ``frames`` and ``after_frame`` bound and
    observe the loop (tests)."""
    shown = 0
    live = Live(console=console, auto_refresh=False) if watch and console.is_terminal else None
    try:
        if live is not None:
            live.start()
        while frames is None or shown < frames:
            frame = await report()
            if live is not None:
                live.update(frame, refresh=True)
            else:
                if watch:
                    console.rule(datetime.now(UTC).strftime("%H:%M:%S"))
                console.print(frame)
            shown += 1
            if after_frame is not None:
                await after_frame(shown)
            if not watch:
                return
            if frames is None or shown < frames:
                await asyncio.sleep(interval)
    finally:
        if live is not None:
            live.stop()
