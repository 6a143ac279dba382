"""The event-filtering rule: a watch event that only reports a reconcile's own write (same resourceVersion, and no
change beyond what that write sent) queues nothing; every change by anyone else queues the key."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest

from kanri.runtime._client import Write
from kanri.runtime._echo import Echoes, only_this_write
from kanri.runtime._informer import Event
from kanri.runtime._kinds import CONFIG_MAP, Kind
from kanri.runtime._queue import Request

Obj = dict[str, Any]
GREETING = Kind("example.kanri.dev/v1", "Greeting", "greetings")
KEY = Request("ns", "g")


def greeting(rv: str, **status: Any) -> Obj:
    obj: Obj = {
        "apiVersion": GREETING.api_version,
        "kind": "Greeting",
        "metadata": {
            "name": "g",
            "namespace": "ns",
            "uid": "u1",
            "resourceVersion": rv,
            "generation": 1,
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "managedFields": [{"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:spec": {}}}],
        },
        "spec": {"message": "hi"},
    }
    if status:
        obj["status"] = status
        obj["metadata"]["managedFields"].append(
            {"manager": "kanri", "operation": "Update", "subresource": "status", "time": f"t{rv}"}
        )
    return obj


READY = {"observedGeneration": 1, "conditions": [{"type": "Ready", "status": "True"}]}


def status_write(rv: str, body: Obj | None = None) -> Write:
    sent = orjson.dumps(body if body is not None else {"status": READY})
    return Write(GREETING, "ns", "g", "u1", rv, sent, manager="kanri", operation="Update", subresource="status")


def modified(old: Obj, new: Obj, kind: str = "MODIFIED") -> Event:
    return Event(kind, new, old)  # type: ignore[arg-type]


def test_our_status_write_alone_is_an_echo() -> None:
    assert only_this_write(status_write("11"), greeting("10"), greeting("11", **READY))


def test_a_different_resource_version_is_not_our_write() -> None:
    assert not only_this_write(status_write("12"), greeting("10"), greeting("11", **READY))


def test_a_no_op_write_that_returned_someone_elses_spec_change_is_not_an_echo() -> None:
    # Our status patch changed nothing (the status was already so) and returned the object as a user's spec edit had
    # just left it: the same resourceVersion as the user's event, which must still queue the key.
    before = greeting("10", **READY)
    after = copy.deepcopy(before)
    after["metadata"]["resourceVersion"] = "11"
    after["metadata"]["generation"] = 2
    after["spec"]["message"] = "changed by a user"
    assert not only_this_write(status_write("11"), before, after)


def test_a_change_to_a_field_we_sent_with_another_value_is_not_an_echo() -> None:
    after = greeting("11", observedGeneration=1, conditions=[{"type": "Ready", "status": "False"}])
    assert not only_this_write(status_write("11"), greeting("10"), after)


def test_another_managers_managed_fields_moving_is_not_an_echo() -> None:
    after = greeting("11", **READY)
    after["metadata"]["managedFields"].append({"manager": "someone", "operation": "Apply"})
    assert not only_this_write(status_write("11"), greeting("10"), after)


def test_a_label_added_by_someone_else_alongside_is_not_an_echo() -> None:
    after = greeting("11", **READY)
    after["metadata"]["labels"] = {"team": "x"}
    assert not only_this_write(status_write("11"), greeting("10"), after)


def test_a_merge_patch_null_removing_a_field_is_covered() -> None:
    before = greeting("10", **READY, phase="Old")
    after = greeting("11", **READY)
    after["metadata"]["managedFields"] = before["metadata"]["managedFields"]
    assert only_this_write(status_write("11", {"status": {"phase": None}}), before, after)


def test_a_json_patch_is_never_taken_for_an_echo() -> None:
    write = Write(GREETING, "ns", "g", "u1", "11", orjson.dumps([{"op": "add", "path": "/status", "value": READY}]),
                  manager="kanri", operation="Update", subresource="status")  # fmt: skip
    assert not only_this_write(write, greeting("10"), greeting("11", **READY))


def config_map(rv: str, data: Obj, manager: str = "greeting-operator") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "g-greeting",
            "namespace": "ns",
            "uid": "c1",
            "resourceVersion": rv,
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "ownerReferences": [{"kind": "Greeting", "name": "g", "uid": "u1", "controller": True}],
            "managedFields": [{"manager": manager, "operation": "Apply", "fieldsV1": {"f:data": {}}}],
        },
        "data": data,
    }


APPLIED = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {
        "name": "g-greeting",
        "namespace": "ns",
        "ownerReferences": [{"kind": "Greeting", "name": "g", "uid": "u1", "controller": True}],
    },
    "data": {"message": "hi"},
}


def apply_write(rv: str) -> Write:
    return Write(CONFIG_MAP, "ns", "g-greeting", "c1", rv, orjson.dumps(APPLIED), "greeting-operator", "Apply")


def test_a_child_we_created_by_server_side_apply_is_an_echo() -> None:
    assert only_this_write(apply_write("20"), None, config_map("20", {"message": "hi"}))


def test_a_child_someone_else_created_is_not_an_echo_even_when_our_apply_returned_it() -> None:
    assert not only_this_write(apply_write("20"), None, config_map("20", {"message": "hi"}, manager="kubectl"))


def test_server_defaults_we_did_not_send_make_it_not_an_echo() -> None:
    created = config_map("20", {"message": "hi"})
    created["immutable"] = False
    assert not only_this_write(apply_write("20"), None, created)


# --- the bookkeeping: echoes expected after a reconcile, and events held back while it runs ---------------------


def test_an_echo_arriving_after_the_reconcile_queues_nothing_and_is_settled() -> None:
    echoes = Echoes()
    echoes.start(KEY).append(status_write("11"))
    assert echoes.finish(KEY, lambda w: "10") is False
    assert len(echoes) == 1
    assert echoes.to_queue(GREETING, modified(greeting("10"), greeting("11", **READY)), [KEY]) == []
    assert len(echoes) == 0
    # The same version again (it cannot happen on one watch, but a second look must not reuse the record).
    assert echoes.to_queue(GREETING, modified(greeting("10"), greeting("11", **READY)), [KEY]) == [KEY]


def test_an_echo_arriving_while_the_reconcile_runs_is_held_and_then_dropped() -> None:
    echoes = Echoes()
    writes = echoes.start(KEY)
    assert echoes.to_queue(GREETING, modified(greeting("10"), greeting("11", **READY)), [KEY]) == []
    writes.append(status_write("11"))  # the response comes after the event
    assert echoes.finish(KEY, lambda w: "11") is False
    assert len(echoes) == 0


def test_someone_elses_change_held_back_during_the_reconcile_queues_the_key_when_it_ends() -> None:
    echoes = Echoes()
    writes = echoes.start(KEY)
    edited = greeting("11")
    edited["spec"]["message"] = "edited"
    assert echoes.to_queue(GREETING, modified(greeting("10"), edited), [KEY]) == []
    writes.append(status_write("12"))
    assert echoes.finish(KEY, lambda w: "11") is True


def test_an_echo_is_only_for_the_key_whose_reconcile_wrote_it() -> None:
    echoes = Echoes()
    echoes.start(KEY).append(apply_write("20"))
    echoes.finish(KEY, lambda w: "")
    other = Request("ns", "other")
    event = modified(None, config_map("20", {"message": "hi"}), "ADDED")  # type: ignore[arg-type]
    assert echoes.to_queue(CONFIG_MAP, event, [other, KEY]) == [other]


@pytest.mark.parametrize(("delivered", "expected"), [("11", 0), ("12", 0), (None, 0), ("10", 1), ("", 1)])
def test_a_write_whose_event_was_already_delivered_or_never_will_be_is_not_expected(
    delivered: str | None, expected: int
) -> None:
    echoes = Echoes()
    echoes.start(KEY).append(status_write("11"))
    echoes.finish(KEY, lambda w: delivered)
    assert len(echoes) == expected


def test_a_later_event_settles_an_expected_echo_that_never_came() -> None:
    echoes = Echoes()
    echoes.start(KEY).append(status_write("11"))
    echoes.finish(KEY, lambda w: "10")
    later = greeting("13", **READY)
    assert echoes.to_queue(GREETING, modified(greeting("12"), later), [KEY]) == [KEY]
    assert len(echoes) == 0
