"""The reconciler's memory between passes (failover, restarts) is per cluster uid and goes with the cluster (issue 25:
the dicts it replaced were keyed by name and never cleared)."""

from __future__ import annotations

from typing import Any

from kanri.postgres.cluster.reconciler import PostgresClusterReconciler
from kanri.runtime import Request


class EmptyCache:
    """A cache that holds no PostgresCluster: the cluster was deleted."""

    def get(self, kind: Any, name: str, namespace: str | None = None) -> None:
        return None


def cluster(uid: str) -> dict[str, Any]:
    return {"metadata": {"name": "orders", "namespace": "shop", "uid": uid}}


async def test_a_deleted_clusters_memory_is_dropped_by_the_reconcile_that_finds_it_gone() -> None:
    reconciler = PostgresClusterReconciler(EmptyCache(), None, instances=None, events=object())  # type: ignore[arg-type]
    reconciler.ha.of(cluster("u1")).suspect = ("orders-1", 3.0)
    reconciler.restarts.of(cluster("u1")).requested["orders-2"] = 4.0
    reconciler.ha.of({"metadata": {"name": "billing", "namespace": "shop", "uid": "u2"}})
    assert await reconciler.reconcile(Request("shop", "orders")) is None
    assert len(reconciler.ha) == 1  # billing's stays
    assert len(reconciler.restarts) == 0
    assert reconciler.ha.of(cluster("u1")).suspect is None


def test_a_cluster_recreated_under_its_name_starts_with_no_memory() -> None:
    reconciler = PostgresClusterReconciler(EmptyCache(), None, instances=None, events=object())  # type: ignore[arg-type]
    reconciler.ha.of(cluster("u1")).primary_seen = ("orders-1", "0/3000000", 1, 5.0)
    assert reconciler.ha.of(cluster("u2")).primary_seen is None
    assert len(reconciler.ha) == 1
