"""Fencing of a running primary: a pod that finds itself primary while the Sentinels' newest configuration names
another steps down towards it — never towards a node that is down, and never because one Sentinel missed a failover."""

from __future__ import annotations

from kanri.cache.agent.fencing import Demote, History, decide_catch_up, decide_running

OLD = "a" * 40
NEW = "b" * 40


def primary(host: str, replid: str = NEW, offset: int = 500, **extra: object) -> History:
    return History(host=host, role="primary", replid=replid, offset=offset, **extra)  # type: ignore[arg-type]


def test_a_second_primary_steps_down_towards_the_newest_named_one() -> None:
    me = primary("c-2", replid=OLD, offset=300)  # a frozen replica that resumed and executed a queued promotion
    named = primary("c-1", offset=520, replid2=OLD, second_offset=301)
    decision = decide_running(me, [("c-1", 3), ("c-1", 3), ("c-0", 2)], named)
    assert decision == Demote("c-1", "2 of 3 Sentinels name c-1 the primary (epoch 3): this pod steps down", 0)


def test_writes_the_second_primary_accepted_after_the_switch_are_reported_as_lost() -> None:
    me = primary("c-0", replid=OLD, offset=340)  # the old primary, cut off, took 40 bytes after the switch
    named = primary("c-1", offset=520, replid2=OLD, second_offset=301)
    decision = decide_running(me, [("c-1", 3)], named)
    assert decision is not None
    assert decision.lost_bytes == 40
    diverged = decide_running(primary("c-0", replid="f" * 40), [("c-1", 3)], named)
    assert diverged is not None
    assert diverged.lost_bytes is None


def test_the_primary_the_newest_epoch_names_stays_even_if_most_sentinels_lag() -> None:
    # just after a failover only the leader has switched: the other two still name the old primary
    me = primary("c-1")
    assert decide_running(me, [("c-1", 3), ("c-0", 2), ("c-0", 2)], primary("c-0", replid=OLD)) is None


def test_nothing_happens_towards_a_named_primary_that_is_down_or_a_replica() -> None:
    me = primary("c-2")
    assert decide_running(me, [("c-1", 3)], None) is None
    replica = History("c-1", "replica", NEW, 500, primary_host="c-2:6379", link_up=True)
    assert decide_running(me, [("c-1", 3)], replica) is None
    assert decide_running(me, [("c-1", 3)], primary("c-0")) is None  # an answer about another host


def test_a_replica_no_answer_or_a_tie_decides_nothing() -> None:
    replica = History("c-2", "replica", NEW, 500, primary_host="c-1:6379", link_up=True)
    assert decide_running(replica, [("c-1", 3)], primary("c-1")) is None
    assert decide_running(primary("c-2"), [], primary("c-1")) is None
    assert decide_running(primary("c-2"), [("c-1", 3), ("c-0", 3)], primary("c-1")) is None
    assert decide_running(primary("c-2"), [("c-2", 3), ("c-1", 2)], primary("c-1")) is None


def replica(host: str, offset: int, of: str = "c-0:6379", replid: str = OLD) -> History:
    return History(host, "replica", replid, offset, primary_host=of, link_up=False)


def test_a_replica_behind_catches_up_from_the_peer_that_holds_most_once_the_primary_is_gone() -> None:
    me = replica("c-2:6379", 400)
    peers = [replica("c-1:6379", 460), replica("c-3:6379", 430)]
    decision = decide_catch_up(me, None, peers)
    assert decision is not None
    assert decision.primary == "c-1:6379"
    assert "60 bytes more" in decision.reason


def test_no_catch_up_while_the_primary_answers_or_from_a_peer_not_ahead_on_the_same_history() -> None:
    me = replica("c-2:6379", 400)
    assert decide_catch_up(me, primary("c-0:6379", replid=OLD), [replica("c-1:6379", 460)]) is None
    assert decide_catch_up(me, None, [replica("c-1:6379", 400)]) is None  # level: nothing to gain
    assert decide_catch_up(me, None, [replica("c-1:6379", 460, replid=NEW)]) is None  # another history
    assert decide_catch_up(me, None, [replica("c-1:6379", 460, of="c-9:6379")]) is None  # another primary's
    assert decide_catch_up(me, None, [primary("c-1:6379", replid=OLD, offset=460)]) is None  # promoted: Sentinel's
    assert decide_catch_up(primary("c-2:6379"), None, [replica("c-1:6379", 460)]) is None
    # the one ahead never follows the one behind: no loop
    assert decide_catch_up(replica("c-1:6379", 460), None, [me]) is None


def test_nothing_steps_down_while_a_sentinel_reports_a_failover_in_progress() -> None:
    # c-1 has just been promoted; the leader still names c-0 (epoch 2) until the failover ends, and c-0 answers as a
    # primary again because its node resumed: stepping down now would discard what c-1's replicas confirmed
    me = primary("c-1")
    claims = [("c-0", 2), ("c-0", 2)]
    assert decide_running(me, claims, primary("c-0")) is not None  # the same view without the flag would demote
    assert decide_running(me, claims, primary("c-0"), underway=True) is None
