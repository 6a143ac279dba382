"""kanri.kit per-object memory: keyed by uid, dropped when the object is gone."""

from __future__ import annotations

import pytest

from kanri.kit import ObjectMemory


def obj(name: str, uid: str, namespace: str = "ns") -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid}}


def test_each_object_has_its_own_memory_kept_between_passes() -> None:
    memory: ObjectMemory[dict[str, float]] = ObjectMemory(dict)
    memory.of(obj("a", "1"))["seen"] = 1.0
    assert memory.of(obj("a", "1")) == {"seen": 1.0}
    assert memory.of(obj("b", "2")) == {}


def test_an_object_recreated_under_the_same_name_starts_fresh() -> None:
    memory: ObjectMemory[dict[str, float]] = ObjectMemory(dict)
    memory.of(obj("a", "1"))["seen"] = 1.0
    assert memory.of(obj("a", "2")) == {}
    assert len(memory) == 1  # the old uid's memory went with it


def test_drop_forgets_an_object_that_is_gone() -> None:
    memory: ObjectMemory[list[int]] = ObjectMemory(list)
    memory.of(obj("a", "1")).append(1)
    memory.of(obj("a", "3", namespace="other"))  # same name, other namespace, other object
    assert memory.drop("ns", "a")
    assert not memory.drop("ns", "a")
    assert memory.get(obj("a", "1")) is None
    assert [key for key, _ in memory] == [("other", "a")]


def test_an_object_without_uid_is_refused() -> None:
    with pytest.raises(ValueError, match="uid"):
        ObjectMemory(list).of({"metadata": {"name": "a"}})
