"""The client token rate limiter, on an injected clock: nothing here sleeps."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stormguard._core.exceptions import TokenRateLimitedError
from stormguard.tokens import TokenRateLimiter
from stormguard.tokens._rate_limit import MAX_RESET_WAIT_S, MAX_SETTLE_FACTOR
from tests.sdk.tokens.test_tokens_support import FakeClock


def _limiter(tpm: float = 6000, burst: float | None = None) -> tuple[TokenRateLimiter, FakeClock]:
    clock = FakeClock()
    return TokenRateLimiter(tpm, burst=burst, clock=clock), clock  # 6000/min = 100 tokens/s


def test_the_burst_is_free_then_waits_grow_with_the_deficit() -> None:
    limiter, _ = _limiter(burst=1000)
    assert limiter.reserve(600).wait == 0
    assert limiter.reserve(400).wait == 0
    assert limiter.reserve(100).wait == pytest.approx(1.0)
    assert limiter.reserve(200).wait == pytest.approx(3.0)  # queued behind the previous one
    assert limiter.available == pytest.approx(-300)


def test_the_bucket_refills_with_time_up_to_the_burst() -> None:
    limiter, clock = _limiter(burst=1000)
    limiter.reserve(1000)
    clock.advance(2.5)
    assert limiter.available == pytest.approx(250)
    clock.advance(3600)
    assert limiter.available == pytest.approx(1000)


def test_a_clock_stepping_back_refills_nothing() -> None:
    limiter, clock = _limiter(burst=1000)
    limiter.reserve(1000)
    clock.advance(-50)
    assert limiter.available == pytest.approx(0)


def test_a_wait_past_max_wait_is_refused_and_takes_nothing() -> None:
    limiter, _ = _limiter(burst=1000)
    limiter.reserve(1000)
    with pytest.raises(TokenRateLimitedError) as caught:
        limiter.reserve(500, max_wait=4.9)
    assert caught.value.tokens == 500
    assert caught.value.wait == pytest.approx(5.0)
    assert "5.000s" in caught.value.message and "4.900s" in caught.value.message
    assert limiter.available == pytest.approx(0)
    assert limiter.reserve(500, max_wait=5.0).wait == pytest.approx(5.0)


def test_a_request_larger_than_the_burst_can_never_fit() -> None:
    limiter, _ = _limiter(burst=1000)
    with pytest.raises(TokenRateLimitedError, match="can never fit") as caught:
        limiter.reserve(1001)
    assert caught.value.wait == math.inf
    assert limiter.available == pytest.approx(1000)


def test_burst_defaults_to_one_minute() -> None:
    limiter, _ = _limiter(tpm=90_000)
    assert limiter.burst == 90_000


def test_settle_refunds_the_unused_part_once() -> None:
    limiter, _ = _limiter(burst=1000)
    reservation = limiter.reserve(800)
    reservation.settle(300)
    assert limiter.available == pytest.approx(700)
    reservation.settle(0)
    reservation.cancel()
    assert limiter.available == pytest.approx(700)


def test_settle_takes_more_when_usage_exceeded_the_reservation() -> None:
    limiter, _ = _limiter(burst=1000)
    limiter.reserve(100).settle(180)
    assert limiter.available == pytest.approx(820)


def test_one_absurd_usage_takes_at_most_the_reservation_again() -> None:
    # A 200 that reports 10**15 tokens used: believed, it would put every later call
    # of the process behind a wait of centuries ("would wait 599999999940 s").
    limiter, _ = _limiter(tpm=100_000)
    limiter.reserve(1_000).settle(10**15)
    assert limiter.available == pytest.approx(100_000 - MAX_SETTLE_FACTOR * 1_000)
    assert limiter.reserve(1_000, max_wait=1.0).wait == 0.0


@settings(max_examples=60, deadline=None)
@given(
    reserved=st.integers(min_value=0, max_value=5_000),
    used=st.integers(min_value=-(10**20), max_value=10**20),
    level=st.integers(min_value=0, max_value=10_000),
)
def test_no_usage_costs_more_than_twice_the_reservation(
    reserved: int, used: int, level: int
) -> None:
    limiter, _ = _limiter(tpm=600_000, burst=10_000)  # 10,000 tokens/s
    limiter.reserve(10_000 - level)  # the bucket holds ``level``
    before = limiter.available
    limiter.reserve(reserved).settle(used)
    after = limiter.available
    assert before - MAX_SETTLE_FACTOR * reserved - 1e-6 <= after <= min(before, 10_000) + 1e-6
    # The next call of the process waits at most what both reservations cost it.
    wait = limiter.reserve(100).wait
    assert wait <= max(0.0, (100 + MAX_SETTLE_FACTOR * reserved - before) / 10_000) + 1e-6


def test_cancel_refunds_everything_but_never_above_the_burst() -> None:
    limiter, clock = _limiter(burst=1000)
    reservation = limiter.reserve(400)
    clock.advance(100)  # the bucket is full again
    reservation.cancel()
    assert limiter.available == pytest.approx(1000)


def test_a_servers_reset_holds_the_bucket_back_at_most_a_minute() -> None:
    # "0 tokens left, reset in 86000s": a day without a call, if believed.
    limiter, clock = _limiter(tpm=60_000)
    limiter.observe(remaining=0, reset=86_000.0)
    assert MAX_RESET_WAIT_S == 60.0
    assert limiter.reserve(10).wait == pytest.approx(MAX_RESET_WAIT_S)
    clock.advance(MAX_RESET_WAIT_S)
    assert limiter.reserve(10).wait == pytest.approx(0.0)


@settings(max_examples=60, deadline=None)
@given(
    remaining=st.just(0) | st.integers(min_value=-5, max_value=10**18),
    reset=st.none() | st.floats(allow_nan=True, allow_infinity=True),
)
def test_no_server_count_holds_the_bucket_back_past_its_bounds(
    remaining: int, reset: float | None
) -> None:
    limiter, _ = _limiter(tpm=60_000)  # 1000 tokens/s, burst 60,000
    limiter.observe(remaining, reset)
    # The level falls at most to nothing (the burst's refill, 60 s at most, for a
    # whole burst), and a reset holds calls back at most MAX_RESET_WAIT_S.
    assert limiter.available >= 0.0
    assert limiter.reserve(1_000).wait <= max(1.0, MAX_RESET_WAIT_S) + 1e-6


@pytest.mark.parametrize(("tpm", "burst"), [(0, None), (-1, None), (math.inf, None), (10, 0)])
def test_nonsense_configuration_is_refused(tpm: float, burst: float | None) -> None:
    with pytest.raises(ValueError):
        TokenRateLimiter(tpm, burst=burst)


def test_threads_queue_in_one_consistent_order() -> None:
    limiter, _ = _limiter(tpm=6000, burst=1000)  # 100 tokens/s, clock frozen
    waits: list[float] = []
    lock = threading.Lock()
    start = threading.Barrier(8)

    def worker() -> None:
        start.wait()
        for _ in range(100):
            wait = limiter.reserve(10).wait
            with lock:
                waits.append(wait)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Whatever the interleaving, the n-th reservation waits for the n-th deficit.
    expected = [max(0.0, (10 * (n + 1) - 1000) / 100) for n in range(800)]
    assert sorted(waits) == pytest.approx(expected)
    assert limiter.available == pytest.approx(1000 - 8000)


async def test_usable_from_asyncio_without_blocking_the_loop() -> None:
    limiter, _ = _limiter(burst=100)

    async def call(tokens: int) -> float:
        reservation = limiter.reserve(tokens, max_wait=10)
        await asyncio.sleep(0)  # the caller would sleep reservation.wait here
        reservation.settle(tokens // 2)
        return reservation.wait

    waits = await asyncio.gather(*(call(50) for _ in range(4)))
    assert sorted(waits) == pytest.approx([0.0, 0.0, 0.5, 1.0])
    assert limiter.available == pytest.approx(100 - 200 + 100)
