"""kanri.kit step outcomes: requeue requests merge, the soonest wins."""

from __future__ import annotations

from kanri.kit import soonest
from kanri.runtime import Result


def test_the_soonest_requeue_wins() -> None:
    assert soonest(Result(requeue_after=10), None, Result(requeue_after=2)) == Result(requeue_after=2)


def test_nothing_asked_is_no_requeue() -> None:
    assert soonest() is None
    assert soonest(None, Result()) is None
