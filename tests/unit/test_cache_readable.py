"""``-ro`` membership without the operator (kanri.cache.agent.readable): a replica's agent withdraws its pod once its
server is silent past the bound, the operator adds it back only from a look after that, and the two judge by one rule
so they never fight. Against the real API server and real servers: tests/integration/test_cache_ro_agent.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import certifi

from kanri.cache.agent.fencing import History
from kanri.cache.agent.labels import RETRY_AFTER, ApiServer, PodLabel
from kanri.cache.agent.node import Node, guard_reads
from kanri.cache.agent.readable import (
    MAX_LAG_SECONDS,
    READABLE,
    WITHDRAWN_AT,
    ReadGuard,
    bound_of,
    must_withdraw,
    seen_after,
    withdrawal_mark,
    within_bound,
)
from kanri.cache.agent.resp import Secret
from kanri.cache.api import LABELS, ReadPolicy
from kanri.cache.children import READABLE as OPERATOR_READABLE
from kanri.cache.children import ROLE
from kanri.cache.observe import Assessment, Lag, pod_routing, readable_replica
from kanri.local.ports import free_port

REPLID = "a" * 40
REPLICAS = ReadPolicy(serve_from="Replicas", max_lag_seconds=2)
Obj = dict[str, Any]


def replica(silent: int | None, offset: int = 500, link: bool = True, replid: str = REPLID) -> History:
    return History(host="c-1:6379", role="replica", replid=replid, offset=offset, primary_host="c-0.hl:6379",
                   link_up=link, silent_seconds=silent)  # fmt: skip


def info(**fields: Any) -> Obj:
    return {"role": "slave", "master_host": "c-0", "master_port": 6379, "master_replid": REPLID,
            "master_repl_offset": 500, **fields}  # fmt: skip


def test_the_server_reports_how_long_its_primary_has_been_silent() -> None:
    up = History.from_info("c-1:6379", info(master_link_status="up", master_last_io_seconds_ago=3))
    assert up.silent_seconds == 3
    down = History.from_info("c-1:6379", info(master_link_status="down", master_last_io_seconds_ago=-1,
                                              master_link_down_since_seconds=7))  # fmt: skip
    assert down.silent_seconds == 7
    never = History.from_info("c-1:6379", info(master_link_status="down", master_link_down_since_seconds=-1))
    assert never.silent_seconds is None
    assert History.from_info("c-0:6379", {"role": "master", "master_repl_offset": 5}).silent_seconds is None
    later = History.from_info("c-1:6379", info(master_link_status="up", master_last_io_seconds_ago=0))
    assert up == later  # silence is how stale it is, not which history it holds


def test_the_agent_and_the_operator_judge_a_replica_by_one_rule() -> None:
    for bound in (1, 2, 10):
        for silent in (None, 0, 1, 2, 3, 11):
            operator_reads = readable_replica(ReadPolicy(serve_from="Replicas", max_lag_seconds=bound), Lag(0, silent))
            assert operator_reads == within_bound(silent, bound) == (not must_withdraw(replica(silent), bound))


def test_only_a_replica_past_a_stated_bound_withdraws() -> None:
    assert must_withdraw(replica(3), 2)
    assert must_withdraw(replica(3, link=False), 2)  # link down for longer than the bound
    assert must_withdraw(replica(None, link=False), 2)  # never linked (fenced, or syncing since its start)
    assert not must_withdraw(replica(2), 2)
    assert not must_withdraw(replica(30), None)  # no seconds bound (Primary policy, or bytes only)
    assert not must_withdraw(None, 2)  # its server does not answer: the operator's pass removes it
    primary = History(host="c-0:6379", role="primary", replid=REPLID, offset=900)
    assert not must_withdraw(primary, 2)  # -ro falls back to the primary


def test_the_bound_is_read_from_the_pods_annotation() -> None:
    assert bound_of({"annotations": {MAX_LAG_SECONDS: "2"}}) == 2
    assert bound_of({"annotations": {}}) is None
    assert bound_of({}) is None
    assert bound_of({"annotations": {MAX_LAG_SECONDS: "soon"}}) is None


def test_the_agents_names_are_the_operators() -> None:
    assert READABLE == OPERATOR_READABLE == LABELS.key("readable")
    assert LABELS.key("max-lag-seconds") == MAX_LAG_SECONDS
    assert LABELS.key("withdrawn-at") == WITHDRAWN_AT


def test_only_a_look_after_the_withdrawal_may_add_the_pod_back() -> None:
    mark = withdrawal_mark(replica(3, offset=500))
    assert not seen_after(mark, replica(0, offset=500))  # its primary frozen: the offset stands still
    assert not seen_after(mark, replica(0, offset=400))  # the operator's look from before the withdrawal
    assert seen_after(mark, replica(0, offset=514))  # the primary spoke again since
    assert seen_after(mark, replica(0, offset=10, replid="b" * 40))  # follows another primary now
    assert seen_after(None, replica(0))
    assert seen_after("not-a-mark", replica(0))


def pod(labels: Obj | None = None, annotations: Obj | None = None) -> Obj:
    meta: Obj = {"name": "c-1", "resourceVersion": "41", "labels": labels or {}}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta}


def assessment(readable: list[str]) -> Assessment:
    return Assessment(["c-0"], "c-0", ["c-1"], readable)


def test_the_operator_adds_a_readable_replica_and_tells_it_the_bound() -> None:
    patch = pod_routing(pod({ROLE: "replica"}), replica(0), assessment(["c-1"]), REPLICAS)
    assert patch == {"labels": {READABLE: "true"}, "annotations": {MAX_LAG_SECONDS: "2"}, "resourceVersion": "41"}
    routed = pod({ROLE: "replica", READABLE: "true"}, {MAX_LAG_SECONDS: "2"})
    assert pod_routing(routed, replica(0), assessment(["c-1"]), REPLICAS) is None  # nothing written
    # the policy changed to Primary: out of -ro, and its agent has no bound left to enforce
    patch = pod_routing(routed, replica(0), assessment(["c-0"]), ReadPolicy())
    assert patch == {"labels": {READABLE: None}, "annotations": {MAX_LAG_SECONDS: None}, "resourceVersion": "41"}


def test_the_operator_never_adds_back_a_pod_from_a_look_older_than_its_withdrawal() -> None:
    mark = withdrawal_mark(replica(3, offset=500))
    withdrawn = pod({ROLE: "replica"}, {MAX_LAG_SECONDS: "2", WITHDRAWN_AT: mark})
    # the look was taken before the withdrawal (offset 480), within the bound then: the pod stays out
    assert pod_routing(withdrawn, replica(1, offset=480), assessment(["c-1"]), REPLICAS) is None
    # a look after it, caught up: back in, the mark goes
    patch = pod_routing(withdrawn, replica(0, offset=514), assessment(["c-1"]), REPLICAS)
    assert patch == {"labels": {READABLE: "true"}, "annotations": {WITHDRAWN_AT: None}, "resourceVersion": "41"}
    # a pod that does not answer loses both labels
    labelled = pod({ROLE: "replica", READABLE: "true"}, {MAX_LAG_SECONDS: "2"})
    assert pod_routing(labelled, None, assessment(["c-1"]), REPLICAS) == {
        "labels": {ROLE: None, READABLE: None},
        "resourceVersion": "41",
    }


class RecordingApi(ApiServer):
    """The API server's boundary only: records each request and answers with the pod as a patch leaves it."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__("127.0.0.1", 1, Path(certifi.where()), tmp_path / "token")
        object.__setattr__(self, "calls", [])

    async def request(self, method: str, path: str, body: Any = None, content_type: str = "") -> Any:
        self.calls.append((method, body))  # type: ignore[attr-defined]
        labels = {k: v for k, v in (body or {}).get("metadata", {}).get("labels", {}).items() if v is not None}
        return {"metadata": {"labels": labels, "annotations": {MAX_LAG_SECONDS: "2"}}}


