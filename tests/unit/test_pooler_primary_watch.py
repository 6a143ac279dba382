"""When the pooler agent has PgBouncer renew its server connections (kanri.postgres.pooler.agent.primary_watch):
after a switchover's window, a failover, a standby answering through ``-rw`` — and never while the same primary
answers. The loop with real PgBouncer and PostgreSQL: tests/integration/test_pooler_primary_watch.py."""

from __future__ import annotations

from kanri.postgres.pooler.agent.primary_watch import PrimaryWatch, Seen

A, B = "10.244.0.5:5432", "10.244.0.6:5432"


def looks(*seen: Seen | None) -> list[bool]:
    watch = PrimaryWatch()
    return [watch.observe(s) for s in seen]


def test_the_same_primary_answering_never_renews() -> None:
    assert looks(Seen(A, False), Seen(A, False), Seen(A, False)) == [False, False, False]


def test_a_switchover_renews_once_the_new_primary_answers() -> None:
    # A demoted (its connections dropped), back as a standby still behind -rw, then -rw routes to B
    assert looks(Seen(A, False), None, Seen(A, True), Seen(B, False), Seen(B, False)) == [False] * 3 + [True, False]


def test_a_different_primary_renews_even_without_a_gap_seen() -> None:
    assert looks(Seen(A, False), Seen(B, False)) == [False, True]


def test_a_primary_back_after_no_answer_renews() -> None:
    # a failed-over-and-back or abandoned switchover: connections made meanwhile may be anywhere
    assert looks(Seen(A, False), None, None, Seen(A, False)) == [False, False, False, True]


def test_a_standby_first_then_the_primary_renews() -> None:
    # the pod started while -rw still routed to a demoted primary
    assert looks(Seen(A, True), Seen(B, False)) == [False, True]


def test_a_renewal_that_did_not_reach_pgbouncer_is_asked_again() -> None:
    watch = PrimaryWatch()
    assert [watch.observe(s) for s in (Seen(A, False), Seen(B, False))] == [False, True]
    watch.not_renewed()
    assert watch.observe(Seen(B, False)) is True
    assert watch.observe(Seen(B, False)) is False


def test_no_answer_while_the_pod_starts_does_not_renew() -> None:
    # the cluster or the lookup role not there yet: PgBouncer has no connection to renew
    assert looks(None, None, Seen(A, False), Seen(A, False)) == [False] * 4
    assert looks(None, Seen(A, True), Seen(B, False)) == [False, False, True], "a standby answering does"
