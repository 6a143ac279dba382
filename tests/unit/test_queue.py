"""The work queue: deduplicated, one worker per key, delays, priorities, per-namespace fairness, shutdown, metrics."""

from __future__ import annotations

import asyncio
import itertools
import random
from collections import Counter
from collections.abc import Hashable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from kanri.runtime._clock import FakeClock
from kanri.runtime._queue import Priority, QueueShutDown, Request, WorkQueue
from kanri.runtime._queue_metrics import WorkQueueMetrics
from kanri.runtime._ratelimit import ExponentialBackoff, MaxOfRateLimiter, RateLimiter, TokenBucket

LIVE, BACKGROUND = Priority.LIVE, Priority.BACKGROUND


def req(key: str) -> Request:
    """``"ns/name"`` or ``"name"`` (cluster-scoped) as a Request."""
    namespace, _, name = key.rpartition("/")
    return Request(namespace, name)


def fake_queue(**kwargs: object) -> tuple[WorkQueue, FakeClock]:
    clock = FakeClock()
    return WorkQueue("test", clock=clock, **kwargs), clock  # type: ignore[arg-type]


async def take(queue: WorkQueue, n: int) -> list[str]:
    """Hand out ``n`` keys (each marked done at once) and return them as strings."""
    out = []
    async with asyncio.timeout(1):
        for _ in range(n):
            item = await queue.get()
            queue.done(item)
            out.append(str(item))
    return out


async def settle() -> None:
    """Let every task that can run, run."""
    for _ in range(20):
        await asyncio.sleep(0)


# --- Request ------------------------------------------------------------------------------------------------------


def test_request_prints_as_namespace_slash_name_or_just_name_when_cluster_scoped() -> None:
    assert str(Request("team-a", "db")) == "team-a/db"
    assert str(Request("", "node-1")) == "node-1"


def test_requests_are_equal_and_hash_alike_by_value() -> None:
    assert Request("a", "x") == Request("a", "x")
    assert len({Request("a", "x"), Request("a", "x"), Request("b", "x")}) == 2
    with pytest.raises(AttributeError):
        Request("a", "x").name = "y"  # type: ignore[misc]


# --- deduplication and one worker per key -------------------------------------------------------------------------


async def test_adding_a_key_that_is_already_waiting_is_a_no_op() -> None:
    queue, _ = fake_queue()
    queue.add(req("a/x"))
    queue.add(req("a/x"))
    assert len(queue) == 1
    assert await take(queue, 1) == ["a/x"]
    assert len(queue) == 0


async def test_a_key_added_while_being_processed_is_ready_again_only_after_done() -> None:
    queue, _ = fake_queue()
    queue.add(req("a/x"))
    async with asyncio.timeout(1):
        item = await queue.get()
    queue.add(req("a/x"))
    queue.add(req("a/x"))
    assert len(queue) == 0  # dirty, not ready: no second worker may take it
    queue.done(item)
    assert len(queue) == 1
    assert await take(queue, 1) == ["a/x"]
    assert len(queue) == 0


async def test_done_for_a_key_that_was_not_added_again_leaves_nothing_behind() -> None:
    queue, _ = fake_queue()
    queue.add(req("a/x"))
    assert await take(queue, 1) == ["a/x"]
    queue.done(req("a/x"))  # a second done, and a done for an unknown key, are ignored
    queue.done(req("b/never"))
    assert len(queue) == 0


async def test_get_blocks_until_a_key_is_added() -> None:
    queue, _ = fake_queue()
    async with asyncio.timeout(1):
        getter = asyncio.create_task(queue.get())
        await settle()
        assert not getter.done()
        queue.add(req("a/x"))
        assert await getter == req("a/x")


async def test_a_cancelled_getter_does_not_swallow_the_key_it_was_woken_for() -> None:
    queue, _ = fake_queue()
    async with asyncio.timeout(1):
        first = asyncio.create_task(queue.get())
        second = asyncio.create_task(queue.get())
        await settle()
        queue.add(req("a/x"))  # wakes the first getter...
        first.cancel()  # ...which is cancelled before it runs
        assert await second == req("a/x")
        assert first.cancelled()


# --- delays -------------------------------------------------------------------------------------------------------


async def test_a_delayed_key_becomes_ready_at_its_time() -> None:
    queue, clock = fake_queue()
    queue.add_after(req("a/x"), 10)
    clock.advance(9)
    assert len(queue) == 0
    clock.advance(1)
    assert len(queue) == 1


