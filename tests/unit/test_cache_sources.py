"""Which source a replica may sync from: never one that lacks writes a replica holds (kanri.cache.agent.sources)."""

from __future__ import annotations

from kanri.cache.agent.fencing import History
from kanri.cache.agent.resp import Secret
from kanri.cache.agent.sources import check_source, pick_source, protects, source_password

OLD = "a" * 40
NEW = "b" * 40
STRAY = "c" * 40
DEAD = "c-0:6379"


def replica(host: str, offset: int, *, replid: str = OLD, primary: str = DEAD, link: bool = False, **extra: object
            ) -> History:  # fmt: skip
    return History(host, "replica", replid, offset, primary_host=primary, link_up=link, **extra)  # type: ignore[arg-type]


def promoted(host: str, at: int, *, offset: int | None = None, replid: str = NEW, old: str = OLD) -> History:
    """A replica promoted when it held ``at`` bytes of ``old`` (Valkey's second_repl_offset is ``at + 1``)."""
    return History(host, "primary", replid, at if offset is None else offset, replid2=old, second_offset=at + 1)


def test_each_server_accepts_its_own_replication_password() -> None:
    password = Secret("s3cret")
    one, other = source_password(password, "c-1:6379"), source_password(password, "c-2:6379")
    assert one.value != other.value
    assert source_password(password, "C-1:6379").value == one.value  # the same address, however it is spelled
    assert source_password(Secret("other"), "c-1:6379").value != one.value
    assert "s3cret" not in repr(one)


def test_a_replica_protects_the_bytes_its_source_lacks() -> None:
    stale = promoted("c-2", at=40_000)
    ahead = replica("c-1", 90_000, primary="c-2:6379")  # told to follow the stale pod, not linked
    assert protects(stale, ahead)
    assert not protects(stale, replica("c-1", 40_000, primary="c-2:6379"))  # exactly what it holds
    assert not protects(promoted("c-1", at=90_000), replica("c-2", 40_000))


def test_nothing_to_protect_without_replicated_bytes() -> None:
    source = promoted("c-2", at=100)
    assert not protects(source, replica("c-0", 0, replid=STRAY, keys=50))  # loaded from disk: no history
    assert not protects(source, replica("c-0", 0, replid=STRAY))  # empty


def test_a_primarys_own_bytes_are_protected_only_through_its_replicas() -> None:
    # an old primary cut off by a partition wrote on past the switch; its agent demotes it towards the new one
    new = promoted("c-1", at=300, old=STRAY)
    old_primary = History("c-0", "primary", STRAY, 340)
    assert not protects(new, old_primary)
    demoted = replica("c-0", 340, replid=STRAY, primary="c-1:6379")
    assert not protects(new, demoted, own=True)  # its own agent saw it generate STRAY
    assert protects(new, demoted)  # a peer cannot tell: it waits until the demoted pod has re-synced


def test_a_replica_streaming_from_its_source_is_never_ahead_of_it() -> None:
    source = History("c-0", "primary", OLD, 1000)
    streaming = replica("c-1", 1200, primary="c-0", link=True)  # read a moment later, while writes flow
    assert not protects(source, streaming)


def test_a_replica_refuses_a_stale_promoted_pod_and_asks_for_another_failover() -> None:
    stale = promoted("c-2", at=40_000)
    me = replica("c-1", 90_000, primary="c-2:6379")
    check = check_source(stale, me, [stale], named="c-2")
    assert not check.allowed
    assert check.ask_failover
    assert "lacks writes this pod holds" in check.reason
    assert not check_source(stale, me, [stale], named="c-0").ask_failover  # not the named primary: wait


def test_a_pod_with_nothing_to_lose_still_waits_while_a_peer_would_lose_writes() -> None:
    stale = promoted("c-2", at=40_000)
    restarted = replica("c-0", 0, replid=STRAY, keys=90, primary="c-2:6379")
    ahead = replica("c-1", 90_000, primary="c-2:6379")
    check = check_source(stale, restarted, [ahead, stale], named="c-2")
    assert not check.allowed
    assert not check.ask_failover  # the pod that holds the writes asks
    assert check.reason == "c-2 lacks writes c-1 hold"


def test_a_source_that_holds_everything_is_allowed() -> None:
    best = promoted("c-1", at=90_000)
    check = check_source(best, replica("c-2", 40_000, primary="c-1:6379"), [best, replica("c-0", 0, replid=STRAY)])
    assert check.allowed
    assert not check_source(None, replica("c-2", 1), []).allowed


def test_the_current_primary_keeps_its_password_while_it_passes() -> None:
    primary = History("c-0", "primary", OLD, 1000)
    me = replica("c-1", 1000, primary="c-0:6379", link=True)
    other = replica("c-2", 990, primary="c-0:6379", link=True)
    source = History("c-0:6379", "primary", OLD, 1000)
    assert pick_source(me, source, [primary, other])[0] == "c-0:6379"
    stale = promoted("c-2:6379", at=40_000)
    assert pick_source(replica("c-1", 90_000, primary="c-2:6379"), stale, [stale])[0] is None


def test_while_the_primary_is_gone_the_password_goes_to_the_replica_sentinel_will_promote() -> None:
    # the primary died: the password goes to the peer that holds every write, so its promotion links at once
    me = replica("c-1", 900)
    best, behind = replica("c-2", 1000), replica("c-3", 800)
    chosen, check = pick_source(me, None, [best, behind])
    assert (chosen, check.allowed) == ("c-2", False)
    # a peer behind this pod never gets it: then no source at all until one that holds everything is promoted
    assert pick_source(replica("c-1", 1000), None, [replica("c-2", 900)])[0] is None


def test_a_planned_switchover_prefers_the_replica_to_the_fenced_old_primary() -> None:
    fenced = History("c-0:6379", "replica", OLD, 1000, primary_host="127.0.0.1:1")
    me = replica("c-1", 1000, primary="c-0:6379")
    assert pick_source(me, fenced, [fenced, replica("c-2", 1000, primary="c-0:6379")])[0] == "c-2"


def test_catching_up_from_a_peer_replica_keeps_its_password() -> None:
    ahead = replica("c-2:6379", 1000)
    me = replica("c-1", 900, primary="c-2:6379")
    assert pick_source(me, ahead, [ahead])[0] == "c-2:6379"
