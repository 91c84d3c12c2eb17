"""AdaptiveThrottle alone: the SRE formula, its rejection rate, the window, what an accept is."""

from __future__ import annotations

import asyncio
import doctest
import math
import random
import threading
from typing import Any

import pytest

import stormguard._policies.retry.throttle
from stormguard._core.exceptions import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    BadRequestError,
    CircuitOpenError,
    InternalServerError,
    NotFoundError,
    RateLimitError,
    RefusedBeforeSendError,
    ServiceUnavailableError,
    StreamInterruptedError,
    ThrottledError,
)
from stormguard._policies.retry.throttle import AdaptiveThrottle, ThrottleSnapshot, is_accept
from stormguard.protocol import ServerLoad
from stormguard.testing import FakeClock


def filled(requests: int, accepts: int, **kwargs: Any) -> AdaptiveThrottle:
    kwargs.setdefault("clock", FakeClock())
    throttle = AdaptiveThrottle(**kwargs)
    for _ in range(accepts):
        throttle.record_accept()
    for _ in range(requests - accepts):
        throttle.record_reject()
    return throttle


@pytest.mark.parametrize(
    ("requests", "accepts", "k", "expected"),
    [
        (0, 0, 2.0, 0.0),
        (100, 100, 2.0, 0.0),  # healthy: everything accepted
        (100, 50, 2.0, 0.0),  # half refused: still within k * accepts
        (100, 25, 2.0, 50 / 101),
        (100, 0, 2.0, 100 / 101),
        (100, 25, 1.0, 75 / 101),
        (100, 25, 3.0, 25 / 101),
        (1, 0, 2.0, 0.5),
    ],
)
def test_probability_is_the_sre_formula(
    requests: int, accepts: int, k: float, expected: float
) -> None:
    throttle = filled(requests, accepts, k=k)
    assert throttle.probability() == pytest.approx(expected)
    state = throttle.state()
    assert (state.requests, state.accepts) == (requests, accepts)
    assert state.probability == pytest.approx(expected)


def test_no_rejection_and_no_draw_while_healthy() -> None:
    rng = random.Random(1)
    throttle = filled(1000, 1000, rng=rng)
    before = rng.getstate()
    assert not any(throttle.should_reject() for _ in range(1000))
    assert rng.getstate() == before  # p = 0 draws nothing
    assert throttle.state().requests == 1000  # allowed requests wait for their outcome


def test_decisions_follow_the_seeded_rng_exactly() -> None:
    throttle = filled(100, 10, rng=random.Random(42))
    mirror = random.Random(42)
    for _ in range(200):
        requests, accepts, probability = (
            throttle.state().requests,
            throttle.state().accepts,
            throttle.probability(),
        )
        assert probability == pytest.approx(max(0.0, (requests - 2 * accepts) / (requests + 1)))
        assert throttle.should_reject() == (mirror.random() < probability)


def test_local_rejections_count_as_requests() -> None:
    throttle = filled(10, 0, rng=random.Random(3))
    rejected = sum(throttle.should_reject() for _ in range(100))
    assert rejected > 80
    assert throttle.state().requests == 10 + rejected
    assert throttle.probability() == pytest.approx((10 + rejected) / (11 + rejected))


def test_rejection_rate_matches_the_formula_at_a_quarter_accepted() -> None:
    # 100 000 requests, 25 % accepted, k = 2: p = 0.5; 1000 more draws barely move it.
    throttle = filled(100_000, 25_000, rng=random.Random(2026))
    assert throttle.probability() == pytest.approx(0.5, abs=1e-4)
    rejected = sum(throttle.should_reject() for _ in range(1000))
    sigma = math.sqrt(1000 * 0.5 * 0.5)
    assert abs(rejected - 500) < 4 * sigma


def test_a_fixed_capacity_server_sees_about_k_times_what_it_accepts() -> None:
    clock = FakeClock()
    throttle = AdaptiveThrottle(clock=clock, rng=random.Random(5))
    sent_per_second = []
    for _ in range(400):  # seconds
        sent = 0
        for _ in range(100):  # the client wants 100 requests a second
            if throttle.should_reject():
                continue
            sent += 1
            if sent <= 20:  # the server accepts 20 a second and refuses the rest
                throttle.record_accept()
            else:
                throttle.record(
                    ServiceUnavailableError("shed", status_code=503, server_load=ServerLoad())
                )
        sent_per_second.append(sent)
        clock.advance(1.0)
    steady = sent_per_second[200:]
    # Steady state: p = (100 - 2 * 20) / 101, so about 40 a second go out.
    assert 35 < sum(steady) / len(steady) < 45
    assert sent_per_second[0] > 40  # nothing is refused until requests exceed 2 * accepts