async def test_add_after_keeps_the_earlier_time_of_two() -> None:
    queue, clock = fake_queue()
    queue.add_after(req("a/later-first"), 10)
    queue.add_after(req("a/later-first"), 5)
    queue.add_after(req("a/earlier-first"), 5)
    queue.add_after(req("a/earlier-first"), 10)
    clock.advance(5)
    assert queue.pending_by_namespace() == {"a": 2}
    assert sorted(await take(queue, 2)) == ["a/earlier-first", "a/later-first"]
    clock.advance(100)
    assert len(queue) == 0  # the later times left nothing behind


async def test_add_after_for_a_key_that_is_already_ready_is_a_no_op() -> None:
    queue, clock = fake_queue()
    queue.add(req("a/x"))
    queue.add_after(req("a/x"), 5)
    assert await take(queue, 1) == ["a/x"]
    clock.advance(10)
    assert len(queue) == 0


async def test_an_immediate_add_overrides_a_pending_delay() -> None:
    queue, clock = fake_queue()
    queue.add_after(req("a/x"), 60)
    queue.add(req("a/x"))
    assert await take(queue, 1) == ["a/x"]
    clock.advance(120)
    assert len(queue) == 0


async def test_a_delay_that_ends_while_the_key_is_processed_makes_it_ready_at_done() -> None:
    queue, clock = fake_queue()
    queue.add(req("a/x"))
    async with asyncio.timeout(1):
        item = await queue.get()
    queue.add_after(item, 5)
    clock.advance(10)
    assert len(queue) == 0
    queue.done(item)
    assert await take(queue, 1) == ["a/x"]


async def test_a_blocked_get_wakes_when_a_delayed_key_is_due() -> None:
    queue, clock = fake_queue()
    async with asyncio.timeout(1):
        getter = asyncio.create_task(queue.get())
        queue.add_after(req("a/x"), 30)
        queue.add_after(req("b/y"), 20)
        await settle()
        clock.advance(19)
        await settle()
        assert not getter.done()
        clock.advance(1)
        assert await getter == req("b/y")


async def test_delayed_keys_work_on_the_system_clock() -> None:
    queue = WorkQueue("real")
    async with asyncio.timeout(5):
        queue.add_after(req("a/x"), 0.02)
        queue.add_after(req("a/y"), 0.01)
        assert [await queue.get(), await queue.get()] == [req("a/y"), req("a/x")]


# --- rate limiting ------------------------------------------------------------------------------------------------


async def test_rate_limited_adds_wait_the_backoff_and_forget_resets_it() -> None:
    queue, clock = fake_queue(rate_limiter=ExponentialBackoff(base=1.0, maximum=8.0))
    x = req("a/x")
    delays = []
    for _ in range(5):
        queue.add_rate_limited(x)
        waited = 0.0
        while not len(queue):
            clock.advance(0.5)
            waited += 0.5
        delays.append(waited)
        await take(queue, 1)
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert queue.num_requeues(x) == 5
    queue.forget(x)
    assert queue.num_requeues(x) == 0
    queue.add_rate_limited(x)
    clock.advance(1.0)
    assert len(queue) == 1


async def test_the_default_rate_limiter_retries_after_5ms() -> None:
    queue, clock = fake_queue()
    queue.add_rate_limited(req("a/x"))
    clock.advance(0.004)
    assert len(queue) == 0
    clock.advance(0.001)
    assert len(queue) == 1


# --- priority -----------------------------------------------------------------------------------------------------


async def test_live_keys_are_handed_out_before_background_keys() -> None:
    queue, _ = fake_queue()
    for i in range(3):
        queue.add(req(f"a/resync-{i}"), BACKGROUND)
    queue.add(req("b/changed"))
    queue.add(req("a/changed"))
    assert await take(queue, 5) == ["b/changed", "a/changed", "a/resync-0", "a/resync-1", "a/resync-2"]


async def test_a_background_key_added_again_as_live_is_promoted() -> None:
    queue, _ = fake_queue()
    queue.add(req("a/x"), BACKGROUND)
    queue.add(req("a/y"), BACKGROUND)
    queue.add(req("a/y"), LIVE)
    assert await take(queue, 2) == ["a/y", "a/x"]


