"""kanri.kit child diffs and merge patches: what decides whether a write is sent at all."""

from __future__ import annotations

from kanri.kit import is_subset, merge_patch, needs_apply, with_hash
from kanri.kit._ledger import field_patches

HASH = "example.kanri.dev/applied-hash"


def test_a_child_as_applied_needs_no_write() -> None:
    desired = with_hash({"metadata": {"name": "a"}, "data": {"k": "v"}}, HASH)
    current = {"metadata": {"name": "a", "uid": "u", "annotations": dict(desired["metadata"]["annotations"])},
               "data": {"k": "v"}}  # fmt: skip
    assert not needs_apply(desired, current, HASH)


def test_a_field_no_longer_set_changes_the_hash() -> None:
    old = with_hash({"metadata": {"name": "a"}, "data": {"k": "v", "gone": "x"}}, HASH)
    new = with_hash({"metadata": {"name": "a"}, "data": {"k": "v"}}, HASH)
    assert is_subset({"data": {"k": "v"}}, old)  # a subset check alone would miss it
    assert needs_apply(new, old, HASH)


def test_a_field_someone_else_changed_needs_a_write() -> None:
    desired = with_hash({"metadata": {"name": "a"}, "data": {"k": "v"}}, HASH)
    current = {"metadata": {"name": "a", "annotations": dict(desired["metadata"]["annotations"])}, "data": {"k": "w"}}
    assert needs_apply(desired, current, HASH)
    assert needs_apply(desired, None, HASH)


def test_quantities_compare_by_value() -> None:
    assert is_subset({"limits": {"cpu": "1000m"}}, {"limits": {"cpu": "1"}})
    assert not is_subset({"limits": {"cpu": "500m"}}, {"limits": {"cpu": "1"}})
    assert not is_subset({"name": "1000m"}, {"name": "1"})  # elsewhere, text is text


def test_merge_patch_removes_what_the_new_record_lacks() -> None:
    old = {"phase": "Running", "step": "Copy", "inputs": {"a": 1, "b": 2}, "list": [1, 2]}
    new = {"phase": "Done", "inputs": {"a": 1}, "list": [1]}
    assert merge_patch(old, new) == {"phase": "Done", "step": None, "inputs": {"b": None}, "list": [1]}
    assert merge_patch(old, old) == {}
    assert merge_patch(None, {"a": 1}) == {"a": 1}
    assert merge_patch({"a": 1}, None) is None


def test_staged_fields_are_sent_as_patches_of_what_differs() -> None:
    status = {"keys": 2, "record": {"phase": "Copy", "step": 3}, "gone": "x"}
    staged = {"keys": 2, "record": {"phase": "Done"}, "gone": None, "absent": None, "new": {"a": 1}}
    assert field_patches(status, staged) == {"record": {"phase": "Done", "step": None}, "gone": None, "new": {"a": 1}}
    assert field_patches(status, {"keys": 2}) == {}
