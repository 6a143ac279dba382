"""Which databases the pooler agent ends after a renewal because a server connection stayed in use on a server that
is no longer the primary (kanri.postgres.pooler.agent.stranded). The step with real PgBouncer and PostgreSQL, a
frozen and a cut-off old primary: tests/integration/test_pooler_primary_watch.py."""

from __future__ import annotations

from kanri.postgres.pooler.agent.stranded import Server, StrandedServers, server_of

ON_OLD = Server(ptr="0x1", database="orders", state="active", close_needed=True, remote_pid=101)
ON_NEW = Server(ptr="0x2", database="orders", state="active", close_needed=True, remote_pid=202)
NEW_PRIMARY = frozenset({202, 203})


def armed() -> StrandedServers:
    decision = StrandedServers()
    decision.arm()
    return decision


def test_a_connection_on_another_server_is_ended_at_the_second_look_in_a_row() -> None:
    decision = armed()
    assert decision.observe([ON_OLD, ON_NEW], NEW_PRIMARY) == set()
    assert decision.observe([ON_OLD, ON_NEW], NEW_PRIMARY) == {"orders"}


def test_a_connection_released_between_looks_is_not_ended() -> None:
    decision = armed()
    assert decision.observe([ON_OLD, ON_NEW], NEW_PRIMARY) == set()
    assert decision.observe([ON_NEW], NEW_PRIMARY) == set()
    assert decision.armed, "ON_NEW is still in doubt: keep looking"


def test_a_connection_to_a_backend_of_the_primary_is_never_ended() -> None:
    decision = armed()
    assert [decision.observe([ON_NEW], NEW_PRIMARY) for _ in range(3)] == [set(), set(), set()]


def test_only_connections_made_before_the_renewal_and_still_in_use_are_in_doubt() -> None:
    idle = Server(ptr="0x3", database="orders", state="idle", close_needed=True, remote_pid=101)
    fresh = Server(ptr="0x4", database="shop", state="active", close_needed=False, remote_pid=999)
    decision = armed()
    assert [decision.observe([idle, fresh], NEW_PRIMARY) for _ in range(2)] == [set(), set()]
    assert not decision.armed, "nothing in doubt: the check stops until the next renewal"


def test_only_the_database_of_the_stranded_connection_is_ended() -> None:
    other = Server(ptr="0x5", database="billing", state="active", close_needed=True, remote_pid=203)
    decision = armed()
    decision.observe([ON_OLD, other], NEW_PRIMARY)
    assert decision.observe([ON_OLD, other], NEW_PRIMARY) == {"orders"}


def test_a_reused_connection_object_on_another_backend_starts_over() -> None:
    decision = armed()
    decision.observe([ON_OLD], NEW_PRIMARY)
    again = Server(ptr=ON_OLD.ptr, database="orders", state="active", close_needed=True, remote_pid=102)
    assert decision.observe([again], NEW_PRIMARY) == set()
    assert decision.observe([again], NEW_PRIMARY) == {"orders"}


def test_an_ended_connection_is_not_ended_twice_and_nothing_is_ended_unarmed_once_clear() -> None:
    decision = armed()
    decision.observe([ON_OLD], NEW_PRIMARY)
    assert decision.observe([ON_OLD], NEW_PRIMARY) == {"orders"}
    assert decision.observe([ON_OLD], NEW_PRIMARY) == set(), "KILL may still be closing it: seen anew first"
    assert decision.observe([], NEW_PRIMARY) == set()
    assert not decision.armed


def test_a_show_servers_row_of_pgbouncer_1_18() -> None:
    row = {"type": "S", "user": "app", "database": "orders", "state": "active", "addr": "10.96.0.7", "port": 5432,
           "ptr": "0x55d0c1f0", "link": "0x55d0c2a0", "remote_pid": 4242, "close_needed": 1, "tls": ""}  # fmt: skip
    assert server_of(row) == Server(ptr="0x55d0c1f0", database="orders", state="active", close_needed=True,
                                    remote_pid=4242)  # fmt: skip
