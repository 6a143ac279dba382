"""Status conditions on raw dicts: metav1.Condition semantics, lastTransitionTime moves only on a status flip."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from kanri.runtime._conditions import format_time, get_condition, is_true, remove_condition, set_condition

T0 = datetime(2026, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)


def ready(
    conditions: list[dict[str, Any]],
    status: Any = "True",
    *,
    reason: str = "AllGood",
    message: str = "ok",
    generation: int | None = 1,
    now: datetime = T0,
) -> bool:
    return set_condition(
        conditions, type="Ready", status=status, reason=reason, message=message, observed_generation=generation, now=now
    )


def test_new_condition_is_appended_with_now_as_transition_time_in_rfc3339_seconds_utc() -> None:
    conditions: list[dict[str, Any]] = []
    assert ready(conditions) is True
    assert conditions == [
        {
            "type": "Ready",
            "status": "True",
            "observedGeneration": 1,
            "lastTransitionTime": "2026-05-01T12:00:00Z",
            "reason": "AllGood",
            "message": "ok",
        }
    ]


def test_setting_the_same_condition_again_changes_nothing() -> None:
    conditions: list[dict[str, Any]] = []
    ready(conditions)
    snapshot = [dict(c) for c in conditions]
    assert ready(conditions, now=T1) is False
    assert conditions == snapshot


def test_status_flip_moves_last_transition_time() -> None:
    conditions: list[dict[str, Any]] = []
    ready(conditions)
    assert ready(conditions, "False", reason="Degraded", now=T1) is True
    assert conditions[0]["status"] == "False"
    assert conditions[0]["lastTransitionTime"] == "2026-05-01T12:05:00Z"


@pytest.mark.parametrize(
    ("change", "field", "value"),
    [
        ({"reason": "StillGood"}, "reason", "StillGood"),
        ({"message": "still ok"}, "message", "still ok"),
        ({"generation": 2}, "observedGeneration", 2),
    ],
    ids=["reason", "message", "observed-generation"],
)
def test_reason_message_or_generation_update_keeps_last_transition_time(
    change: dict[str, Any], field: str, value: object
) -> None:
    conditions: list[dict[str, Any]] = []
    ready(conditions)
    assert ready(conditions, now=T1, **change) is True
    assert conditions[0][field] == value
    assert conditions[0]["lastTransitionTime"] == "2026-05-01T12:00:00Z"


def test_other_conditions_are_left_alone_and_order_is_kept() -> None:
    conditions: list[dict[str, Any]] = []
    set_condition(
        conditions, type="Progressing", status="Unknown", reason="Starting", message="", observed_generation=1, now=T0
    )
    ready(conditions)
    ready(conditions, "False", reason="Down", now=T1)
    assert [c["type"] for c in conditions] == ["Progressing", "Ready"]
    assert conditions[0]["status"] == "Unknown"


def test_bool_status_is_accepted_as_true_or_false() -> None:
    conditions: list[dict[str, Any]] = []
    ready(conditions, status=False)
    assert conditions[0]["status"] == "False"
    ready(conditions, status=True)
    assert is_true(conditions, "Ready")


def test_observed_generation_none_leaves_the_field_out() -> None:
    conditions: list[dict[str, Any]] = []
    ready(conditions, generation=None)
    assert "observedGeneration" not in conditions[0]
    ready(conditions, generation=3)
    assert ready(conditions, generation=None) is True
    assert "observedGeneration" not in conditions[0]


def test_times_are_converted_to_utc_and_naive_times_are_refused() -> None:
    tokyo = timezone(timedelta(hours=9))
    assert format_time(datetime(2026, 5, 1, 21, 0, 0, 999999, tzinfo=tokyo)) == "2026-05-01T12:00:00Z"
    with pytest.raises(ValueError, match="timezone-aware"):
        ready([], now=datetime(2026, 5, 1))  # a naive time: the point of the test


@pytest.mark.parametrize(
    ("field", "value"),
    [("status", "true"), ("reason", ""), ("reason", "has spaces"), ("type", "not a type!")],
)
def test_values_the_api_server_would_refuse_raise_early(field: str, value: str) -> None:
    arguments: dict[str, Any] = {"type": "Ready", "status": "True", "reason": "Fine", "message": ""}
    arguments[field] = value
    with pytest.raises(ValueError, match=field):
        set_condition([], **arguments, observed_generation=None, now=T0)


def test_get_and_is_true_tolerate_missing_lists() -> None:
    assert get_condition(None, "Ready") is None
    assert is_true(None, "Ready") is False
    conditions: list[dict[str, Any]] = []
    ready(conditions, "Unknown", reason="Checking")
    assert get_condition(conditions, "Ready") is conditions[0]
    assert is_true(conditions, "Ready") is False


def test_remove_condition_reports_whether_it_was_there() -> None:
    conditions: list[dict[str, Any]] = []
    ready(conditions)
    assert remove_condition(conditions, "Missing") is False
    assert remove_condition(conditions, "Ready") is True
    assert conditions == []