def test_a_burst_from_a_fresh_client_is_not_throttled() -> None:
    throttle = AdaptiveThrottle(clock=FakeClock(), rng=random.Random(0))
    assert not any(throttle.should_reject() for _ in range(50))  # 50 calls in flight at once


def test_counts_expire_with_the_window() -> None:
    clock = FakeClock()
    throttle = filled(100, 0, clock=clock, rng=random.Random(0))
    assert throttle.probability() > 0.99
    clock.advance(60.0)
    throttle.record_accept()
    assert throttle.state().requests == 101
    clock.advance(61.0)  # the refusals at t=0 have left the 120 s window
    assert throttle.state() == ThrottleSnapshot(1, 1, 0.0)
    clock.advance(120.0)
    assert throttle.state() == ThrottleSnapshot(0, 0, 0.0)
    assert not throttle.should_reject()


def test_the_window_slides_bucket_by_bucket() -> None:
    clock = FakeClock()
    throttle = AdaptiveThrottle(window=120.0, buckets=12, clock=clock)
    for _ in range(12):
        throttle.record_reject()
        clock.advance(10.0)
    # At t=120 the bucket of t=0 has left, the other eleven remain.
    assert throttle.state().requests == 11


def test_threads_keep_counts_exact() -> None:
    throttle = AdaptiveThrottle(clock=FakeClock())

    def worker() -> None:
        for i in range(1000):
            if i % 2:
                throttle.record_accept()
            else:
                throttle.record_reject()

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert throttle.state() == ThrottleSnapshot(8000, 4000, 0.0)


def status(cls: type[APIStatusError], code: int, **load: Any) -> APIStatusError:
    return cls("x", status_code=code, server_load=ServerLoad(**load))


@pytest.mark.parametrize(
    ("error", "accepted"),
    [
        pytest.param(None, True, id="success"),
        pytest.param(status(BadRequestError, 400), True, id="400"),
        pytest.param(status(NotFoundError, 404), True, id="404"),
        pytest.param(StreamInterruptedError("cut", chunks_received=2), True, id="cut-after"),
        pytest.param(status(RateLimitError, 429), False, id="429-caller-rate"),
        pytest.param(status(RateLimitError, 429, load_shed="queue_full"), False, id="429-shed"),
        pytest.param(status(ServiceUnavailableError, 503), False, id="503"),
        pytest.param(status(InternalServerError, 500), False, id="500"),
        pytest.param(APIConnectionError("refused"), False, id="connection"),
        pytest.param(APITimeoutError("t"), False, id="timeout"),
        pytest.param(StreamInterruptedError("cut", chunks_received=0), False, id="cut-before"),
        pytest.param(CircuitOpenError("open", breaker="b"), False, id="circuit-open"),
        pytest.param(asyncio.CancelledError(), False, id="cancelled"),
    ],
)
def test_is_accept(error: BaseException | None, accepted: bool) -> None:
    assert is_accept(error) is accepted


def test_record_counts_refusals_and_skips_what_was_never_sent() -> None:
    throttle = AdaptiveThrottle(clock=FakeClock())
    throttle.record(None)
    throttle.record(status(BadRequestError, 400))
    throttle.record(status(RateLimitError, 429))
    throttle.record(APIConnectionError("refused"))
    throttle.record(ThrottledError("t", probability=0.5))  # refused here: already counted
    throttle.record(asyncio.CancelledError())
    assert throttle.state() == ThrottleSnapshot(4, 2, 0.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"k": 0.5},
        {"k": float("inf")},
        {"k": float("nan")},
        {"window": 0},
        {"window": float("inf")},
        {"buckets": 0},
    ],
)
def test_rejects_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        AdaptiveThrottle(**kwargs)


def test_throttled_error_is_refused_before_send() -> None:
    error = ThrottledError("refused locally", probability=0.4)
    assert isinstance(error, RefusedBeforeSendError)
    assert (error.probability, error.attempts, error.message) == (0.4, 0, "refused locally")


def test_docstring_examples() -> None:
    assert doctest.testmod(stormguard._policies.retry.throttle).failed == 0
