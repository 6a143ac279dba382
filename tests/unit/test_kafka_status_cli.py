"""``kanri status kafkatopic/NAME``'s pure parts: the KIND/NAME dispatch and the report rendered from a snapshot of
a topic growing (a step held by a lagging group), changing its replication factor, with settings drift, and one
being deleted behind its gate."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from typing import Any

from rich.console import Console

from kanri.cli.status import parse_target
from kanri.cli.status_kafka import TopicSnapshot, render
from kanri.kafka.topics.admin import GroupLag, TopicState

NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)


def text(snap: TopicSnapshot) -> str:
    console = Console(file=io.StringIO(), width=220, color_system=None)
    console.print(render(snap, NOW))
    return re.sub(r"[ \t]+", " ", console.file.getvalue())  # type: ignore[attr-defined]


def topic(**status: Any) -> dict[str, Any]:
    spec = {"cluster": "events", "partitions": 12, "replicationFactor": 3, "config": {"retention.ms": "600000"},
            "partitionGrowth": {"stepSize": 2, "pauseSeconds": 30, "maxLag": 100}}  # fmt: skip
    ready = {"type": "Ready", "status": "False", "reason": "ConsumerLag", "message": "billing lags 500 (maxLag 100)",
             "lastTransitionTime": "2026-12-06T11:55:00Z"}  # fmt: skip
    base = {"phase": "Blocked", "partitions": 8, "replicationFactor": 1, "observedGeneration": 3, "conditions": [ready]}
    meta = {"name": "orders", "namespace": "shop", "generation": 3}
    return {"metadata": meta, "spec": spec, "status": base | status}


def test_kind_slash_name_picks_the_kafka_topic_viewer() -> None:
    assert parse_target("kafkatopic/orders") == ("kafkatopic", "orders")
    assert parse_target("KafkaTopics/orders") == ("kafkatopic", "orders")


def test_the_report_shows_spec_against_kafka_the_held_step_the_change_and_the_groups() -> None:
    step = {"fromPartitions": 6, "toPartitions": 8, "time": "2026-12-06T11:50:00Z", "checks": "billing STABLE lag 0"}
    change = {"fromReplicas": 1, "toReplicas": 3, "started": "2026-12-06T11:58:00Z", "partitionsDone": 3,
              "partitionsTotal": 8, "throttleBytesPerSecond": 20971520}  # fmt: skip
    growth = {"target": 12, "lastStepTime": "2026-12-06T11:50:00Z", "blockedBy": "billing lags 500 (maxLag 100)"}
    snap = TopicSnapshot(
        topic(growth=growth, steps=[step], replicasChange=change, lastDrift="2026-12-06T11:40:00Z: retention.ms"),
        kafka=TopicState("orders", 8, 1, {"retention.ms": "1"}, 2, 600000, 3),
        groups=[GroupLag("billing", "STABLE", 500, 2), GroupLag("old-batch", "EMPTY", 9000, 0)],
        events=[{"type": "Normal", "reason": "ReplicasChangeStarted", "message": "topic orders: 1 -> 3",
                 "lastTimestamp": "2026-12-06T11:58:00Z", "metadata": {}}],
    )  # fmt: skip
    out = text(snap)
    assert "KafkaTopic shop/orders" in out
    assert "Partitions 8 (spec 12: differs), Kafka now" in out
    assert "Replication 1 (spec 3: differs), 2 under-replicated" in out
    assert "retention.ms 600000 1" in out  # spec vs Kafka
    assert "Last settings drift reverted: 2026-12-06T11:40:00Z: retention.ms" in out
    assert "Growth: to 12 partitions (2 at a time, 30 s apart, maxLag 100); no step under way" in out
    assert "blocked by: billing lags 500 (maxLag 100)" in out
    assert "6 8 10m0s ago billing STABLE lag 0" in out
    assert "Replication-factor change: 1 -> 3, 3 of 8 partitions done, started 2m0s ago" in out
    assert "billing STABLE 2 500 yes: over maxLag" in out
    assert "old-batch EMPTY 0 9000 no (no members)" in out  # shown, never waited for
    assert "Deletion: Retain: the topic and its messages are kept" in out
    assert "Ready False ConsumerLag 5m0s ago billing lags 500" in out
    assert "ReplicasChangeStarted" in out


def test_a_topic_being_deleted_shows_its_gate_and_kafka_not_reached_is_said() -> None:
    obj = topic(deletionBlockedBy="consumer groups have unconsumed messages: billing (lag 10)", phase="Deleting")
    obj["spec"]["deletionPolicy"] = "Delete"
    obj["metadata"]["deletionTimestamp"] = "2026-12-06T11:30:00Z"
    obj["metadata"]["annotations"] = {"kafka.kanri.dev/approve-deletion": "orders"}
    out = text(TopicSnapshot(obj, kafka_error="Kafka at 10.0.0.1:9092 not read: _TRANSPORT: refused"))
    assert "Kafka Kafka at 10.0.0.1:9092 not read" in out
    assert "Partitions 8 (spec 12: differs), as the operator last recorded" in out
    assert "Consumer groups: not read (Kafka not reached)" in out
    assert "kafka.kanri.dev/approve-deletion names it (now: orders)" in out
    assert "deleting since 30m0s ago (gives up, keeping the topic, after 3600 s" in out
    assert "blocked by: consumer groups have unconsumed messages: billing (lag 10)" in out
    assert "Events: none recent" in out
