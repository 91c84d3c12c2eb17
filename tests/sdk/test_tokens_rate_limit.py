"""The client token rate limiter, on an injected clock: nothing here sleeps."""

from __future__ import annotations

import asyncio
import math
import threading

import pytest

from stormguard._exceptions import TokenRateLimitedError
from stormguard.tokens import TokenRateLimiter
from tests.sdk.test_tokens_support import FakeClock


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
    limiter.reserve(100).settle(250)
    assert limiter.available == pytest.approx(750)


def test_cancel_refunds_everything_but_never_above_the_burst() -> None:
    limiter, clock = _limiter(burst=1000)
    reservation = limiter.reserve(400)
    clock.advance(100)  # the bucket is full again
    reservation.cancel()
    assert limiter.available == pytest.approx(1000)


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
