"""A replica's remembered evidence of its primary's WAL end (kanri.instance.upstream) and its place in the /status
contract."""

from __future__ import annotations

from kanri.contract.status import InstanceStatus, Upstream
from kanri.instance.upstream import ConnectWatchdog, RetryNudge, UpstreamMemory


def test_nothing_heard_reports_nothing() -> None:
    memory = UpstreamMemory()
    memory.observe(None, 10.0)  # the receiver does not stream
    assert memory.report(11.0) is None


def test_the_evidence_is_kept_after_the_receiver_stops_and_ages_on_the_replicas_clock() -> None:
    memory = UpstreamMemory()
    memory.observe({"position": "0/3000100", "timeline": 1, "heard_ago": 0.5}, 100.0)
    memory.observe(None, 101.0)  # the primary is gone: the row vanished
    memory.observe(None, 102.0)
    assert memory.report(104.0) == Upstream(position="0/3000100", timeline=1, heard_seconds=4.5,
                                            streaming_seconds=4.0)  # fmt: skip


def test_the_highest_position_on_a_timeline_is_kept_and_a_new_timeline_starts_afresh() -> None:
    memory = UpstreamMemory()
    memory.observe({"position": "0/3000100", "timeline": 1, "heard_ago": 0.0}, 1.0)
    memory.observe({"position": "0/3000080", "timeline": 1, "heard_ago": 0.0}, 2.0)  # a keepalive's sent position
    assert memory.report(2.0) == Upstream(position="0/3000100", timeline=1, heard_seconds=0.0, streaming_seconds=0.0)
    memory.observe({"position": "0/3000010", "timeline": 2, "heard_ago": 0.0}, 3.0)  # following a new primary
    report = memory.report(3.0)
    assert report is not None
    assert (report.position, report.timeline) == ("0/3000010", 2)


def test_a_promoted_instance_forgets() -> None:
    memory = UpstreamMemory()
    memory.observe({"position": "0/3000100", "timeline": 1, "heard_ago": 0.0}, 1.0)
    memory.forget()
    assert memory.report(2.0) is None


def test_upstream_is_sent_only_when_known_and_read_defensively() -> None:
    plain = InstanceStatus(name="pg-2", role="replica")
    assert "upstream" not in plain.as_json()  # as an older instance manager: no evidence
    assert InstanceStatus.read(plain.as_json()).upstream is None  # type: ignore[union-attr]
    evidence = Upstream(position="0/3000100", timeline=1, heard_seconds=1.5, streaming_seconds=0.0)
    sent = InstanceStatus(name="pg-2", role="replica", upstream=evidence)
    body = sent.as_json()
    assert body["upstream"] == {"position": "0/3000100", "timeline": 1, "heardSeconds": 1.5, "streamingSeconds": 0.0}
    assert InstanceStatus.read(body) == sent
    hostile = {**body, "upstream": {"position": "x'; DROP", "timeline": -1, "heardSeconds": float("inf"),
                                    "streamingSeconds": True}}  # fmt: skip
    read = InstanceStatus.read(hostile)
    assert read is not None
    assert read.upstream == Upstream()  # every value read as absent: no evidence
    assert InstanceStatus.read({**body, "upstream": "0/3000100"}).upstream is None  # type: ignore[union-attr]


def test_a_wal_receiver_waiting_too_long_for_its_primarys_answer_is_named_once() -> None:
    watchdog = ConnectWatchdog(limit=10.0)
    assert watchdog.stuck([101], now=0.0) == []
    assert watchdog.stuck([101], now=9.9) == []
    assert watchdog.stuck([101], now=10.0) == [101]  # restarted: not named again while it goes
    assert watchdog.stuck([101], now=11.0) == []
    # a receiver that got through (not connecting any more) starts from zero the next time it waits
    assert watchdog.stuck([], now=12.0) == []
    assert watchdog.stuck([202], now=13.0) == []
    assert watchdog.stuck([202], now=22.9) == []
    assert watchdog.stuck([], now=23.0) == []
    assert watchdog.stuck([202], now=24.0) == []
    assert watchdog.stuck([202], now=34.0) == [202]


def test_a_resumed_replica_without_a_receiver_is_woken_once_a_second_for_the_window_only() -> None:
    nudge = RetryNudge(every=1.0, window=30.0)
    assert not nudge.due(None, 5.0, paused=False, receiver_running=False)  # never resumed: PostgreSQL's own pace
    assert nudge.due(100.0, 100.2, paused=False, receiver_running=False)
    assert not nudge.due(100.0, 100.9, paused=False, receiver_running=False)  # at most once a second
    assert nudge.due(100.0, 101.3, paused=False, receiver_running=False)
    assert not nudge.due(100.0, 102.5, paused=False, receiver_running=True)  # connecting or streaming: leave it
    assert not nudge.due(100.0, 103.0, paused=True, receiver_running=False)  # paused again on purpose
    assert nudge.due(100.0, 129.9, paused=False, receiver_running=False)
    assert not nudge.due(100.0, 130.5, paused=False, receiver_running=False)  # the window is over


def test_a_new_resume_is_woken_at_once_whatever_the_last_wake_of_the_one_before() -> None:
    nudge = RetryNudge(every=1.0, window=30.0)
    assert nudge.due(100.0, 100.5, paused=False, receiver_running=False)
    assert nudge.due(100.8, 100.9, paused=False, receiver_running=False)


def test_a_look_may_name_a_shorter_limit_than_the_watchdogs_own() -> None:
    watchdog = ConnectWatchdog(limit=10.0)
    assert watchdog.stuck([41], 0.0, limit=2.0) == []
    assert watchdog.stuck([41], 1.9, limit=2.0) == []
    assert watchdog.stuck([41], 2.0, limit=2.0) == [41]  # right after a resume: restarted after 2 s, not 10
    assert watchdog.stuck([42], 3.0) == []
    assert watchdog.stuck([42], 9.0) == []  # otherwise the watchdog's own 10 s