async def settled(guard: ReadGuard) -> None:
    if guard.in_flight is not None:
        await guard.in_flight


async def test_the_guard_withdraws_once_per_spell_and_again_when_the_label_is_back(tmp_path: Path) -> None:
    api = RecordingApi(tmp_path)
    label = PodLabel(api, "ns", "c-1", ROLE)
    guard = ReadGuard(label)
    guard.offer(replica(5))  # no look at the pod yet: no bound known, nothing done
    assert guard.in_flight is None
    label.seen = {"labels": {READABLE: "true"}, "annotations": {MAX_LAG_SECONDS: "2"}}
    guard.offer(replica(1))  # within the bound
    assert guard.in_flight is None
    guard.offer(replica(3, offset=777))
    await settled(guard)
    assert api.calls == [  # type: ignore[attr-defined]
        ("PATCH", {"metadata": {"labels": {READABLE: None}, "annotations": {WITHDRAWN_AT: f"{REPLID}:777"}}})
    ]
    guard.offer(replica(4))  # the same spell: nothing more
    await settled(guard)
    assert len(api.calls) == 1  # type: ignore[attr-defined]
    label.seen = {"labels": {READABLE: "true"}, "annotations": {MAX_LAG_SECONDS: "2"}}  # a read-back finds it back
    guard.offer(replica(5))
    await settled(guard)
    assert len(api.calls) == 2  # type: ignore[attr-defined]
    guard.offer(replica(0))  # caught up: the spell ends; the next one withdraws again even if the label looks gone
    guard.offer(replica(3))
    await settled(guard)
    assert len(api.calls) == 3  # type: ignore[attr-defined]


async def test_a_failed_withdrawal_is_tried_again_after_a_pause_and_never_blocks(tmp_path: Path) -> None:
    now = [0.0]
    api = ApiServer("127.0.0.1", 1, Path(certifi.where()), tmp_path / "token", timeout=0.5)  # nobody answers
    label = PodLabel(api, "ns", "c-1", ROLE)
    label.seen = {"labels": {READABLE: "true"}, "annotations": {MAX_LAG_SECONDS: "2"}}
    guard = ReadGuard(label, clock=lambda: now[0])
    guard.offer(replica(3))
    assert guard.in_flight is not None
    assert not guard.in_flight.done()  # offer returned while the request is still out
    await settled(guard)
    assert not guard.withdrawn
    assert guard.retry_at == RETRY_AFTER
    guard.offer(replica(3))
    assert guard.in_flight.done()  # not before the pause
    now[0] = RETRY_AFTER
    guard.offer(replica(3))
    assert not guard.in_flight.done()
    await settled(guard)


async def test_the_guard_hears_its_server_every_round_and_a_failing_guard_never_stops_the_loop() -> None:
    node = Node("c", f"127.0.0.1:{free_port()}", (), (), Secret("x"))  # nobody listens: the server does not answer
    heard: list[History | None] = []
    thrice = asyncio.Event()

    def guard(me: History | None) -> None:
        heard.append(me)
        if len(heard) >= 3:
            thrice.set()
        raise RuntimeError("a bad round")

    loop = asyncio.create_task(guard_reads(node, guard, interval=0.01))
    try:
        async with asyncio.timeout(5):
            await thrice.wait()
    finally:
        loop.cancel()
    assert heard[:3] == [None, None, None]