async def test_a_live_key_is_never_demoted() -> None:
    queue, _ = fake_queue()
    queue.add(req("a/live"))
    queue.add(req("b/background"), BACKGROUND)
    queue.add(req("a/live"), BACKGROUND)
    assert await take(queue, 2) == ["a/live", "b/background"]


async def test_a_waiting_key_keeps_the_higher_priority_when_its_delay_ends() -> None:
    queue, clock = fake_queue()
    queue.add_after(req("a/x"), 5, BACKGROUND)
    queue.add_after(req("a/x"), 10, LIVE)  # later time ignored, higher priority kept
    queue.add(req("b/background"), BACKGROUND)
    clock.advance(5)
    assert await take(queue, 2) == ["a/x", "b/background"]


# --- fairness -----------------------------------------------------------------------------------------------------


async def test_namespaces_take_turns_and_each_is_first_in_first_out() -> None:
    queue, _ = fake_queue()
    for key in ["a/1", "a/2", "a/3", "b/1", "b/2", "c/1", "node-1"]:
        queue.add(req(key))
    assert await take(queue, 7) == ["a/1", "b/1", "c/1", "node-1", "a/2", "b/2", "a/3"]


async def test_a_tenant_with_10000_ready_keys_delays_another_namespace_by_one_key() -> None:
    queue, _ = fake_queue()
    for i in range(10_000):
        queue.add(req(f"big/{i}"))
    queue.add(req("small/x"))
    assert await take(queue, 2) == ["big/0", "small/x"]


async def test_a_new_namespace_waits_at_most_one_key_from_each_busy_namespace() -> None:
    queue, _ = fake_queue()
    for i in range(10_000):
        queue.add(req(f"big/{i}"))
    for namespace in ["c", "d", "e"]:
        for i in range(50):
            queue.add(req(f"{namespace}/{i}"))
    await take(queue, 2)  # the rotation is somewhere in the middle
    queue.add(req("new/x"))
    handed = await take(queue, 5)
    assert "new/x" in handed
    before = handed[: handed.index("new/x")]
    assert len({key.split("/")[0] for key in before}) == len(before)  # one key per namespace at most


async def test_pending_by_namespace_counts_ready_keys_only() -> None:
    queue, _ = fake_queue()
    queue.add(req("a/1"))
    queue.add(req("a/2"), BACKGROUND)
    queue.add(req("node-1"))
    queue.add_after(req("b/later"), 10)
    assert queue.pending_by_namespace() == {"a": 2, "": 1}
    assert len(queue) == 3


# --- shutdown -----------------------------------------------------------------------------------------------------


async def test_get_raises_after_shutdown_once_nothing_is_left() -> None:
    queue, _ = fake_queue()
    queue.shutdown()
    async with asyncio.timeout(1):
        with pytest.raises(QueueShutDown):
            await queue.get()


async def test_shutdown_still_hands_out_the_keys_already_ready() -> None:
    queue, _ = fake_queue()
    queue.add(req("a/x"))
    queue.add(req("b/y"))
    queue.shutdown()
    assert queue.shutting_down
    assert sorted(await take(queue, 2)) == ["a/x", "b/y"]
    async with asyncio.timeout(1):
        with pytest.raises(QueueShutDown):
            await queue.get()


async def test_shutdown_without_drain_makes_get_raise_at_once() -> None:
    queue, _ = fake_queue()
    queue.add(req("a/x"))
    queue.shutdown(drain=False)
    assert len(queue) == 0
    async with asyncio.timeout(1):
        with pytest.raises(QueueShutDown):
            await queue.get()


async def test_shutdown_wakes_every_blocked_getter() -> None:
    queue, _ = fake_queue()
    async with asyncio.timeout(1):
        getters = [asyncio.create_task(queue.get()) for _ in range(3)]
        await settle()
        queue.shutdown()
        results = await asyncio.gather(*getters, return_exceptions=True)
    assert all(isinstance(result, QueueShutDown) for result in results)


async def test_after_shutdown_adds_are_ignored_and_delayed_or_dirty_keys_are_dropped() -> None:
    queue, clock = fake_queue()
    queue.add(req("a/busy"))
    async with asyncio.timeout(1):
        busy = await queue.get()
    queue.add(busy)  # dirty
    queue.add_after(req("a/later"), 5)
    queue.shutdown()
    queue.add(req("a/new"))
    queue.add_rate_limited(req("a/failed"))
    queue.done(busy)
    clock.advance(10)
    assert len(queue) == 0
    assert queue.num_requeues(req("a/failed")) == 0
    assert clock.next_deadline() is None


