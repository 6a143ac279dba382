"""Owner references say exactly who controls a child, and child names are deterministic, valid and collision-free."""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kanri.runtime._ownership import (
    AlreadyOwnedError,
    child_name,
    controller_of,
    is_controlled_by,
    owner_reference,
    set_owner,
)

Obj = dict[str, Any]
LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def cluster(name: str = "db", uid: str = "uid-1", api_version: str = "kanri.dev/v1alpha1") -> Obj:
    return {
        "apiVersion": api_version,
        "kind": "PostgresCluster",
        "metadata": {"name": name, "namespace": "ns", "uid": uid},
    }


def service(*refs: Obj) -> Obj:
    meta: Obj = {"name": "db-rw", "namespace": "ns"}
    if refs:
        meta["ownerReferences"] = list(refs)
    return {"apiVersion": "v1", "kind": "Service", "metadata": meta}


def test_owner_reference_points_at_the_owner_by_uid() -> None:
    assert owner_reference(cluster()) == {
        "apiVersion": "kanri.dev/v1alpha1",
        "kind": "PostgresCluster",
        "name": "db",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    plain = owner_reference(cluster(), controller=False, block_owner_deletion=False)
    assert plain["controller"] is False
    assert plain["blockOwnerDeletion"] is False


def test_owner_reference_needs_an_owner_read_from_the_api() -> None:
    unsaved = cluster()
    del unsaved["metadata"]["uid"]
    with pytest.raises(ValueError, match="uid"):
        owner_reference(unsaved)


def test_set_owner_adds_our_reference_and_keeps_others() -> None:
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "anchor", "uid": "uid-9"}
    child = service(other)
    assert set_owner(child, cluster()) is child
    assert child["metadata"]["ownerReferences"] == [other, owner_reference(cluster())]


def test_set_owner_is_idempotent() -> None:
    child = set_owner(service(), cluster())
    set_owner(child, cluster())
    assert child["metadata"]["ownerReferences"] == [owner_reference(cluster())]


def test_set_owner_replaces_the_reference_to_a_recreated_owner_of_the_same_name() -> None:
    child = set_owner(service(), cluster(uid="old"))
    set_owner(child, cluster(uid="new", api_version="kanri.dev/v1"))
    assert [ref["uid"] for ref in child["metadata"]["ownerReferences"]] == ["new"]


def test_set_owner_refuses_to_take_over_a_child_controlled_by_another_owner() -> None:
    child = set_owner(service(), cluster(name="other", uid="uid-2"))
    with pytest.raises(AlreadyOwnedError, match="other"):
        set_owner(child, cluster())
    # A non-controller reference may still be added next to it.
    set_owner(child, cluster(), controller=False)
    assert len(child["metadata"]["ownerReferences"]) == 2


def test_set_owner_refuses_cross_namespace_references() -> None:
    child = service()
    child["metadata"]["namespace"] = "elsewhere"
    with pytest.raises(ValueError, match="cross-namespace"):
        set_owner(child, cluster())


def test_controller_of_and_is_controlled_by() -> None:
    bystander = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "uid-9"}
    assert controller_of(service(bystander)) is None
    child = set_owner(service(bystander), cluster())
    assert controller_of(child) == owner_reference(cluster())
    assert is_controlled_by(child, cluster())
    # Same name, different uid: a new object that merely reuses the name does not control the old child.
    assert not is_controlled_by(child, cluster(uid="uid-2"))
    assert not is_controlled_by(service(), cluster())


def test_child_name_is_owner_dash_suffix_when_that_is_a_valid_label() -> None:
    assert child_name("db", "rw") == "db-rw"
    assert child_name("db") == "db"
    assert child_name("a" * 60, "rw") == "a" * 60 + "-rw"  # exactly 63


def test_child_name_shortens_long_names_with_a_stable_hash_and_keeps_the_suffix() -> None:
    long_owner = "a-very-long-postgres-cluster-name-that-someone-typed-in-a-hurry-for-prod"
    name = child_name(long_owner, "rw")
    assert len(name) <= 63
    assert LABEL.fullmatch(name)
    assert name == child_name(long_owner, "rw")
    assert name.startswith("a-very-long-postgres")
    assert re.search(r"-rw-[0-9a-f]{10}$", name)


def test_child_name_makes_subdomain_names_valid_labels() -> None:
    name = child_name("my.db", "rw")
    assert LABEL.fullmatch(name)
    assert name != child_name("my-db", "rw")


def test_child_name_honours_max_len() -> None:
    name = child_name("x" * 300, "backup", max_len=253)
    assert len(name) == 253
    assert LABEL.fullmatch(name)
    with pytest.raises(ValueError, match="max_len"):
        child_name("db", "rw", max_len=5)


owners = st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,120}[a-z0-9])?", fullmatch=True)
suffixes = st.from_regex(r"([a-z0-9]([-a-z0-9]{0,80}[a-z0-9])?)?", fullmatch=True)


@given(owners, suffixes, st.integers(min_value=12, max_value=100))
def test_child_name_is_always_a_label_within_max_len(owner: str, suffix: str, max_len: int) -> None:
    name = child_name(owner, suffix, max_len)
    assert len(name) <= max_len
    assert LABEL.fullmatch(name), name


long_owners = st.from_regex(r"[a-z0-9][-a-z0-9.]{62,120}[a-z0-9]", fullmatch=True)


@settings(max_examples=50)
@given(long_owners, suffixes, long_owners, suffixes)
def test_different_long_inputs_get_different_names(o1: str, s1: str, o2: str, s2: str) -> None:
    if (o1, s1) != (o2, s2):
        assert child_name(o1, s1) != child_name(o2, s2)


def test_child_names_never_change_across_releases() -> None:
    # A changed name would orphan every existing child: pin one hashed name.
    owner = "a-very-long-postgres-cluster-name-that-someone-typed-in-a-hurry-for-prod"
    assert child_name(owner, "rw") == "a-very-long-postgres-cluster-name-that-someone-ty-rw-325d1e94b6"
