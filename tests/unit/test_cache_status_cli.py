"""``kanri status cache/NAME``'s pure parts: the KIND/NAME dispatch and the report rendered from a snapshot of a
Durable cache mid-rollout after a lossy failover and a planned switchover."""

from __future__ import annotations

import io
import re
from datetime import UTC, datetime
from typing import Any

import pytest
from rich.console import Console

from kanri.cli.status import parse_target
from kanri.cli.status_cache import CacheSnapshot, render

NOW = datetime(2026, 5, 1, 12, 0, 0, tzinfo=UTC)
ROLE, READABLE = "cache.kanri.dev/role", "cache.kanri.dev/readable"


def test_kind_slash_name_picks_the_viewer_and_a_bare_name_stays_a_postgrescluster() -> None:
    assert parse_target("orders") == ("postgrescluster", "orders")
    assert parse_target("cache/orders") == ("cache", "orders")
    assert parse_target("Caches/orders") == ("cache", "orders")
    assert parse_target("postgrescluster/orders") == ("postgrescluster", "orders")
    with pytest.raises(ValueError, match="unknown kind 'widget'"):
        parse_target("widget/orders")
    with pytest.raises(ValueError, match="unknown kind"):
        parse_target("cache/")


def pod(index: int, role: str, revision: str, readable: bool = False) -> dict[str, Any]:
    labels = {"cache.kanri.dev/cache": "orders", ROLE: role, "controller-revision-hash": revision}
    if readable:
        labels[READABLE] = "true"
    ready = {"type": "Ready", "status": "True"}
    return {"metadata": {"name": f"orders-{index}", "labels": labels}, "spec": {"nodeName": "node-a"},
            "status": {"phase": "Running", "conditions": [ready]}}  # fmt: skip


def snapshot() -> CacheSnapshot:
    spec = {"dataPolicy": "Durable", "replicas": 2, "version": "9.1", "storage": {"size": "1Gi"},
            "readPolicy": {"serveFrom": "Replicas", "maxLagSeconds": 2}}  # fmt: skip
    status = {
        "phase": "Ready",
        "currentPrimary": "orders-1",
        "writablePrimaries": ["orders-1"],
        "readyReplicas": 2,
        "readableReplicas": ["orders-0"],
        "observedGeneration": 4,
        "failovers": [
            {
                "time": "2026-05-01T11:30:00Z",
                "fromPod": "orders-0",
                "toPod": "orders-2",
                "possibleLossBytes": 4096,
                "reason": "observed by the operator: Sentinel promoted another pod",
            },
            {
                "time": "2026-05-01T11:58:00Z",
                "fromPod": "orders-2",
                "toPod": "orders-1",
                "possibleLossBytes": 0,
                "reason": "planned switchover from orders-2 to orders-1",
            },
        ],
        "conditions": [
            {
                "type": "Ready",
                "status": "True",
                "reason": "Replicating",
                "message": "orders-1 is the primary",
                "lastTransitionTime": "2026-05-01T11:58:00Z",
            },
            {
                "type": "Updating",
                "status": "True",
                "reason": "ReplacingPod",
                "message": "replacing replica orders-0 with the current template; pending: orders-0; leaving: orders-2",
                "lastTransitionTime": "2026-05-01T11:50:00Z",
            },
        ],
    }
    cache = {"metadata": {"name": "orders", "namespace": "shop", "generation": 4}, "spec": spec, "status": status}
    services = [
        {"metadata": {"name": "orders-rw"}, "spec": {"selector": {ROLE: "primary"}}},
        {"metadata": {"name": "orders-ro"}, "spec": {"selector": {READABLE: "true"}}},
    ]
    event = {
        "metadata": {"name": "e1"},
        "type": "Normal",
        "reason": "SwitchedOver",
        "lastTimestamp": "2026-05-01T11:58:00Z",
        "involvedObject": {"kind": "Cache", "name": "orders"},
        "message": "planned switchover from orders-2",
    }
    pods = [pod(0, "replica", "old", readable=True), pod(1, "primary", "new"), pod(2, "replica", "new")]
    sts = {"status": {"updateRevision": "new"}}
    return CacheSnapshot(cache, pods, sts, services, [event])


def text() -> str:
    console = Console(file=io.StringIO(), width=220, color_system=None)
    console.print(render(snapshot(), NOW))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


def row(output: str, first: str) -> list[str]:
    for line in output.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] == first:
            return cells
    raise AssertionError(f"no row {first!r} in:\n{output}")


def test_the_report_shows_policy_pods_services_failovers_rollout_and_events() -> None:
    out = text()
    assert "Cache shop/orders" in out
    assert "Durable: append-only file" in out
    assert row(out, "Primary")[1] == "orders-1"
    assert "replicas within 2 s; now: orders-0" in out
    # pods: role, reads, template (current/outdated, leaving with the scale-down), state, node
    assert row(out, "orders-0")[1:] == ["replica", "yes", "outdated", "Running, ready", "node-a"]
    assert row(out, "orders-1")[1:] == ["primary", "no", "current", "Running, ready", "node-a"]
    assert row(out, "orders-2")[1:4] == ["replica", "no", "current, leaving"]
    # Services route per labels
    assert row(out, "orders-rw")[1] == "orders-1"
    assert row(out, "orders-ro")[1] == "orders-0"
    # failovers with their possible loss, newest last
    assert row(out, "30m0s ago")[1:4] == ["orders-0", "orders-2", "4.0 KiB"]
    assert row(out, "2m0s ago")[1:4] == ["orders-2", "orders-1", "0 B"]
    # the rollout is a condition; the switchover a Normal Event
    assert row(out, "Updating")[1:3] == ["True", "ReplacingPod"]
    assert "pending: orders-0; leaving: orders-2" in out
    assert re.search(r"Normal +Cache/orders +SwitchedOver", out)


def test_a_cache_the_operator_has_not_seen_yet_renders() -> None:
    bare = CacheSnapshot({"metadata": {"name": "new", "namespace": "shop"}, "spec": {"dataPolicy": "Regenerable"}})
    console = Console(file=io.StringIO(), width=160, color_system=None)
    console.print(render(bare, NOW))
    out = console.file.getvalue()  # type: ignore[attr-defined]
    assert "Regenerable: in memory only" in out
    assert "Failovers: none recorded" in out
    assert "Events: none recent" in out