# --- workers ------------------------------------------------------------------------------------------------------


async def test_concurrent_workers_never_share_a_key_and_every_key_is_processed() -> None:
    queue, clock = fake_queue()
    rng = random.Random(7)
    keys = [Request(ns, f"obj-{i}") for ns in ["a", "b", "c", ""] for i in range(10)]
    held: set[Request] = set()
    processed: Counter[Request] = Counter()
    requeued: set[Request] = set()

    async def worker() -> None:
        while True:
            try:
                item = await queue.get()
            except QueueShutDown:
                return
            assert item not in held, f"{item} handed to two workers"
            held.add(item)
            await clock.sleep(rng.choice([0.5, 1.0, 2.0]))
            if item not in requeued:  # every key comes back once, on a delay or right away (then it is dirty)
                requeued.add(item)
                queue.add_after(item, rng.choice([0.0, 1.0, 3.0]))
            held.discard(item)
            processed[item] += 1
            queue.done(item)

    async with asyncio.timeout(10):
        workers = [asyncio.create_task(worker()) for _ in range(4)]
        for key in keys:
            queue.add(key)
            queue.add(key, BACKGROUND)
        await settle()
        while len(queue) or held or clock.next_deadline() is not None:
            deadline = clock.next_deadline()
            clock.advance(0 if deadline is None else deadline - clock.now())
            await settle()
        queue.shutdown()
        await asyncio.gather(*workers)
    assert processed == dict.fromkeys(keys, 2)


# --- metrics ------------------------------------------------------------------------------------------------------


def sample(registry: CollectorRegistry, metric: str, **labels: str) -> float | None:
    return registry.get_sample_value(metric, {"name": "test", **labels})


async def test_metrics_count_adds_depth_and_retries() -> None:
    registry = CollectorRegistry()
    queue, _ = fake_queue(metrics=WorkQueueMetrics(registry), rate_limiter=ExponentialBackoff(1.0, 10.0))
    assert sample(registry, "workqueue_depth") == 0
    queue.add(req("a/x"))
    queue.add(req("a/x"))  # deduplicated: not counted
    queue.add(req("b/y"))
    queue.add_rate_limited(req("c/z"))
    assert sample(registry, "workqueue_adds_total") == 3
    assert sample(registry, "workqueue_retries_total") == 1
    assert sample(registry, "workqueue_depth") == 2


async def test_namespace_depth_series_disappears_when_the_namespace_empties() -> None:
    registry = CollectorRegistry()
    queue, _ = fake_queue(metrics=WorkQueueMetrics(registry))
    queue.add(req("a/x"))
    queue.add(req("a/y"))
    queue.add(req("node-1"))
    assert sample(registry, "kanri_workqueue_namespace_depth", namespace="a") == 2
    assert sample(registry, "kanri_workqueue_namespace_depth", namespace="") == 1
    await take(queue, 3)
    assert sample(registry, "kanri_workqueue_namespace_depth", namespace="a") is None
    assert sample(registry, "kanri_workqueue_namespace_depth", namespace="") is None
    assert sample(registry, "workqueue_depth") == 0


async def test_queue_and_work_durations_are_measured_on_the_injected_clock() -> None:
    registry = CollectorRegistry()
    queue, clock = fake_queue(metrics=WorkQueueMetrics(registry))
    queue.add(req("a/x"))
    queue.add_after(req("a/y"), 1.0)
    clock.advance(3.0)  # x waited 3 s ready, y 2 s (its time came at 1 s)
    async with asyncio.timeout(1):
        x, y = await queue.get(), await queue.get()
    clock.advance(4.0)
    queue.done(x)
    clock.advance(1.0)
    queue.done(y)
    assert sample(registry, "workqueue_queue_duration_seconds_count") == 2
    assert sample(registry, "workqueue_queue_duration_seconds_sum") == 5.0
    assert sample(registry, "workqueue_work_duration_seconds_count") == 2
    assert sample(registry, "workqueue_work_duration_seconds_sum") == 9.0
    assert sample(registry, "workqueue_queue_duration_seconds_bucket", le="10.0") == 2


