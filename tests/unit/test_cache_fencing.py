"""Fencing: who may be a source (replication id and offset), and the role a starting pod takes."""

from __future__ import annotations

import pytest

from kanri.cache.agent.fencing import NO_ID, Fence, Follow, History, Lead, decide_start, holds, missing_bytes

OLD = "a" * 40
NEW = "b" * 40
FRESH = "c" * 40


def node(host: str, role: str = "replica", replid: str = OLD, offset: int = 100, **extra: object) -> History:
    return History(host=host, role=role, replid=replid, offset=offset, **extra)  # type: ignore[arg-type]


def test_history_is_read_from_info_replication() -> None:
    info = {"role": "slave", "master_host": "c-0", "master_port": 6379, "master_link_status": "up",
            "master_replid": OLD, "master_repl_offset": 42, "master_replid2": 0, "second_repl_offset": -1}  # fmt: skip
    read = History.from_info("c-1", info, keys=7)
    assert read == History("c-1", "replica", OLD, 42, NO_ID, -1, "c-0:6379", True, 7)
    assert not read.writable
    primary = History.from_info("c-0", {"role": "master", "master_replid": NEW, "master_repl_offset": 9})
    assert (primary.role, primary.primary_host, primary.link_up) == ("primary", None, False)
    assert primary.writable
    cut_off = History.from_info("c-0", {"role": "master", "master_replid": NEW, "min_slaves_good_slaves": "0"})
    assert cut_off.good_replicas == 0
    assert not cut_off.writable


def test_a_source_holds_what_is_behind_it_on_its_own_history() -> None:
    assert holds(node("p", offset=100), node("r", offset=100))
    assert holds(node("p", offset=100), node("r", offset=60))
    assert not holds(node("p", offset=60), node("r", offset=100))
    assert missing_bytes(node("p", offset=60), node("r", offset=100)) == 40


def test_a_promoted_replica_holds_its_old_primarys_history_up_to_the_switch() -> None:
    promoted = node("r", "primary", replid=NEW, offset=150, replid2=OLD, second_offset=121)  # switched at 120
    assert holds(promoted, node("old", replid=OLD, offset=120))
    assert not holds(promoted, node("old", replid=OLD, offset=130))
    assert missing_bytes(promoted, node("old", replid=OLD, offset=130)) == 10


def test_a_restarted_empty_node_holds_nothing_of_its_replicas() -> None:
    empty = node("p", "primary", replid=FRESH, offset=0)
    assert not holds(empty, node("r", offset=100))
    assert missing_bytes(empty, node("r", offset=100)) is None
    assert holds(empty, node("r", replid=NEW, offset=0))  # an empty replica loses nothing


def test_data_loaded_from_disk_has_no_lineage() -> None:
    loaded = node("p", replid=FRESH, offset=0, keys=5)
    assert loaded.from_disk
    assert not loaded.empty
    assert not holds(node("q", replid=NEW, offset=10), loaded)


def test_follows_the_one_primary() -> None:
    me = node("c-0", replid=FRESH, offset=0)
    decision = decide_start(me, [node("c-1", "primary", replid=NEW), node("c-2")], "c-1", bootstrap=True)
    assert decision == Follow("c-1", "c-1 is the primary")


def test_two_primaries_follow_the_one_the_sentinels_name_or_fence() -> None:
    peers = [node("c-1", "primary"), node("c-2", "primary", replid=NEW)]
    chosen = decide_start(node("c-0", offset=0), peers, "c-2", bootstrap=False)
    assert isinstance(chosen, Follow)
    assert chosen.primary == "c-2"
    assert isinstance(decide_start(node("c-0", offset=0), peers, None, bootstrap=False), Fence)


def test_an_empty_restarted_primary_never_leads_its_replicas() -> None:
    """The anchors' data-wiping bug: the Sentinels still name the pod that restarted empty."""
    me = node("c-0", replid=FRESH, offset=0)
    replicas = [node("c-1", primary_host="c-0"), node("c-2", offset=90, primary_host="c-0")]
    decision = decide_start(me, replicas, "c-0", bootstrap=True)
    assert isinstance(decision, Fence)
    assert decision.failover
    assert "c-1, c-2" in decision.reason


def test_a_primary_that_came_back_behind_asks_for_a_failover() -> None:
    me = node("c-0", replid=FRESH, offset=0, keys=90)  # its append-only file lost the last second
    decision = decide_start(me, [node("c-1", offset=100)], "c-0", bootstrap=True)
    assert decision == Fence(decision.reason, failover=True)


def test_a_node_behind_that_the_sentinels_do_not_name_waits_without_a_failover() -> None:
    decision = decide_start(node("c-2", replid=FRESH, offset=0), [node("c-1", offset=100)], None, bootstrap=False)
    assert decision == Fence(decision.reason, failover=False)


def test_the_named_primary_leads_when_it_holds_every_peer() -> None:
    me = node("c-0", "replica", replid=OLD, offset=100)
    assert isinstance(decide_start(me, [node("c-1", offset=80)], "c-0", bootstrap=False), Lead)


def test_waits_while_the_named_primary_does_not_answer() -> None:
    decision = decide_start(node("c-1", offset=0), [], "c-0", bootstrap=False)
    assert isinstance(decision, Fence)
    assert not decision.failover


@pytest.mark.parametrize(("bootstrap", "expected"), [(True, Lead), (False, Fence)])
def test_only_the_first_pod_leads_a_new_cache(bootstrap: bool, expected: type) -> None:
    empty_peers = [node("c-1", replid=NEW, offset=0), node("c-2", replid=FRESH, offset=0)]
    assert isinstance(decide_start(node("c-0", replid=OLD, offset=0), empty_peers, None, bootstrap=bootstrap),
                      expected)  # fmt: skip


def test_a_first_pod_never_leads_peers_with_data() -> None:
    decision = decide_start(node("c-0", replid=FRESH, offset=0), [node("c-1", offset=100)], None, bootstrap=True)
    assert isinstance(decision, Fence)


RESTARTS = [("c-0", False, Lead), (None, True, Lead), ("c-1", False, Fence), (None, False, Fence)]


@pytest.mark.parametrize(("named", "bootstrap", "expected"), RESTARTS)
def test_a_whole_restart_from_disk_is_led_by_the_last_primary(
    named: str | None, bootstrap: bool, expected: type
) -> None:
    me = node("c-0", replid=FRESH, offset=0, keys=10)
    peers = [node("c-1", replid=NEW, offset=0, keys=12)]
    assert isinstance(decide_start(me, peers, named, bootstrap=bootstrap), expected)


def test_a_replica_streaming_from_this_pod_never_counts_as_ahead_of_it() -> None:
    # Sentinel promoted c-0 in a planned switchover while its agent was still deciding; c-1 already streams from it,
    # and its offset, read a moment after c-0's, is ahead by the writes in between
    me = node("c-0", "primary", replid=NEW, offset=500)
    linked = node("c-1", replid=NEW, offset=520, primary_host="c-0", link_up=True)
    assert decide_start(me, [linked], "c-0", bootstrap=False) == Lead(
        "the Sentinels name this pod the primary and it holds every peer's history"
    )
    # the same offsets from a replica of another history, or not linked, still mean this pod came back behind
    assert isinstance(decide_start(me, [node("c-1", replid=OLD, offset=520)], "c-0", bootstrap=False), Fence)
    unlinked = node("c-1", replid=NEW, offset=520, primary_host="c-0", link_up=False)
    assert isinstance(decide_start(me, [unlinked], "c-0", bootstrap=False), Fence)
