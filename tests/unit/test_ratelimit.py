"""Retry delays: per-key exponential backoff, a global token bucket, and the larger of the two."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kanri.runtime._clock import FakeClock
from kanri.runtime._ratelimit import ExponentialBackoff, MaxOfRateLimiter, TokenBucket, default_rate_limiter


def test_backoff_starts_at_base_doubles_per_failure_and_stops_at_the_maximum() -> None:
    backoff = ExponentialBackoff(base=1.0, maximum=10.0)
    assert [backoff.when("k") for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff.failures("k") == 6


def test_backoff_defaults_are_controller_runtimes_5ms_to_1000s() -> None:
    backoff = ExponentialBackoff()
    delays = [backoff.when("k") for _ in range(30)]
    assert delays[0] == 0.005
    assert delays[1] == 0.01
    assert delays[-1] == 1000.0


def test_backoff_counts_each_key_separately() -> None:
    backoff = ExponentialBackoff(base=1.0, maximum=100.0)
    backoff.when("a")
    backoff.when("a")
    assert backoff.when("b") == 1.0
    assert (backoff.failures("a"), backoff.failures("b"), backoff.failures("c")) == (2, 1, 0)


def test_forget_starts_the_backoff_over() -> None:
    backoff = ExponentialBackoff(base=1.0, maximum=100.0)
    for _ in range(5):
        backoff.when("k")
    backoff.forget("k")
    assert backoff.failures("k") == 0
    assert backoff.when("k") == 1.0


def test_backoff_never_overflows_after_very_many_failures() -> None:
    backoff = ExponentialBackoff()
    assert backoff.delay(10**6) == 1000.0
    assert backoff.delay(2000) == 1000.0


@pytest.mark.parametrize(("base", "maximum"), [(0.0, 1.0), (-1.0, 1.0), (2.0, 1.0)])
def test_backoff_rejects_a_base_that_is_not_positive_or_above_the_maximum(base: float, maximum: float) -> None:
    with pytest.raises(ValueError, match="base"):
        ExponentialBackoff(base=base, maximum=maximum)


@settings(max_examples=200, deadline=None)
@given(
    base=st.floats(min_value=1e-6, max_value=10.0),
    factor=st.floats(min_value=1.0, max_value=1e6),
    failures=st.integers(min_value=1, max_value=80),
)
def test_backoff_delays_stay_within_base_and_maximum_and_double_per_failure(
    base: float, factor: float, failures: int
) -> None:
    maximum = base * factor
    backoff = ExponentialBackoff(base=base, maximum=maximum)
    delays = [backoff.when("k") for _ in range(failures)]
    assert delays[0] == base
    for before, after in itertools.pairwise(delays):
        assert base <= after <= maximum
        assert after == min(before * 2, maximum)
    assert backoff.failures("k") == failures


async def test_bucket_lets_a_burst_through_then_spaces_tokens_at_the_rate() -> None:
    bucket = TokenBucket(rate=10.0, burst=100, clock=FakeClock())
    assert [bucket.reserve() for _ in range(100)] == [0.0] * 100
    assert [bucket.reserve() for _ in range(3)] == pytest.approx([0.1, 0.2, 0.3])


async def test_bucket_refills_with_time_but_never_beyond_the_burst() -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=2.0, burst=3, clock=clock)
    for _ in range(3):
        bucket.reserve()
    clock.advance(1.0)  # two tokens back
    assert [bucket.reserve() for _ in range(3)] == [0.0, 0.0, 0.5]
    clock.advance(3600.0)  # a long quiet spell refills only up to the burst
    assert [bucket.reserve() for _ in range(4)] == [0.0, 0.0, 0.0, 0.5]


async def test_bucket_ignores_keys() -> None:
    bucket = TokenBucket(rate=1.0, burst=1, clock=FakeClock())
    assert bucket.when("a") == 0.0
    assert bucket.when("b") == 1.0
    bucket.forget("a")
    assert bucket.failures("a") == 0


@pytest.mark.parametrize(("rate", "burst"), [(0.0, 1), (-1.0, 1), (1.0, 0)])
def test_bucket_rejects_a_rate_or_burst_that_could_never_grant_a_token(rate: float, burst: int) -> None:
    with pytest.raises(ValueError, match="rate"):
        TokenBucket(rate=rate, burst=burst, clock=FakeClock())


@settings(max_examples=100, deadline=None)
@given(
    rate=st.sampled_from([0.5, 1.0, 4.0, 10.0]),
    burst=st.integers(min_value=1, max_value=10),
    steps=st.lists(st.tuples(st.sampled_from([0.0, 0.25, 1.0, 5.0]), st.integers(0, 5)), max_size=30),
)
async def test_bucket_never_grants_more_than_burst_plus_rate_times_elapsed(
    rate: float, burst: int, steps: list[tuple[float, int]]
) -> None:
    clock = FakeClock()
    bucket = TokenBucket(rate=rate, burst=burst, clock=clock)
    granted_at: list[float] = []
    for advance, reservations in steps:
        clock.advance(advance)
        for _ in range(reservations):
            wait = bucket.reserve()
            assert wait >= 0
            granted_at.append(clock.now() + wait)
    # The i-th token (1-based) cannot be usable before (i - burst) / rate seconds have passed.
    for i, at in enumerate(sorted(granted_at), start=1):
        assert at >= (i - burst) / rate - 1e-9


async def test_max_of_limiters_takes_the_longer_delay_and_forgets_everywhere() -> None:
    clock = FakeClock()
    limiter = MaxOfRateLimiter(ExponentialBackoff(base=1.0, maximum=100.0), TokenBucket(rate=1.0, burst=1, clock=clock))
    assert limiter.when("a") == 1.0  # backoff 1 s, bucket 0 s
    assert limiter.when("b") == 1.0  # backoff 1 s, bucket 1 s
    assert limiter.when("a") == 2.0  # backoff 2 s, bucket 2 s
    assert limiter.when("c") == 3.0  # backoff 1 s, bucket 3 s: the global limit wins
    assert limiter.failures("a") == 2
    limiter.forget("a")
    assert limiter.failures("a") == 0


def test_max_of_limiters_needs_a_limiter() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MaxOfRateLimiter()


async def test_default_limiter_is_5ms_per_key_and_10_qps_after_a_burst_of_100() -> None:
    limiter = default_rate_limiter(FakeClock())
    assert limiter.when("k") == 0.005
    assert limiter.when("k") == 0.01
    delays = [limiter.when(f"other-{i}") for i in range(99)]
    assert delays == [0.005] * 98 + [pytest.approx(0.1)]  # the 101st retry overall waits for the bucket
