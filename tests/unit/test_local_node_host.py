"""The node host's pure parts: how N nodes are laid out, the partition rules, the chaos state's gates."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from kanri.local.node import NodeOptions, node_options
from kanri.local.node.chaos import Partition, ruleset
from kanri.local.node.containers import ContainerState, resume
from kanri.local.node.host import zone_name
from kanri.local.node.state import NodeState


def test_three_nodes_get_names_zones_slices_and_a_third_of_the_machine_each() -> None:
    nodes = node_options(NodeOptions(data_dir=Path("/h")), 3)
    assert [n.name for n in nodes] == ["kanri-1", "kanri-2", "kanri-3"]
    assert [n.zone for n in nodes] == ["zone-a", "zone-b", "zone-c"]
    assert [n.pod_slice for n in nodes] == ["10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"]
    assert [n.internal_ip for n in nodes] == ["10.244.1.1", "10.244.2.1", "10.244.3.1"]
    assert [n.data_dir for n in nodes] == [Path("/h/kanri-1"), Path("/h/kanri-2"), Path("/h/kanri-3")]
    assert {n.machine_share for n in nodes} == {3}
    assert {n.pod_cidr for n in nodes} == {"10.244.0.0/16"}  # one network: pods' routes cover every slice


def test_smaller_slices_follow_the_mask_size_and_leave_slice_zero_to_the_gateway() -> None:
    nodes = node_options(NodeOptions(data_dir=Path("/h"), node_cidr_mask_size=29), 2)
    assert [n.pod_slice for n in nodes] == ["10.244.0.8/29", "10.244.0.16/29"]
    assert [n.internal_ip for n in nodes] == ["10.244.0.9", "10.244.0.17"]
    with pytest.raises(ValueError, match="do not fit"):  # a /30 leaves a node no address for a pod
        node_options(NodeOptions(data_dir=Path("/h"), node_cidr_mask_size=30), 1)


def test_zone_names_go_on_past_z() -> None:
    assert [zone_name(i) for i in (0, 25, 26, 27)] == ["zone-a", "zone-z", "zone-aa", "zone-ab"]


def test_a_pod_cidr_too_small_for_the_slices_is_refused() -> None:
    with pytest.raises(ValueError, match="do not fit"):
        node_options(NodeOptions(data_dir=Path("/h"), pod_cidr="10.244.0.0/24"), 1)
    with pytest.raises(ValueError, match="do not fit"):
        node_options(NodeOptions(data_dir=Path("/h"), pod_cidr="10.244.0.0/23"), 2)


def test_no_partition_only_removes_the_tables() -> None:
    script = ruleset("kanri-chaos", [])
    assert script.splitlines() == [
        "table inet kanri-chaos",
        "delete table inet kanri-chaos",
        "table bridge kanri-chaos",
        "delete table bridge kanri-chaos",
    ]


def test_a_partition_cuts_the_slice_off_but_lets_the_node_itself_through() -> None:
    script = ruleset("t", [Partition("10.244.2.0/24", "10.244.2.1")])
    assert "ip saddr 10.244.2.0/24 ip daddr != 10.244.2.0/24 drop" in script  # to other pods
    assert "ip daddr 10.244.2.0/24 ip saddr != 10.244.2.0/24 drop" in script  # from other pods
    assert "ip saddr 10.244.2.0/24 ip daddr != 10.244.2.1 drop" in script  # to the host but the node's address
    assert "ip daddr 10.244.2.0/24 ip saddr != 10.244.2.1 drop" in script  # from the host but the node's probes
    assert script.count("table bridge t {") == 1
    assert script.count("table inet t {") == 1


async def test_the_gate_closes_for_any_condition_and_close_opens_it_for_good() -> None:
    state = NodeState()
    assert state.acting
    assert state.alive
    assert state.describe() == "Running"
    assert state.set("partitioned", True)
    assert not state.set("partitioned", True)  # idempotent
    assert not state.acting
    assert state.alive  # a partitioned machine still runs its containers
    state.set("frozen", True)
    assert not state.alive
    assert state.describe() == "Frozen,Partitioned"
    waiter = asyncio.ensure_future(state.active())
    await asyncio.sleep(0)
    assert not waiter.done()
    state.close()
    await asyncio.wait_for(waiter, 1)
    assert state.acting
    with pytest.raises(ValueError, match="unknown"):
        state.set("asleep", True)


def test_a_restarted_node_counts_one_more_restart_for_containers_that_had_run() -> None:
    ran = ContainerState("main", "img")
    never = ContainerState("side", "img")
    status = {
        "containerStatuses": [
            {"name": "main", "restartCount": 2, "state": {"running": {"startedAt": "2026-12-01T00:00:00Z"}}},
            {"name": "side", "restartCount": 0, "state": {"waiting": {"reason": "ImageNotMapped"}}},
        ]
    }
    resume([ran, never], status)
    assert ran.restart_count == 3
    assert ran.last_terminated == {"exitCode": 255, "reason": "Unknown", "startedAt": "2026-12-01T00:00:00Z"}
    assert ran.ever_started
    assert (never.restart_count, never.last_terminated, never.ever_started) == (0, None, False)
    fresh = ContainerState("main", "img")
    resume([fresh], None)  # a new pod
    assert (fresh.restart_count, fresh.last_terminated) == (0, None)
