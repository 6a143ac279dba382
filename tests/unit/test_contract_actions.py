"""kanri.contract.actions: the action answers instances send keep the keys (and their order) they always had, and
the operator's side reads only an answer that says the action was done."""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from kanri.contract.actions import (
    BackupRequest,
    Demoted,
    Fenced,
    FenceRequest,
    Paused,
    Promoted,
    RejoinAccepted,
    Restarted,
    Resumed,
    Unfenced,
)

# The answers as instance managers sent them before the contract (kanri.instance.manager at 0ec1969).
BEFORE: list[tuple[Any, dict[str, Any]]] = [
    (Promoted(timeline=2, lsn="0/5000148"), {"promoted": True, "timeline": 2, "lsn": "0/5000148"}),
    (Demoted(checkpoint_lsn="0/6000028", timeline=1), {"demoted": True, "checkpointLsn": "0/6000028", "timeline": 1}),
    (Paused(receive_lsn="0/7001F28", replay_lsn="0/7001F00", timeline=None),
     {"paused": True, "receiveLsn": "0/7001F28", "replayLsn": "0/7001F00", "timeline": None}),
    (Resumed(resumed=False), {"paused": False, "resumed": False}),
    (Fenced(since="2026-12-06T06:00:00+00:00", reason="split brain", already=True, stopped=False),
     {"fenced": True, "since": "2026-12-06T06:00:00+00:00", "reason": "split brain", "already": True,
      "stopped": False}),
    (Unfenced(lifted=True), {"fenced": False, "lifted": True}),
    (Restarted(pending_restart=False), {"restarted": True, "pendingRestart": False}),
    (RejoinAccepted(rejoin="started"), {"rejoin": "started"}),
]  # fmt: skip


@pytest.mark.parametrize(("answer", "sent"), BEFORE, ids=[type(a).__name__ for a, _ in BEFORE])
def test_an_answer_is_sent_as_it_was_before_the_contract_and_read_back(answer: Any, sent: dict[str, Any]) -> None:
    assert json.dumps(answer.as_json()) == json.dumps(sent)
    assert type(answer).read(sent) == answer


def test_an_answer_that_does_not_say_the_action_was_done_is_none() -> None:
    assert Promoted.read({"promoted": False, "timeline": 2}) is None
    assert Promoted.read({"timeline": 2}) is None
    assert Paused.read({"paused": "yes"}) is None
    assert Demoted.read(["demoted"]) is None
    assert Unfenced.read({"fenced": True}) is None
    assert RejoinAccepted.read({"rejoin": "maybe"}) is None


def test_wrong_values_in_an_answer_read_as_absent() -> None:
    promoted = Promoted.read({"promoted": True, "timeline": "2", "lsn": ""})
    assert promoted == Promoted(timeline=None, lsn=None)
    paused = Paused.read({"paused": True, "receiveLsn": 7, "replayLsn": "0/1", "timeline": -1})
    assert paused == Paused(receive_lsn=None, replay_lsn="0/1", timeline=None)
    fenced = Fenced.read({"fenced": True, "reason": " a\nreason ", "already": "true"})
    assert fenced is not None
    assert (fenced.reason, fenced.already) == ("a reason", False)


def test_requests() -> None:
    assert FenceRequest.read({"reason": "split brain"}).reason == "split brain"
    assert FenceRequest.read({"reason": ""}).reason is None
    assert FenceRequest.read({}).reason is None
    assert BackupRequest.model_validate({"id": "uid-1", "more": 1}).id == "uid-1"
    with pytest.raises(ValidationError):
        BackupRequest.model_validate({"id": 5})
    assert BackupRequest(id="uid-1").as_json() == {"id": "uid-1"}
