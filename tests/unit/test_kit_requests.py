"""kanri.kit requests and approvals: an annotation in, an acknowledgement in status, idempotent."""

from __future__ import annotations

from typing import Any

from kanri.kit import approved, pending

ANNOTATION = "example.kanri.dev/rotate-key"


def store(annotation: str | None, handled: str | None = None) -> dict[str, Any]:
    annotations = {ANNOTATION: annotation} if annotation is not None else {}
    status: dict[str, Any] = {}
    if handled is not None:
        status["requests"] = {"rotate-key": {"value": handled, "result": "Done", "time": "2026-12-06T07:00:00Z"}}
    return {"metadata": {"name": "s", "annotations": annotations}, "status": status}


def test_a_new_value_is_a_pending_request() -> None:
    assert pending(store("2026-12-06T07:00"), ANNOTATION, "rotate-key") == "2026-12-06T07:00"


def test_a_value_already_acknowledged_is_not_pending_again() -> None:
    assert pending(store("one", handled="one"), ANNOTATION, "rotate-key") is None
    assert pending(store("two", handled="one"), ANNOTATION, "rotate-key") == "two"


def test_no_annotation_or_an_empty_one_asks_nothing() -> None:
    assert pending(store(None), ANNOTATION, "rotate-key") is None
    assert pending(store("  "), ANNOTATION, "rotate-key") is None


def test_an_approval_approves_exactly_what_it_names() -> None:
    obj = {"metadata": {"annotations": {"example.kanri.dev/approve-removal": "keys a,b"}}}
    assert approved(obj, "example.kanri.dev/approve-removal", "keys a,b")
    assert not approved(obj, "example.kanri.dev/approve-removal", "keys a,b,c")  # an older plan approves nothing new
    assert not approved(obj, "example.kanri.dev/approve-removal", "")
