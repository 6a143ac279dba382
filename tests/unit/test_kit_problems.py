"""kanri.kit problems: Degraded from the most serious first; an Event only for a problem not told before."""

from __future__ import annotations

from kanri.kit import Problem, Problems, child_conflict, child_rejected
from kanri.runtime import ApiError


def test_degraded_names_the_most_serious_reason_and_every_message() -> None:
    problems = Problems(severity=("SplitBrain", "ChildRejected"))
    problems.add(Problem("Unknown", "u"))
    problems.add(Problem("ChildRejected", "c"))
    problems.add(Problem("SplitBrain", "s"))
    problems.add(Problem("SplitBrain", "s"))  # a repeat is one problem
    assert problems.condition() == {"type": "Degraded", "status": True, "reason": "SplitBrain", "message": "s; c; u"}
    assert len(problems) == 3


def test_no_problem_is_degraded_false() -> None:
    assert Problems().condition()["status"] is False
    assert not Problems()


def test_only_problems_the_previous_degraded_message_did_not_name_are_new() -> None:
    problems = Problems()
    problems.extend([Problem("A", "first thing"), Problem("B", "second thing")])
    before = {"conditions": [{"type": "Degraded", "status": "True", "reason": "A", "message": "first thing"}]}
    assert [p.reason for p in problems.new_since(before)] == ["B"]
    # once Degraded went False, a problem coming back is new again
    cleared = {
        "conditions": [{"type": "Degraded", "status": "False", "reason": "AsExpected", "message": "first thing"}]
    }
    assert [p.reason for p in problems.new_since(cleared)] == ["A", "B"]


def test_child_problems_say_what_and_why() -> None:
    refused = ApiError(422, {"reason": "Invalid", "message": "spec.x:\n  must be positive"})
    assert child_rejected("ConfigMap", "a", refused).message == (
        "the API server refused ConfigMap a (422): spec.x: must be positive"
    )
    assert child_conflict("Secret", "a-key", "Greeting g").reason == "ChildConflict"
