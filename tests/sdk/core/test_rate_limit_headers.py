"""The ``x-ratelimit-*`` headers: parsed into ``RateLimit`` on results, streams and
errors, a 429's wait for the spent limit's reset, and the token rate limiter fed."""

from __future__ import annotations

import doctest
import random

import httpx
import pytest
import respx

import stormguard
from stormguard._core import rate_limit_headers as _rate_limit_headers
from stormguard._core.rate_limit_headers import RateLimit, parse_reset
from stormguard.testing import FakeClock
from stormguard.tokens import TokenPolicy, TokenRateLimiter
from tests.sdk.helpers import MESSAGES, Api, chat_json, chunk, event_stream, sse

OPENAI_HEADERS = {
    "x-ratelimit-limit-requests": "10000",
    "x-ratelimit-limit-tokens": "30000000",
    "x-ratelimit-remaining-requests": "9999",
    "x-ratelimit-remaining-tokens": "29999975",
    "x-ratelimit-reset-requests": "6ms",
    "x-ratelimit-reset-tokens": "0s",
}


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        ("6m0s", 360.0),
        ("1s", 1.0),
        ("20ms", 0.02),
        ("1h2m3.5s", 3723.5),
        ("0s", 0.0),
        ("17", 17.0),  # LiteLLM's proxy: whole seconds
        ("0.25", 0.25),
        (" 2s ", 2.0),
        ("1500us", 0.0015),
        ("24h", 86_400.0),
        ("24h1s", None),  # over a day: absurd
        ("-1s", None),
        ("-5", None),
        ("1e3", None),
        ("inf", None),
        ("nan", None),
        ("", None),
        ("s", None),
        ("5x", None),
        ("1m 2s", None),
        ("9" * 40, None),
        ("1" * 70 + "s", None),
        ("Wed, 21 Oct 2015 07:28:00 GMT", None),
        (None, None),
    ],
)
def test_parse_reset(value: str | None, seconds: float | None) -> None:
    got = parse_reset(value)
    assert got == pytest.approx(seconds) if seconds is not None else got is None


def test_openai_headers_parse_into_a_rate_limit() -> None:
    rl = RateLimit.from_headers(OPENAI_HEADERS)
    assert rl == RateLimit(10_000, 30_000_000, 9_999, 29_999_975, 0.006, 0.0)
    assert not rl.is_empty and rl.exhausted_reset() is None


def test_absurd_values_are_ignored_never_raised() -> None:
    rl = RateLimit.from_headers(
        {
            "x-ratelimit-limit-requests": "-1",
            "x-ratelimit-limit-tokens": "1" * 30,
            "x-ratelimit-remaining-requests": "many",
            "x-ratelimit-remaining-tokens": "1.5",
            "x-ratelimit-reset-requests": "99999h",
            "x-ratelimit-reset-tokens": "\x00",
        }
    )
    assert rl.is_empty and rl == RateLimit()


def test_exhausted_reset_is_the_later_spent_limit() -> None:
    spent_both = RateLimit(
        remaining_requests=0, remaining_tokens=0, reset_requests=1.0, reset_tokens=20.0
    )
    assert spent_both.exhausted_reset() == 20.0
    assert RateLimit(remaining_tokens=5, reset_tokens=20.0).exhausted_reset() is None
    assert RateLimit(remaining_tokens=0).exhausted_reset() is None  # no reset sent
    # "Resets in 0s" is no wait: the jittered backoff applies, as for a Retry-After
    # of 0, or every client told so would retry in the same instant.
    assert RateLimit(remaining_tokens=0, reset_tokens=0.0).exhausted_reset() is None
    policy = stormguard.RetryPolicy()
    err = stormguard.RateLimitError("x", status_code=429)
    err.rate_limit = RateLimit(remaining_requests=0, reset_requests=0.0)
    delays = {policy.delay(err, 1, random.Random(seed)) for seed in range(20)}
    assert len(delays) == 20 and all(0 < d <= 0.5 for d in delays)


