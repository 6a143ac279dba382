"""The informer's store keeps its indexes exact through updates that move an object's labels or owners, and through
the far more common ones that do not."""

from __future__ import annotations

from typing import Any

from kanri.runtime._store import Store


def obj(name: str, labels: dict[str, str] | None = None, owners: tuple[str, ...] = (), rv: str = "1") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "resourceVersion": rv, "labels": labels or {}}
    meta["ownerReferences"] = [{"uid": uid} for uid in owners]
    return {"metadata": meta}


def names(objects: list[dict[str, Any]]) -> list[str]:
    return [o["metadata"]["name"] for o in objects]


def test_an_update_that_moves_labels_and_owners_moves_the_index_entries() -> None:
    store = Store()
    store.upsert(obj("a", {"app": "x", "tier": "db"}, ("u1",)))
    store.upsert(obj("b", {"app": "x"}, ("u1",)))
    store.upsert(obj("a", {"app": "y", "tier": "db"}, ("u2",), rv="2"))
    assert names(store.list("ns", {"app": "x"})) == ["b"]
    assert names(store.list("ns", {"app": "y", "tier": "db"})) == ["a"]
    assert names(store.owned_by("u1")) == ["b"]
    assert names(store.owned_by("u2")) == ["a"]
    assert store._indexes["label"].get("app=x") == {("ns", "b")}


def test_an_update_that_keeps_labels_and_owners_replaces_the_object_and_keeps_the_indexes() -> None:
    store = Store()
    store.upsert(obj("a", {"app": "x"}, ("u1",)))
    newer = obj("a", {"app": "x"}, ("u1",), rv="2")
    assert store.upsert(newer) is not None
    assert store.list("ns", {"app": "x"}) == [newer]
    assert store.owned_by("u1") == [newer]


def test_removing_an_object_empties_its_index_entries() -> None:
    store = Store()
    store.upsert(obj("a", {"app": "x"}, ("u1",)))
    store.remove(("ns", "a"))
    assert store.list("ns") == []
    assert all(not index for index in store._indexes.values())