async def test_unfinished_work_and_longest_processor_are_computed_when_collected() -> None:
    registry = CollectorRegistry()
    queue, clock = fake_queue(metrics=WorkQueueMetrics(registry))
    queue.add(req("a/x"))
    queue.add(req("a/y"))
    async with asyncio.timeout(1):
        x = await queue.get()
        clock.advance(2.0)
        await queue.get()
    clock.advance(3.0)
    assert sample(registry, "workqueue_unfinished_work_seconds") == 8.0  # 5 s + 3 s
    assert sample(registry, "workqueue_longest_running_processor_seconds") == 5.0
    queue.done(x)
    assert sample(registry, "workqueue_longest_running_processor_seconds") == 3.0


async def test_queues_sharing_a_registry_report_under_their_own_names() -> None:
    registry = CollectorRegistry()
    metrics = WorkQueueMetrics(registry)
    first = WorkQueue("first", clock=FakeClock(), metrics=metrics)
    WorkQueue("second", clock=FakeClock(), metrics=metrics)
    first.add(req("a/x"))
    assert registry.get_sample_value("workqueue_depth", {"name": "first"}) == 1
    assert registry.get_sample_value("workqueue_depth", {"name": "second"}) == 0


# --- properties ---------------------------------------------------------------------------------------------------

NAMESPACES = ["", "a", "b", "c"]
KEYS = [Request(ns, name) for ns in NAMESPACES for name in ["x", "y", "z"]]
WORKERS = 3
DELAYS = [0.0, 0.25, 0.5, 1.0, 2.0, 5.0]  # binary fractions keep the clock arithmetic exact
STEPS = [0.0, 0.25, 0.5, 1.0, 3.0]


class RecordingLimiter:
    """Wraps a limiter and remembers the last delay, so the model knows when a rate-limited key is due."""

    def __init__(self, inner: RateLimiter) -> None:
        self.inner = inner
        self.last = 0.0

    def when(self, key: Hashable) -> float:
        self.last = self.inner.when(key)
        return self.last

    def forget(self, key: Hashable) -> None:
        self.inner.forget(key)

    def failures(self, key: Hashable) -> int:
        return self.inner.failures(key)


@dataclass
class Pending:
    priority: Priority
    ready_at: float = float("inf")
    sequence: int = 0
    due: bool = False


@dataclass
class Mark:
    """Where a key stood when it became ready at its level: its place in its namespace's line, and what had been
    handed out from that level so far."""

    level: Priority
    place: int
    handed: dict[tuple[str, Priority], int]


@dataclass
class Model:
    """A plain reference of the contract (not of the implementation's data structures)."""

    clock: FakeClock
    pending: dict[Request, Pending] = field(default_factory=dict)
    processing: set[Request] = field(default_factory=set)
    marks: dict[Request, Mark] = field(default_factory=dict)
    handed: Counter[tuple[str, Priority]] = field(default_factory=Counter)
    owed: set[Request] = field(default_factory=set)
    failures: Counter[Request] = field(default_factory=Counter)
    sequence: itertools.count[int] = field(default_factory=itertools.count)

    def ready(self) -> list[Request]:
        return [r for r, p in self.pending.items() if p.due and r not in self.processing]

    def mark(self, key: Request) -> None:
        level = self.pending[key].priority
        place = sum(1 for r in self.ready() if r.namespace == key.namespace and self.pending[r].priority == level)
        self.marks[key] = Mark(level, place, dict(self.handed))

    def make_due(self, key: Request) -> None:
        self.pending[key].due = True
        if key not in self.processing:
            self.mark(key)

    def push(self, key: Request, delay: float, priority: Priority) -> None:
        self.owed.add(key)
        now = self.clock.now()
        entry = self.pending.get(key)
        if entry is None:
            entry = self.pending[key] = Pending(priority)
        elif priority > entry.priority:
            entry.priority = priority
            if key in self.marks:
                self.mark(key)  # promoted: to the back of its namespace's line at the higher level
        if entry.due or now + delay >= entry.ready_at:
            return
        entry.ready_at = now + delay
        if delay <= 0:
            self.make_due(key)
        else:
            entry.sequence = next(self.sequence)

    def advance(self) -> None:
        now = self.clock.now()
        due = sorted((p.ready_at, p.sequence, r) for r, p in self.pending.items() if not p.due and p.ready_at <= now)
        for _, _, key in due:
            self.make_due(key)

    def got(self, key: Request) -> None:
        assert key in self.ready(), f"{key} handed out but not ready (processing: {key in self.processing})"
        level = self.pending[key].priority
        assert not any(self.pending[r].priority > level for r in self.ready()), "a higher priority key was waiting"
        mark = self.marks.pop(key)
        assert mark.level == level
        for (namespace, handed_level), count in self.handed.items():
            if handed_level != level:
                continue
            before = count - mark.handed.get((namespace, level), 0)
            bound = mark.place - 1 if namespace == key.namespace else mark.place
            assert before <= bound, f"{key} waited for {before} keys of namespace {namespace!r} (bound {bound})"
        self.handed[(key.namespace, level)] += 1
        del self.pending[key]
        self.processing.add(key)
        self.owed.discard(key)

    def finished(self, key: Request) -> None:
        self.processing.discard(key)
        if key in self.pending and self.pending[key].due:
            self.mark(key)


