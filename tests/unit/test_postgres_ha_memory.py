"""The failover step's memory between passes is per cluster uid and goes with the cluster (issue 25)."""

from __future__ import annotations

from typing import Any

from kanri.postgres.ha.memory import HaMemory


def cluster(name: str, uid: str, namespace: str = "shop") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid}}


def test_the_same_cluster_gets_the_same_memory_on_every_pass() -> None:
    memory = HaMemory()
    memory.of(cluster("orders", "u1")).suspect = ("orders-1", 12.0)
    assert memory.of(cluster("orders", "u1")).suspect == ("orders-1", 12.0)
    assert memory.of(cluster("orders", "u3", namespace="other")).suspect is None
    assert memory.of(cluster("billing", "u2")).suspect is None


def test_a_cluster_recreated_under_the_same_name_starts_with_nothing() -> None:
    memory = HaMemory()
    memory.of(cluster("orders", "u1")).primary_seen = ("orders-1", "0/3000000", 1, 5.0)
    assert memory.of(cluster("orders", "u2")).primary_seen is None
    assert len(memory) == 1  # the old uid's memory was dropped, not kept beside the new one


def test_a_cluster_gone_is_forgotten() -> None:
    memory = HaMemory()
    memory.of(cluster("orders", "u1")).rejoin_requests["orders-2"] = 3.0
    memory.forget("shop", "orders")
    memory.forget("shop", "never-seen")  # nothing to drop: no error
    assert len(memory) == 0
    assert memory.of(cluster("orders", "u1")).rejoin_requests == {}
