"""Quantity math of the local node: what pods request, and what the machine offers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

from kanri.local.node.node import capacity, ready_conditions
from kanri.local.node.resources import insufficient, memory_total_kib, pod_requests, sum_requests

Obj = dict[str, Any]


def container(cpu: str | None = None, memory: str | None = None, **extra: Any) -> Obj:
    requests = {k: v for k, v in (("cpu", cpu), ("memory", memory)) if v is not None}
    return {"name": "c", "resources": {"requests": requests}, **extra}


def pod(containers: list[Obj], init: list[Obj] | None = None, **spec: Any) -> Obj:
    return {"spec": {"containers": containers, "initContainers": init or [], **spec}}


def test_app_containers_add_up_in_exact_units() -> None:
    requests = pod_requests(pod([container("250m", "64Mi"), container("0.5", "1Gi")]))
    assert requests == {"cpu": Decimal("0.75"), "memory": Decimal(64 * 2**20 + 2**30)}


def test_an_init_container_only_counts_when_it_alone_asks_for_more() -> None:
    assert pod_requests(pod([container("1")], [container("500m")])) == {"cpu": Decimal(1)}
    assert pod_requests(pod([container("1")], [container("2")])) == {"cpu": Decimal(2)}


def test_sidecars_run_alongside_and_add_to_later_init_containers() -> None:
    sidecar = container("300m", restartPolicy="Always")
    # running: 1 + 0.3; the init container after the sidecar runs next to it: 1.2 + 0.3 = 1.5
    assert pod_requests(pod([container("1")], [sidecar, container("1.2")])) == {"cpu": Decimal("1.5")}
    assert pod_requests(pod([container("1")], [container("1.2"), sidecar])) == {"cpu": Decimal("1.3")}


def test_pod_level_requests_and_overhead() -> None:
    spec: Obj = {"resources": {"requests": {"cpu": "2"}}, "overhead": {"memory": "10Mi"}}
    assert pod_requests(pod([container("1", "1Mi")], **spec)) == {"cpu": Decimal(2), "memory": Decimal(11 * 2**20)}


def test_sums_and_shortages() -> None:
    used = sum_requests([pod([container("1")]), pod([container("1500m", "1Gi")])])
    assert used == {"cpu": Decimal("2.5"), "memory": Decimal(2**30)}
    allocatable = {"cpu": Decimal(3), "memory": Decimal(2**31)}
    assert insufficient({"cpu": Decimal("0.5"), "memory": Decimal(2**30)}, allocatable, used) == []
    assert insufficient({"cpu": Decimal("0.6"), "memory": Decimal(2**30 + 1)}, allocatable, used) == ["cpu", "memory"]
    assert insufficient({"cpu": Decimal(0), "example.com/dongle": Decimal(0)}, allocatable, used) == []


def test_capacity_from_the_machine() -> None:
    meminfo = "MemTotal:       16315424 kB\nMemFree:         1000 kB\n"
    assert memory_total_kib(meminfo) == 16315424
    assert capacity(110, cpus=8, meminfo=meminfo) == {"cpu": "8000m", "memory": "16315424Ki", "pods": "110"}
    assert capacity(110, share=3, cpus=2, meminfo=meminfo) == {"cpu": "666m", "memory": "5438474Ki", "pods": "110"}


def test_heartbeats_refresh_without_moving_the_transition_time() -> None:
    first = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
    conditions = ready_conditions([], first)
    later = ready_conditions(conditions, first + timedelta(seconds=10))
    ready = next(c for c in later if c["type"] == "Ready")
    assert (ready["status"], ready["lastHeartbeatTime"], ready["lastTransitionTime"]) == (
        "True",
        "2026-05-01T12:00:10Z",
        "2026-05-01T12:00:00Z",
    )
    assert {c["type"]: c["status"] for c in later} == {
        "Ready": "True",
        "MemoryPressure": "False",
        "DiskPressure": "False",
        "PIDPressure": "False",
    }
    # Back from the Unknown the node-lifecycle controller wrote while we were away: the transition moves.
    ready["status"] = "Unknown"
    revived = next(c for c in ready_conditions(later, first + timedelta(minutes=5)) if c["type"] == "Ready")
    assert (revived["status"], revived["lastTransitionTime"]) == ("True", "2026-05-01T12:05:00Z")