def take_ready(queue: WorkQueue) -> Request:
    """``get()`` when a key is ready: it returns without suspending, so it can be driven without awaiting."""
    coroutine = queue.get()
    try:
        coroutine.send(None)
    except StopIteration as stop:
        result: Request = stop.value
        return result
    coroutine.close()
    raise AssertionError("get() blocked although len() said a key was ready")


keys = st.sampled_from(KEYS)
priorities = st.sampled_from(list(Priority))
operations = st.one_of(
    st.tuples(st.just("add"), keys, priorities),
    st.tuples(st.just("add_after"), keys, st.sampled_from(DELAYS), priorities),
    st.tuples(st.just("add_rate_limited"), keys),
    st.tuples(st.just("bulk"), st.sampled_from(NAMESPACES), st.integers(1, 30), priorities),
    st.tuples(st.just("get")),
    st.tuples(st.just("done"), st.integers(0, WORKERS - 1)),
    st.tuples(st.just("forget"), keys),
    st.tuples(st.just("advance"), st.sampled_from(STEPS)),
)


def apply(op: tuple[object, ...], queue: WorkQueue, model: Model, limiter: RecordingLimiter) -> None:
    match op:
        case ("add", Request() as key, Priority() as priority):
            queue.add(key, priority)
            model.push(key, 0.0, priority)
        case ("add_after", Request() as key, float() as delay, Priority() as priority):
            queue.add_after(key, delay, priority)
            model.push(key, delay, priority)
        case ("add_rate_limited", Request() as key):
            queue.add_rate_limited(key)
            model.failures[key] += 1
            model.push(key, limiter.last, LIVE)
        case ("bulk", str() as namespace, int() as count, Priority() as priority):
            for i in range(count):
                queue.add(Request(namespace, f"bulk-{i}"), priority)
                model.push(Request(namespace, f"bulk-{i}"), 0.0, priority)
        case ("get",):
            if model.ready() and len(model.processing) < WORKERS:
                key = take_ready(queue)
                assert key not in model.processing, f"{key} handed to two workers"
                model.got(key)
        case ("done", int() as index):
            if model.processing:
                key = sorted(model.processing)[index % len(model.processing)]
                queue.done(key)
                model.finished(key)
        case ("forget", Request() as key):
            queue.forget(key)
            model.failures.pop(key, None)
        case ("advance", float() as step):
            model.clock.advance(step)
            model.advance()


@settings(max_examples=150, deadline=None)
@given(st.lists(operations, max_size=80))
async def test_random_use_loses_no_key_never_shares_one_and_keeps_the_fairness_bound(
    ops: list[tuple[object, ...]],
) -> None:
    clock = FakeClock()
    limiter = RecordingLimiter(
        MaxOfRateLimiter(ExponentialBackoff(base=0.25, maximum=4.0), TokenBucket(rate=4.0, burst=2, clock=clock))
    )
    queue = WorkQueue("prop", clock=clock, rate_limiter=limiter)
    model = Model(clock)
    for op in ops:
        apply(op, queue, model, limiter)
        ready = model.ready()
        assert len(queue) == len(ready)
        assert queue.pending_by_namespace() == dict(Counter(r.namespace for r in ready))
        for key in KEYS:
            assert queue.num_requeues(key) == model.failures[key]

    # Finish everything in flight, let every delay run out, and drain: every added key must come out.
    for key in sorted(model.processing):
        queue.done(key)
        model.finished(key)
    for _ in range(1000):
        if not (model.pending or model.processing):
            break
        clock.advance(100.0)
        model.advance()
        while len(queue):
            key = take_ready(queue)
            model.got(key)
            queue.done(key)
            model.finished(key)
    assert not model.owed, f"keys lost: {sorted(model.owed)}"
    assert len(queue) == 0
    assert clock.next_deadline() is None
