"""The injectable clock: the system clock follows real time; the fake one moves only when told, in deadline order."""

from __future__ import annotations

import asyncio
import functools

import pytest

from kanri.runtime._clock import FakeClock, SystemClock


async def settle() -> None:
    """Let every task that can run, run."""
    for _ in range(10):
        await asyncio.sleep(0)


async def test_system_clock_is_monotonic_and_sleeps_for_real() -> None:
    clock = SystemClock()
    async with asyncio.timeout(5):
        before = clock.now()
        await clock.sleep(0.01)
        assert clock.now() - before >= 0.009


async def test_system_clock_runs_callbacks_later_and_can_cancel_them() -> None:
    clock = SystemClock()
    fired: list[str] = []
    async with asyncio.timeout(5):
        clock.call_later(0.01, lambda: fired.append("kept"))
        clock.call_later(0.01, lambda: fired.append("cancelled")).cancel()
        await asyncio.sleep(0.05)
    assert fired == ["kept"]


async def test_fake_time_stands_still_until_advanced() -> None:
    clock = FakeClock(start=100.0)
    await asyncio.sleep(0.01)
    assert clock.now() == 100.0
    clock.advance(2.5)
    assert clock.now() == 102.5


async def test_fake_clock_refuses_to_go_backwards() -> None:
    with pytest.raises(ValueError, match="backwards"):
        FakeClock().advance(-1)


async def test_fake_sleep_returns_only_once_its_deadline_has_passed() -> None:
    clock = FakeClock()
    async with asyncio.timeout(5):
        sleeper = asyncio.create_task(clock.sleep(10))
        await settle()
        clock.advance(9)
        await settle()
        assert not sleeper.done()
        clock.advance(1)
        await settle()
        assert sleeper.done()


async def test_fake_sleepers_wake_in_deadline_order_not_start_order() -> None:
    clock = FakeClock()
    woke: list[float] = []

    async def sleep_for(seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append(seconds)

    async with asyncio.timeout(5):
        tasks = [asyncio.create_task(sleep_for(s)) for s in (3, 1, 2, 1.5)]
        await settle()
        clock.advance(10)
        await asyncio.gather(*tasks)
    assert woke == [1, 1.5, 2, 3]


async def test_fake_callbacks_see_their_own_deadline_and_may_schedule_within_the_step() -> None:
    clock = FakeClock()
    seen: list[tuple[str, float]] = []

    def first() -> None:
        seen.append(("first", clock.now()))
        clock.call_later(1, lambda: seen.append(("chained", clock.now())))

    clock.call_later(2, first)
    clock.call_later(5, lambda: seen.append(("last", clock.now())))
    clock.advance(10)
    assert seen == [("first", 2), ("chained", 3), ("last", 5)]
    assert clock.now() == 10


async def test_fake_callbacks_with_equal_deadlines_run_in_scheduling_order() -> None:
    clock = FakeClock()
    seen: list[int] = []
    for i in range(5):
        clock.call_later(1, functools.partial(seen.append, i))
    clock.advance(1)
    assert seen == [0, 1, 2, 3, 4]


async def test_fake_cancelled_callback_never_runs_and_no_longer_counts_as_pending() -> None:
    clock = FakeClock()
    fired: list[str] = []
    clock.call_later(1, lambda: fired.append("x")).cancel()
    assert clock.next_deadline() is None
    clock.advance(5)
    assert fired == []


async def test_fake_cancelled_sleep_leaves_no_timer_behind() -> None:
    clock = FakeClock()
    async with asyncio.timeout(5):
        sleeper = asyncio.create_task(clock.sleep(7))
        await settle()
        assert clock.next_deadline() == 7
        sleeper.cancel()
        await settle()
    assert clock.next_deadline() is None


async def test_fake_zero_delay_does_not_wait_for_advance() -> None:
    clock = FakeClock()
    fired: list[str] = []
    async with asyncio.timeout(5):
        await clock.sleep(0)
        clock.call_later(0, lambda: fired.append("soon"))
        await settle()
    assert fired == ["soon"]
    assert clock.now() == 0
