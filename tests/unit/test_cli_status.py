"""``kanri status``'s pure parts: ages, byte sizes, pod states, and a report for a cluster the operator has not
written a status for yet (the real API server's tests are in tests/integration/test_cli_status.py)."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

from kanri.cli._render import ago, human_bytes, pod_state
from kanri.cli.status import Snapshot, render

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("stamp", "expected"),
    [
        (None, "-"),
        ("2026-05-01T11:59:58Z", "2s ago"),
        ("2026-05-01T11:57:30Z", "2m30s ago"),
        ("2026-05-01T09:15:00Z", "2h45m ago"),
        ("2026-04-28T10:00:00Z", "3d2h ago"),
        ("2026-05-01T12:00:05Z", "0s ago"),  # a clock slightly ahead is not a negative age
    ],
)
def test_ago(stamp: str | None, expected: str) -> None:
    assert ago(stamp, NOW) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "-"),
        (0, "0 B"),
        (1023, "1023 B"),
        (8192, "8.0 KiB"),
        (16 * 1024 * 1024, "16.0 MiB"),
        (5 * 2**40, "5.0 TiB"),
    ],
)
def test_human_bytes(value: int | None, expected: str) -> None:
    assert human_bytes(value) == expected


def pod(status: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {"metadata": {"name": "orders-1", **meta}, "spec": {}, "status": status}


def test_pod_state_names_a_waiting_reason_before_the_phase() -> None:
    waiting = {"name": "postgres", "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff"}}}
    assert pod_state(pod({"phase": "Pending", "containerStatuses": [waiting]})) == "ImagePullBackOff"


def test_pod_state_of_running_terminating_and_missing_pods() -> None:
    ready = {"type": "Ready", "status": "True"}
    running = {"name": "postgres", "restartCount": 3, "state": {"running": {}}}
    assert pod_state(pod({"phase": "Running", "conditions": [ready], "containerStatuses": [running]})) == (
        "Running, ready, 3 restarts"
    )
    assert pod_state(pod({"phase": "Running"})) == "Running, not ready"
    assert pod_state(pod({}, deletionTimestamp="2026-05-01T11:00:00Z")) == "Terminating"
    assert pod_state(pod({})) == "Pending, not ready"
    assert pod_state(None) == "no pod"


def test_a_cluster_without_status_renders_with_placeholders() -> None:
    cluster = {"metadata": {"name": "orders", "namespace": "shop", "generation": 1}, "spec": {"replicas": 3}}
    out = io.StringIO()
    Console(file=out, width=160).print(render(Snapshot(cluster), NOW))
    text = out.getvalue()
    assert "PostgresCluster shop/orders" in text
    assert "0/3 ready" in text
    assert "Async" in text
    assert "Last failover: none recorded" in text
    assert "Warning events: none recent" in text
    assert re.search(r"Generation +1 \(observed: -\)", text)