async def test_results_streams_and_errors_carry_the_rate_limit(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(
        side_effect=[
            httpx.Response(200, json=chat_json(), headers=OPENAI_HEADERS),
            event_stream(sse(chunk("hi")), **OPENAI_HEADERS),
            httpx.Response(404, json={"error": {"message": "no"}}, headers=OPENAI_HEADERS),
        ]
    )
    client = api.client(retry_policy=stormguard.RetryPolicy(max_attempts=1))
    expected = RateLimit.from_headers(OPENAI_HEADERS)
    result = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert result.rate_limit == expected and result.call_info.rate_limit == expected
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    assert stream.rate_limit == expected
    await api.collect(stream)
    with pytest.raises(stormguard.NotFoundError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert info.value.rate_limit == expected


async def test_a_result_without_the_headers_has_an_empty_rate_limit(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client()
    result = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert result.rate_limit.is_empty
    assert stormguard.ChatCompletion({}).rate_limit.is_empty  # built by hand


async def test_a_429_with_a_spent_quota_waits_for_its_reset(
    api: Api, mock: respx.MockRouter
) -> None:
    spent = {
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "2.5s",
        "x-ratelimit-remaining-tokens": "100",
        "x-ratelimit-reset-tokens": "1s",
    }
    route = mock.post("/chat/completions").mock(
        side_effect=[
            httpx.Response(429, json={"error": {"message": "slow down"}}, headers=spent),
            httpx.Response(200, json=chat_json()),
        ]
    )
    # A retry, neither a requeue nor a paced retry: the policy's own wait
    # (policies/quota/test_quota_flow.py has the pacer's).
    client = api.client(concurrency=None, quota=None)
    result = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 2
    assert result.attempt_history[1].delay_before == pytest.approx(2.5)
    assert api.clock.now() == pytest.approx(2.5)


def test_retry_after_wins_over_the_reset_and_the_clamp_applies() -> None:
    policy = stormguard.RetryPolicy(max_retry_after=60.0)
    rng = random.Random(1)
    err = stormguard.RateLimitError(
        "x", status_code=429, server_load=stormguard.ServerLoad(retry_after=3.0)
    )
    err.rate_limit = RateLimit(remaining_tokens=0, reset_tokens=20.0)
    assert policy.delay(err, 1, rng) == 3.0
    err = stormguard.RateLimitError("x", status_code=429)
    err.rate_limit = RateLimit(remaining_requests=0, reset_requests=360.0)
    assert policy.delay(err, 1, rng) == 60.0  # "6m0s" is clamped as a Retry-After is
    err.rate_limit = RateLimit(remaining_requests=3, reset_requests=360.0)
    assert policy.delay(err, 1, rng) <= 0.5  # not spent: the jittered backoff
    other = stormguard.InternalServerError("x", status_code=500)
    other.rate_limit = RateLimit(remaining_requests=0, reset_requests=30.0)
    assert policy.delay(other, 1, rng) <= 0.5  # only a 429 reads them


def test_the_token_limiter_does_not_send_before_a_spent_reset() -> None:
    clock = FakeClock()
    limiter = TokenRateLimiter(tokens_per_minute=60_000, clock=clock.now)  # 1000/s
    limiter.observe(remaining=0, reset=20.0)
    assert limiter.reserve(10).wait == pytest.approx(20.0)
    clock.advance(20.0)
    assert limiter.reserve(10).wait == pytest.approx(0.0)


def test_the_token_limiter_holds_no_more_than_the_server_has_left() -> None:
    clock = FakeClock()
    limiter = TokenRateLimiter(tokens_per_minute=60_000, clock=clock.now)
    limiter.observe(remaining=500, reset=None)
    assert limiter.available == pytest.approx(500.0)
    assert limiter.reserve(1_500).wait == pytest.approx(1.0)  # 1000 more at 1000/s
    limiter.observe(remaining=10**9, reset=1.0)  # more than the bucket: no change
    assert limiter.available == pytest.approx(-1_000.0)
    with pytest.raises(stormguard.TokenRateLimitedError):
        limiter.reserve(100, max_wait=0.5)


async def test_the_client_feeds_the_servers_count_to_its_token_limiter(
    api: Api, mock: respx.MockRouter
) -> None:
    spent = {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "20s"}
    route = mock.post("/chat/completions").respond(200, json=chat_json(), headers=spent)
    limiter = TokenRateLimiter(tokens_per_minute=600_000, clock=api.clock.now)
    policy = TokenPolicy(server_context_windows=False, server_tokenize=False, rate_limiter=limiter)
    client = api.client(model="gpt-4o", token_policy=policy, timeout=10.0)
    await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=5))
    # The bucket holds no more than the server had left, and the call's unused refund.
    assert 0 < limiter.available < 20
    # The endpoint that spent its quota takes no call before the reset: a call whose
    # deadline ends first fails at once, without being sent.
    with pytest.raises(stormguard.QueueTimeoutError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=5))
    assert info.value.estimated_wait_s == pytest.approx(20.0, abs=0.01)
    assert route.call_count == 1
    route.respond(200, json=chat_json())
    start = api.clock.now()
    await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=5, timeout=30.0))
    assert api.clock.now() - start == pytest.approx(20.0, abs=0.01)
    assert route.call_count == 2


async def test_a_spent_quota_pauses_its_endpoint_not_the_others(api: Api) -> None:
    # "0 tokens left, reset in 86000s" from one server: that server alone is paused,
    # for 60 s at most; the other takes every call at once.
    spent = {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "86000s"}
    limiter = TokenRateLimiter(tokens_per_minute=600_000)
    policy = TokenPolicy(server_context_windows=False, server_tokenize=False, rate_limiter=limiter)
    with respx.mock(assert_all_called=False) as mock:
        a = mock.post("http://a.test/v1/chat/completions").respond(
            200, json=chat_json(), headers=spent
        )
        b = mock.post("http://b.test/v1/chat/completions").respond(200, json=chat_json())
        client = api.client(
            base_url=["http://a.test/v1", "http://b.test/v1"],
            model="gpt-4o",
            token_policy=policy,
            timeout=5.0,
        )
        while not a.call_count:
            await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=5))
        assert client.concurrency.endpoint("a.test:80").state().paused_for == 60.0
        start, sent_to_b = api.clock.now(), b.call_count
        for _ in range(10):
            await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=5))
        assert api.clock.now() - start < 0.01
        assert (a.call_count, b.call_count - sent_to_b) == (1, 10)
        api.clock.advance(60.0)
        assert client.concurrency.endpoint("a.test:80").has_room()


def test_docstring_examples() -> None:
    assert doctest.testmod(_rate_limit_headers).failed == 0
