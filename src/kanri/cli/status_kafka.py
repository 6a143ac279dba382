"""``kanri status kafkatopic/NAME``: one KafkaTopic at a glance — the spec beside what Kafka reports (partitions,
replication factor, under-replicated partitions, settings drift), the growth step under way and what blocks it,
the steps done, a replication-factor change and its progress, the consumer groups on the topic and their lag, the
deletion gate, conditions and recent Events.

The KafkaTopic, its KafkaCluster and the namespace's Events are read through the API; the groups and the topic
itself are read from Kafka at the cluster's ``status.bootstrap`` (what the operator uses), with a short timeout —
when Kafka cannot be reached from where the CLI runs, the report says so and shows what the operator last
recorded. :func:`render` is pure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from kanri.cli._render import ago, conditions_table, event_time, show_reports, titled_table
from kanri.kafka.api import APPROVE_DELETION, APPROVE_GROWTH, CLUSTER_KIND, RELEASE, TOPIC_KIND
from kanri.kafka.topics.admin import AdminError, GroupLag, TopicAdmin, TopicState
from kanri.runtime import Client
from kanri.runtime.kinds import EVENT

__all__ = ["TopicSnapshot", "render", "show", "snapshot"]

Obj = dict[str, Any]
RECENT_EVENTS = 10
RECENT_STEPS = 5
KAFKA_TIMEOUT = 5.0


@dataclass
class TopicSnapshot:
    """What ``kanri status kafkatopic/NAME`` shows, as read at one moment."""

    topic: Obj
    cluster: Obj | None = None
    kafka: TopicState | None = None
    """The topic as Kafka reports it now (None: no such topic, or Kafka not reached)."""
    groups: list[GroupLag] | None = None
    """The consumer groups on the topic (None: Kafka not reached)."""
    kafka_error: str | None = None
    """Why Kafka was not read (no bootstrap yet, unreachable)."""
    events: list[Obj] = field(default_factory=list)
    """Events of the KafkaTopic, newest first."""


def _name_in_kafka(topic: Obj) -> str:
    return str((topic.get("spec") or {}).get("topicName") or topic["metadata"]["name"])


async def snapshot(client: Client, name: str, namespace: str, kafka_timeout: float = KAFKA_TIMEOUT) -> TopicSnapshot:
    topic = await client.get(TOPIC_KIND, name, namespace)
    snap = TopicSnapshot(topic)
    clusters, _ = await client.list(CLUSTER_KIND, namespace)
    wanted = (topic.get("spec") or {}).get("cluster")
    snap.cluster = next((c for c in clusters if c["metadata"]["name"] == wanted), None)
    events, _ = await client.list(EVENT, namespace)
    ours = [e for e in events if (e.get("involvedObject") or {}).get("kind") == "KafkaTopic"
            and (e.get("involvedObject") or {}).get("name") == name]  # fmt: skip
    snap.events = sorted(ours, key=event_time, reverse=True)[:RECENT_EVENTS]
    bootstrap = ((snap.cluster or {}).get("status") or {}).get("bootstrap")
    if not bootstrap:
        snap.kafka_error = f"KafkaCluster {wanted} publishes no bootstrap address"
        return snap
    admin = TopicAdmin(bootstrap, timeout=kafka_timeout)
    try:
        snap.kafka = await admin.describe(_name_in_kafka(topic))
        if snap.kafka is not None:
            snap.groups = await admin.groups_on(snap.kafka.name, snap.kafka.partitions)
    except AdminError as exc:
        snap.kafka_error = f"Kafka at {bootstrap} not read: {exc}"
    finally:
        admin.close()
    return snap


# --- rendering (pure) ------------------------------------------------------------------------------------------------


def _grid(rows: list[tuple[str, str]]) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    return table


def _versus(wanted: Any, reported: Any) -> str:
    """``12 (spec 12)``; a difference is marked."""
    shown = "-" if reported is None else str(reported)
    return f"{shown} (spec {wanted})" if reported == wanted else f"{shown} (spec {wanted}: differs)"


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _summary(snap: TopicSnapshot) -> Table:
    meta, spec, status = snap.topic["metadata"], snap.topic.get("spec") or {}, snap.topic.get("status") or {}
    kafka = snap.kafka
    partitions = kafka.partitions if kafka else status.get("partitions")
    replicas = kafka.replication_factor if kafka else status.get("replicationFactor")
    under = kafka.under_replicated if kafka else status.get("underReplicatedPartitions")
    source = "Kafka now" if kafka else "as the operator last recorded"
    rows = [
        ("Topic", f"{_name_in_kafka(snap.topic)} on KafkaCluster {spec.get('cluster', '-')}"),
        ("Phase", str(status.get("phase") or "-")),
        ("Partitions", f"{_versus(spec.get('partitions'), partitions)}, {source}"),
        ("Replication", f"{_versus(spec.get('replicationFactor', 3), replicas)}, {_or_dash(under)} under-replicated"),
        ("Managed", "yes" if spec.get("managed", True) else "no (managed: false: kanri changes and deletes nothing)"),
        ("Key-ordered", "yes (each growth step waits for an approval)" if spec.get("keyOrdered") else "no"),
        ("Generation", f"{meta.get('generation', '-')} (observed: {status.get('observedGeneration', '-')})"),
    ]
    if snap.kafka_error:
        rows.append(("Kafka", snap.kafka_error))
    return _grid(rows)


def _settings(snap: TopicSnapshot) -> RenderableType:
    wanted = (snap.topic.get("spec") or {}).get("config") or {}
    drift = Text(
        f"Last settings drift reverted: {(snap.topic.get('status') or {}).get('lastDrift') or 'none recorded'}"
    )
    if snap.kafka is None:
        shown = ", ".join(f"{k}={v}" for k, v in sorted(wanted.items())) or "broker defaults"
        return Group(Text(f"Settings (spec): {shown}"), drift)
    table = titled_table("Settings", "Key", "Spec", "Kafka")
    for key in sorted(set(wanted) | set(snap.kafka.config)):
        spec_value, kafka_value = wanted.get(key, "-"), snap.kafka.config.get(key, "-")
        table.add_row(key, spec_value, Text(kafka_value, style="" if spec_value == kafka_value else "yellow"))
    return Group(table, drift)


def _growth(snap: TopicSnapshot, now: datetime) -> RenderableType:
    meta, spec, status = snap.topic["metadata"], snap.topic.get("spec") or {}, snap.topic.get("status") or {}
    growth, steps = status.get("growth"), status.get("steps") or []
    rules = spec.get("partitionGrowth") or {}
    parts: list[RenderableType] = []
    line = f"{rules.get('stepSize', 2)} at a time, {rules.get('pauseSeconds', 30)} s apart, maxLag " \
        f"{rules.get('maxLag', 1000)}"  # fmt: skip
    if growth:
        step = growth.get("step")
        under_way = f"step {step['fromPartitions']}->{step['toPartitions']} under way" if step else "no step under way"
        parts.append(Text.assemble(("Growth: ", "bold"), f"to {growth.get('target')} partitions ({line}); "
                                   f"{under_way}"))  # fmt: skip
        if growth.get("blockedBy"):
            parts.append(Text(f"  blocked by: {growth['blockedBy']}", style="yellow"))
    else:
        parts.append(Text.assemble(("Growth: ", "bold"), f"none under way ({line})"))
    approval = (meta.get("annotations") or {}).get(APPROVE_GROWTH)
    if spec.get("keyOrdered") or approval:
        parts.append(Text(f"  approval ({APPROVE_GROWTH}): {approval or 'none'}"))
    if steps:
        table = titled_table("Steps done (newest last)", "From", "To", "Done", "Checked")
        for done in steps[-RECENT_STEPS:]:
            table.add_row(str(done["fromPartitions"]), str(done["toPartitions"]), ago(done.get("time"), now),
                          done.get("checks") or "")  # fmt: skip
        parts.append(table)
    return Group(*parts)


def _replicas(status: Obj, now: datetime) -> RenderableType:
    change = status.get("replicasChange")
    if not change:
        return Text.assemble(("Replication-factor change: ", "bold"), "none under way")
    return Text.assemble(
        ("Replication-factor change: ", "bold"),
        f"{change['fromReplicas']} -> {change['toReplicas']}, {change.get('partitionsDone', 0)} of "
        f"{change.get('partitionsTotal', 0)} partitions done, started {ago(change.get('started'), now)}, throttled to "
        f"{change.get('throttleBytesPerSecond', 0)} B/s per broker",
    )


def _groups(snap: TopicSnapshot, max_lag: int) -> RenderableType:
    if snap.groups is None:
        return Text("Consumer groups: not read (Kafka not reached)")
    if not snap.groups:
        return Text("Consumer groups: none reads the topic")
    table = titled_table("Consumer groups", "Group", "State", "Members", "Lag", "Gates growth")
    for group in sorted(snap.groups, key=lambda g: g.group):
        gating = "no (no members)" if not group.members else ("yes: over maxLag" if group.lag > max_lag else "yes")
        lag = Text(str(group.lag), style="yellow" if group.members and group.lag > max_lag else "")
        table.add_row(group.group, group.state, str(group.members), lag, gating)
    return table


def _deletion(snap: TopicSnapshot, now: datetime) -> RenderableType:
    meta, spec, status = snap.topic["metadata"], snap.topic.get("spec") or {}, snap.topic.get("status") or {}
    policy = spec.get("deletionPolicy", "Retain")
    annotations = meta.get("annotations") or {}
    approval = annotations.get(APPROVE_DELETION) or "none"
    what = "the topic and its messages are kept" if policy == "Retain" else \
        f"deleted once no group has unconsumed messages and {APPROVE_DELETION} names it (now: {approval})"  # fmt: skip
    parts: list[RenderableType] = [Text.assemble(("Deletion: ", "bold"), f"{policy}: {what}")]
    if meta.get("deletionTimestamp"):
        timeout = spec.get("deletionTimeoutSeconds", 3600)
        parts.append(Text(f"  deleting since {ago(meta['deletionTimestamp'], now)} (gives up, keeping the topic, "
                          f"after {timeout} s; {RELEASE}=<topic> lets go at once)"))  # fmt: skip
    if status.get("deletionBlockedBy"):
        parts.append(Text(f"  blocked by: {status['deletionBlockedBy']}", style="yellow"))
    return Group(*parts)


def _events(events: list[Obj], now: datetime) -> RenderableType:
    if not events:
        return Text("Events: none recent")
    table = titled_table("Events", "Last seen", "Type", "Reason", "Count", "Message")
    for event in events:
        count = event.get("count") or (event.get("series") or {}).get("count") or 1
        kind = event.get("type") or ""
        table.add_row(ago(event_time(event), now), Text(kind, style="red" if kind == "Warning" else ""),
                      event.get("reason") or "", str(count), event.get("message") or "")  # fmt: skip
    return table


def render(snap: TopicSnapshot, now: datetime) -> Group:
    """The whole report for one snapshot."""
    meta, status = snap.topic["metadata"], snap.topic.get("status") or {}
    max_lag = int(((snap.topic.get("spec") or {}).get("partitionGrowth") or {}).get("maxLag", 1000))
    return Group(
        Text(f"KafkaTopic {meta.get('namespace', '')}/{meta['name']}", style="bold underline"),
        _summary(snap),
        Text(""),
        _settings(snap),
        Text(""),
        _growth(snap, now),
        _replicas(status, now),
        Text(""),
        _groups(snap, max_lag),
        Text(""),
        _deletion(snap, now),
        Text(""),
        conditions_table(status, now),
        Text(""),
        _events(snap.events, now),
    )


# --- the command -----------------------------------------------------------------------------------------------------


async def show(client: Client, name: str, namespace: str, console: Console, watch: bool, interval: float) -> None:
    """Print the report once, or with ``watch`` keep printing it every ``interval`` seconds (redrawn in place on a
    terminal)."""

    async def report() -> Group:
        return render(await snapshot(client, name, namespace), datetime.now(UTC))

    await show_reports(report, console, watch=watch, interval=interval)
