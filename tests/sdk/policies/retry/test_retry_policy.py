"""RetryPolicy alone: the jitter distribution, Retry-After clamping, what is retryable."""

from __future__ import annotations

import email.utils
import random
import statistics
import time

import httpx
import pytest
import respx

import stormguard
from stormguard import RetryPolicy, ServerLoad
from stormguard.testing import FakeClock
from tests.sdk.helpers import BASE, MESSAGES, chat_json


def status_error(status: int, **headers: str) -> stormguard.APIStatusError:
    cls = stormguard._core.exceptions.status_error_class(status)
    return cls("x", status_code=status, server_load=ServerLoad.from_headers(headers))


def test_full_jitter_is_uniform_below_the_exponential_ceiling() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=8.0)
    rng = random.Random(42)
    for retry, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 8.0), (9, 8.0)]:
        samples = [policy.backoff(retry, rng) for _ in range(4000)]
        assert min(samples) >= 0.0 and max(samples) <= ceiling
        # Uniform on [0, c]: mean c/2, stdev c/sqrt(12), a quarter of the mass per quarter.
        assert statistics.fmean(samples) == pytest.approx(ceiling / 2, rel=0.05)
        assert statistics.pstdev(samples) == pytest.approx(ceiling / 12**0.5, rel=0.05)
        quarters = [
            sum(q * ceiling / 4 <= s < (q + 1) * ceiling / 4 for s in samples) for q in range(4)
        ]
        assert all(850 < n < 1150 for n in quarters), quarters


def test_huge_retry_numbers_do_not_overflow() -> None:
    assert 0 <= RetryPolicy().backoff(10_000, random.Random(1)) <= 8.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after": "45000"}, 10.0),  # honoured, but clamped to max_retry_after
    ],
)
def test_retry_after_is_honoured_and_clamped(headers: dict[str, str], expected: float) -> None:
    policy = RetryPolicy(max_retry_after=10.0)
    assert policy.delay(status_error(503, **headers), 1, random.Random(0)) == expected


@pytest.mark.parametrize(
    "bad",
    ["-1", "abc", "nan", "inf", "1e308", str(10**12), "", "0", "Wed, 21 Oct 2015 07:28:00 GMT"],
)
def test_bad_retry_after_falls_back_to_jittered_backoff(bad: str) -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=8.0)
    delays = {
        policy.delay(status_error(503, **{"retry-after": bad}), 2, random.Random(s))
        for s in range(20)
    }
    assert all(0 <= d <= 1.0 for d in delays)
    assert len(delays) > 10  # jittered, not a constant


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_retryable_statuses(status: int) -> None:
    assert RetryPolicy().decide(status_error(status)).retry


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 413, 422, 501])
def test_other_statuses_are_not_retried(status: int) -> None:
    decision = RetryPolicy().decide(status_error(status))
    assert not decision.retry and decision.reason == "not_retryable"


def test_should_retry_header_wins() -> None:
    no = RetryPolicy().decide(status_error(503, **{"x-should-retry": "false"}))
    assert not no.retry and no.reason == "should_retry_false"
    assert RetryPolicy().decide(status_error(409, **{"x-should-retry": "true"})).retry


def test_transport_failures() -> None:
    policy = RetryPolicy()
    assert policy.decide(stormguard.APIConnectionError("refused")).retry
    assert policy.decide(stormguard.APITimeoutError("before any byte")).retry
    assert not policy.decide(stormguard.APITimeoutError("mid-body", response_started=True)).retry
    assert policy.decide(stormguard.StreamInterruptedError("cut", chunks_received=0)).retry
    assert not policy.decide(stormguard.StreamInterruptedError("cut", chunks_received=3)).retry
    assert not policy.decide(ValueError("a bug")).retry


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"base_delay": -1},
        {"max_delay": float("inf")},
        {"base_delay": 9, "max_delay": 1},
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_skewed_clients_told_a_date_in_the_past_retry_on_their_own_backoff() -> None:
    # Twenty clients whose clocks run ahead of the server's are told "retry at
    # <a moment already past>" (no Date header to read it against): a wait of zero
    # would bring all of them back in the same instant; each waits its own jitter.
    past = email.utils.formatdate(time.time() - 30, usegmt=True)
    delays = []
    with respx.mock(base_url=BASE) as mock:
        route = mock.post("/chat/completions")
        for _ in range(20):
            route.side_effect = [
                httpx.Response(
                    503, json={"error": {"message": "busy"}}, headers={"retry-after": past}
                ),
                httpx.Response(200, json=chat_json()),
            ]
            client = stormguard.Client(
                base_url=BASE, model="m", api_key="sk-x", clock=FakeClock(), concurrency=None
            )
            result = client.chat.completions.create(messages=MESSAGES)
            delays.append(result.attempt_history[1].delay_before)
            client.close()
    assert all(0 < d <= 0.5 for d in delays)  # the first retry's full jitter
    assert len(set(delays)) == 20
