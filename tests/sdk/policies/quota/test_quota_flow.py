"""The quota policy in the call flow, sync and async (one implementation): a key's
first quota signal turns its pacing on, later calls wait for their share, a quota
429 goes back to the pacer outside the retry budget, the deadline fails a call at
once, and keys are shared per credential and model."""

from __future__ import annotations

import contextlib
import json
import logging
from typing import Any

import httpx
import openai
import pytest
import respx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stormguard
from stormguard._policies.limiter.aimd import MAX_PAUSE_S
from stormguard.testing import FakeClock
from stormguard.tokens import TokenPolicy
from tests.sdk.helpers import (
    BASE,
    MESSAGES,
    Api,
    chat_json,
    chunk,
    event_stream,
    sse,
    unreachable,
)

RATE = {
    "error": {
        "message": "Rate limit reached for m in organization org-x on tokens per min (TPM):"
        " Limit 600000, Used 599990, Requested 300. Please try again in 3s. Visit",
        "type": "tokens",
        "param": None,
        "code": "rate_limit_exceeded",
    }
}
TOO_LARGE = {
    "error": {
        "message": "Request too large for m in organization org-x on tokens per min (TPM):"
        " Limit 600, Requested 5000. The input or output tokens must be reduced.",
        "type": "tokens",
        "param": None,
        "code": "rate_limit_exceeded",
    }
}
NO_BUDGET = {"ratio": 0.0, "min_retries_per_second": 0.0}


def quota_headers(limit: int = 600, remaining: int = 0) -> dict[str, str]:
    return {
        "x-ratelimit-limit-tokens": str(limit),
        "x-ratelimit-remaining-tokens": str(remaining),
        "x-ratelimit-reset-tokens": "1s",
    }


def ok(**headers: str) -> httpx.Response:
    return httpx.Response(200, json=chat_json(), headers=headers)


def refused(body: dict[str, Any] = RATE, **headers: str) -> httpx.Response:
    return httpx.Response(429, json=body, headers=headers)


async def test_a_key_that_sends_no_quota_signal_is_never_paced(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(return_value=ok())
    client = api.client()
    for _ in range(20):
        result = await api.run(client.chat.completions.create(messages=MESSAGES))
        assert result.attempt_history[0].quota_wait == 0.0
    assert api.clock.now() == 0.0 and client.stats().quota == ()


async def test_the_first_headers_turn_pacing_on_and_later_calls_wait_their_share(
    api: Api, mock: respx.MockRouter
) -> None:
    # 600 tokens a minute (10 a second), none left: each call (~40 tokens) waits.
    route = mock.post("/chat/completions").mock(return_value=ok(**quota_headers()))
    client = api.client()
    await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    assert api.clock.now() == 0.0  # the first call found the key unpaced
    results = []
    for _ in range(3):
        results.append(
            await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
        )
    assert api.clock.now() > 3.0  # ~4 s a call at 10 tokens/s
    assert all(r.attempt_history[0].quota_wait > 0 for r in results)
    assert route.call_count == 4 and all(r.attempts == 1 for r in results)
    (snapshot,) = client.stats().quota
    assert snapshot.mode == "headers" and snapshot.limit_tokens == 600
    assert snapshot.key == stormguard._policies.quota.fingerprint("sk-test-secret-key")
    assert snapshot.waits >= 3 and snapshot.wait_s == pytest.approx(api.clock.now(), rel=0.2)
    assert "sk-test-secret-key" not in repr(client.stats())


@pytest.mark.parametrize(
    "wait_header", ["retry-after", "retry-after-ms", "x-ms-retry-after-ms"], ids=str
)
async def test_a_quota_429_goes_back_to_the_pacer_outside_the_retry_budget(
    api: Api, mock: respx.MockRouter, wait_header: str
) -> None:
    value = "2" if wait_header == "retry-after" else "2000"
    route = mock.post("/chat/completions").mock(side_effect=[refused(**{wait_header: value}), ok()])
    budget = stormguard.RetryBudget(**NO_BUDGET, clock=api.clock)
    client = api.client(retry_policy=stormguard.RetryPolicy(max_attempts=1), retry_budget=budget)
    result = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 2 and result.attempts == 2
    assert [a.outcome for a in result.attempt_history] == ["paced", "ok"]
    # The wait, jittered x1-1.5, then the call's cost at the key's rate (no headers:
    # the share of 10,000 tokens a second the 429 taught): ~0.04 s.
    assert 2.0 <= result.attempt_history[1].quota_wait <= 3.1
    assert result.attempt_history[1].delay_before == 0.0  # no backoff: the pacer's wait
    assert 2.0 <= api.clock.now() <= 3.1
    sent = [c.request.headers["x-stormguard-attempt"] for c in route.calls]
    assert sent == ["1", "1"]  # never processed: not a retry
    stats = client.stats()
    assert stats.paced_429s == 1 and stats.retries == 0 and stats.retries_refused_by_budget == 0
    assert budget.state().retries == 0


async def test_a_quota_429_without_a_wait_waits_its_message_s_try_again_in(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(side_effect=[refused(), ok()])
    client = api.client()
    result = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert [a.outcome for a in result.attempt_history] == ["paced", "ok"]
    # "Please try again in 3s", jittered up to 1.5 x; then the call's own turn at the
    # key's paced rate (600,000 tokens a minute, cut to 0.8: ~0.04 s for its ~300).
    assert 3.0 <= api.clock.now() <= 4.5 + 0.1


async def test_without_headers_the_first_429_paces_to_the_part_this_process_sent(
    api: Api, mock: respx.MockRouter
) -> None:
    # A provider without x-ratelimit-* headers says nothing of the key until a 429,
    # whose message names its limit and level. What this process's answers cost
    # before (five calls of ~300 tokens) over what the key spent (6,000 - 10) is its
    # part of the key: ~0.25. Not counted, it would pace as if it were alone.
    spent = json.loads(json.dumps(RATE))
    spent["error"]["message"] = spent["error"]["message"].replace(
        "Limit 600000, Used 599990", "Limit 6000, Used 5990"
    )
    replies = [*(ok() for _ in range(5)), refused(spent), ok()]
    mock.post("/chat/completions").mock(side_effect=replies)
    client = api.client()
    for _ in range(6):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    (snapshot,) = client.stats().quota
    assert snapshot.mode == "429s" and snapshot.paced_429s == 1
    assert snapshot.limit_tokens == 6000
    # ~1,500 of ~6,000 spent, cut by the 429 to 0.8 of it: ~0.2 of the key's refill.
    assert 0.1 < snapshot.share_tokens < 0.3
    assert snapshot.rate_tokens == pytest.approx(snapshot.share_tokens * 100, rel=0.01)


async def test_paced_retries_stop_at_their_cap_then_a_429_is_an_ordinary_retry(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").mock(
        side_effect=[refused(**{"retry-after": "1"})] * 4 + [ok()]
    )
    client = api.client(quota=stormguard.QuotaPolicy(max_paced_retries=2), concurrency=None)
    result = await api.run(client.chat.completions.create(messages=MESSAGES))
    outcomes = [a.outcome for a in result.attempt_history]
    assert outcomes == ["paced", "paced", "retry", "retry", "ok"] and route.call_count == 5


async def test_insufficient_quota_fails_at_once_with_the_quota_on(
    api: Api, mock: respx.MockRouter
) -> None:
    body = {"error": {"message": "You exceeded your current quota", "code": "insufficient_quota"}}
    route = mock.post("/chat/completions").mock(
        return_value=httpx.Response(429, json=body, headers=quota_headers())
    )
    client = api.client()
    with pytest.raises(stormguard.RateLimitError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 1 and info.value.retry_stopped_by == "not_retryable"
    assert api.clock.now() == 0.0 and client.stats().paced_429s == 0


async def test_a_request_too_large_for_the_quota_fails_at_once(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").mock(return_value=refused(TOO_LARGE))
    client = api.client()
    with pytest.raises(stormguard.RateLimitError, match="Request too large") as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 1 and info.value.retry_stopped_by == "not_retryable"
    assert api.clock.now() == 0.0 and client.stats().requeues == 0


async def test_a_call_the_key_cannot_fit_before_its_deadline_fails_at_once(
    api: Api, mock: respx.MockRouter
) -> None:
    # 60 tokens a minute, none left: a call of ~40 tokens needs ~40 s even at the
    # whole key's rate; it has 5.
    route = mock.post("/chat/completions").mock(return_value=ok(**quota_headers(60, 0)))
    client = api.client()
    await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    with pytest.raises(stormguard.QuotaWaitError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10, timeout=5.0))
    err = info.value
    assert api.clock.now() == 0.0 and route.call_count == 1  # at once, nothing sent
    assert err.retry_stopped_by == "deadline" and err.attempts == 0
    assert err.least_wait > 5.0 and err.remaining == pytest.approx(5.0)
    assert "sk-test-secret-key" not in str(err) and err.key in str(err)
    assert client.stats().quota[0].refused == 1


def counted(share: float, **headers: str) -> Any:
    """Answers whose ``usage.prompt_tokens`` is ``share`` of the body's bytes / 4."""

    def answer(request: httpx.Request) -> httpx.Response:
        usage = {"prompt_tokens": round(share * len(request.content) / 4), "total_tokens": 1}
        return httpx.Response(200, json=chat_json(usage=usage), headers=headers)

    return answer


async def test_the_provider_s_prompt_count_corrects_the_next_calls_cost(
    api: Api, mock: respx.MockRouter
) -> None:
    # 600 tokens a minute (10 a second), none left: each call waits for its cost,
    # its prompt as the provider counts it plus its max_tokens.
    waits = {}
    for share in (0.5, 2.0):
        mock.post("/chat/completions").mock(side_effect=counted(share, **quota_headers()))
        client = api.client(api_key=f"sk-{share}")
        for _ in range(3):
            result = await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
        waits[share] = result.attempt_history[0].quota_wait
        (snapshot,) = client.stats().quota
        assert snapshot.prompt_scale == pytest.approx(share, rel=0.05)
    assert waits[0.5] < waits[2.0]


async def test_answers_without_headers_calibrate_the_cost_before_the_key_is_paced(
    api: Api, mock: respx.MockRouter
) -> None:
    # No headers: nothing paces the key yet, but the first 429 will pace the calls of
    # every process (a shared bucket) by this estimate: it is learned from the start.
    mock.post("/chat/completions").mock(side_effect=counted(0.5))
    client = api.client()
    for _ in range(3):
        await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    (key,) = client._core.quota._scales
    assert client._core.quota.registry.get(key) is None  # not paced
    assert client._core.quota.prompt_scale(key) == pytest.approx(0.5, rel=0.05)


async def test_a_quota_429_s_requested_count_corrects_the_cost_too(
    api: Api, mock: respx.MockRouter
) -> None:
    sent: list[int] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(len(request.content))
        if len(sent) > 1:
            return httpx.Response(200, json=chat_json(usage=None))  # no count to learn from
        message = RATE["error"]["message"].replace("Requested 300", f"Requested {sent[0] + 10}")
        return refused({"error": {**RATE["error"], "message": message}})

    mock.post("/chat/completions").mock(side_effect=answer)
    client = api.client()
    await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    (key,) = client._core.quota._scales  # the provider charged 1 token a byte: 4 x bytes / 4
    assert client._core.quota.prompt_scale(key) == pytest.approx(4.0)


async def test_a_pre_checked_prompt_is_the_provider_s_count_and_calibrates_nothing(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(side_effect=counted(0.5, **quota_headers(60_000, 60_000)))
    client = api.client(
        token_policy=TokenPolicy(
            context_windows={"m": 8192}, server_context_windows=False, server_tokenize=False
        )
    )
    result = await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    assert result.precheck is not None and client._core.quota._scales == {}


async def test_a_stream_s_usage_calibrates_as_an_answer_s_does(
    api: Api, mock: respx.MockRouter
) -> None:
    usage = {"prompt_tokens": 1000, "completion_tokens": 1, "total_tokens": 1001}
    body = sse(chunk("hi"), chunk("", choices=[], usage=usage))
    mock.post("/chat/completions").mock(
        return_value=event_stream(body, **quota_headers(60_000, 60_000))
    )
    client = api.client()
    stream = await api.run(
        client.chat.completions.create(messages=MESSAGES, max_tokens=10, stream=True)
    )
    await api.collect(stream)
    (key,) = client._core.quota._scales
    assert client._core.quota.prompt_scale(key) == 4.0  # 1000 tokens: past the bound


async def test_a_bare_429_is_a_shed_until_the_key_is_paced_then_a_quota_signal(
    api: Api, mock: respx.MockRouter
) -> None:
    bare = httpx.Response(429, json={"error": {"message": "slow down"}})
    route = mock.post("/chat/completions").mock(side_effect=[bare, ok()])
    client = api.client()
    result = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert [a.outcome for a in result.attempt_history] == ["requeued", "ok"]
    route.mock(side_effect=[ok(**quota_headers(60_000, 60_000)), bare, ok()])
    await api.run(client.chat.completions.create(messages=MESSAGES))  # the key is paced now
    result = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert [a.outcome for a in result.attempt_history] == ["paced", "ok"]


async def test_a_server_s_shed_429_keeps_the_concurrency_limiter_s_way(
    api: Api, mock: respx.MockRouter
) -> None:
    shed = httpx.Response(429, json=RATE, headers={"x-load-shed": "queue_full", "retry-after": "1"})
    mock.post("/chat/completions").mock(side_effect=[shed, ok()])
    client = api.client()
    result = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert [a.outcome for a in result.attempt_history] == ["requeued", "ok"]
    assert client.stats().paced_429s == 0 and client.stats().requeues == 1


async def test_a_paced_429_does_not_lower_the_concurrency_limit(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(side_effect=[refused(**{"retry-after": "1"}), ok()])
    client = api.client()
    await api.run(client.chat.completions.create(messages=MESSAGES))
    (limit,) = client.stats().concurrency
    assert limit.decreases == 0 and limit.paused_for == 0.0


async def test_two_clients_on_one_key_share_its_quota_and_two_keys_do_not(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(return_value=ok(**quota_headers()))
    first = api.client()
    await api.run(first.chat.completions.create(messages=MESSAGES, max_tokens=10))
    same_key = api.client()
    copy = first.with_options(timeout=60.0)
    other_key = api.client(api_key="sk-another-key")
    other_model = api.client(model="m2")
    for client in (other_key, other_model):
        await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
        assert api.clock.now() == 0.0  # another key, another model: not paced yet
    for client in (same_key, copy):
        before = api.clock.now()
        await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
        assert api.clock.now() > before  # the key's quota, learned by ``first``
    assert same_key.stats().quota[0].key == first.stats().quota[0].key


async def test_a_call_s_own_authorization_header_names_its_key(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(return_value=ok(**quota_headers()))
    client = api.client()
    await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    own = {"Authorization": "Bearer sk-per-call-key"}
    await api.run(
        client.chat.completions.create(messages=MESSAGES, max_tokens=10, extra_headers=own)
    )
    assert api.clock.now() == 0.0  # another key's first call: not paced
    assert {s.key for s in client.stats().quota} == {
        stormguard._policies.quota.fingerprint("sk-test-secret-key"),
        stormguard._policies.quota.fingerprint("sk-per-call-key"),
    }


async def test_quota_none_turns_pacing_off(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").mock(return_value=ok(**quota_headers()))
    client = api.client(quota=None)
    for _ in range(5):
        await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    assert api.clock.now() == 0.0 and client.stats().quota == ()


def test_a_quota_option_of_the_wrong_type_is_refused() -> None:
    with pytest.raises(TypeError, match="QuotaPolicy"):
        stormguard.Client(base_url=BASE, quota=True)  # type: ignore[arg-type]


async def test_a_token_rate_limiter_keeps_working_beside_the_quota(
    api: Api, mock: respx.MockRouter
) -> None:
    from stormguard.tokens import TokenPolicy, TokenRateLimiter

    usage = {"prompt_tokens": 8, "completion_tokens": 40, "total_tokens": 48}
    answer = httpx.Response(200, json=chat_json(usage=usage), headers=quota_headers(10**6, 10**6))
    mock.post("/chat/completions").mock(return_value=answer)
    bucket = TokenRateLimiter(tokens_per_minute=600, burst=100)
    policy = TokenPolicy(server_context_windows=False, server_tokenize=False, rate_limiter=bucket)
    client = api.client(token_policy=policy, model="gpt-4o")
    for _ in range(4):
        await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=40))
    # The bucket (10 tokens/s, 100 burst) paces 48-token calls: ~9 s for four; the
    # key's quota (a million a minute) would not.
    assert api.clock.now() >= 8.0


# -- one answer, whatever it says, parks the key at most MAX_PAUSE_S ---------------------

_VALUES = st.sampled_from(["0", "-1", "1", "60", "1e9", "inf", "9" * 20, "8760h", "soon", ""])
_HEADERS = st.dictionaries(
    st.sampled_from(
        [
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
            "retry-after",
            "retry-after-ms",
            "x-ms-retry-after-ms",
        ]
    ),
    _VALUES,
)
_MESSAGES = st.sampled_from(
    [
        RATE["error"]["message"],
        "on requests per min (RPM): Limit 1, Used 1, Requested 1. Please try again in 99999h.",
        "Limit 0, Used 0, Requested 1. Please try again in -1s.",
        "slow down",
    ]
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(status=st.sampled_from([200, 429]), headers=_HEADERS, message=_MESSAGES)
def test_no_single_answer_parks_a_key_past_the_pause_bound(
    status: int, headers: dict[str, str], message: str
) -> None:
    clock = FakeClock()
    answers = iter([(status, headers)])

    def respond(request: httpx.Request) -> httpx.Response:
        got, extra = next(answers, (200, {}))
        if got == 429:
            body = {"error": {"message": message, "code": "rate_limit_exceeded"}}
            return httpx.Response(429, json=body, headers=extra)
        return httpx.Response(200, json=chat_json(), headers=extra)

    with respx.mock(base_url=BASE, assert_all_called=False) as mock:
        mock.post("/chat/completions").mock(side_effect=respond)
        client = stormguard.Client(
            base_url=BASE,
            model="m",
            api_key="sk-test",
            clock=clock,
            telemetry=None,
            ejection=stormguard.EjectionConfig(probe=unreachable),
            retry_policy=stormguard.RetryPolicy(max_attempts=1),
        )
        with contextlib.suppress(stormguard.StormguardError):  # it may fail: later ones not
            client.chat.completions.create(messages=MESSAGES, max_tokens=5)
        start = clock.now()
        client.chat.completions.create(messages=MESSAGES, max_tokens=5, timeout=120.0)
        assert clock.now() - start <= MAX_PAUSE_S + 1.0
        clock.advance(MAX_PAUSE_S + 1.0)
        start = clock.now()
        result = client.chat.completions.create(messages=MESSAGES, max_tokens=5, timeout=5.0)
        assert clock.now() - start <= 1.0 and result.attempts == 1
        client.close()


# -- openai-python over stormguard.httpx_client() ----------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_openai_python_over_the_transport_is_paced_too(mode: str) -> None:
    clock = FakeClock()
    options: dict[str, Any] = {"base_url": BASE, "clock": clock}
    with respx.mock(base_url=BASE, assert_all_called=False) as mock:
        route = mock.post("/chat/completions").mock(
            side_effect=[refused(**{"retry-after": "2"}), ok(**quota_headers())]
        )
        if mode == "sync":
            http: Any = stormguard.httpx_client(**options)
            client: Any = openai.OpenAI(
                base_url=BASE, api_key="sk-openai", http_client=http, max_retries=0
            )
            response = client.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES
            )
        else:
            http = stormguard.async_httpx_client(**options)
            client = openai.AsyncOpenAI(
                base_url=BASE, api_key="sk-openai", http_client=http, max_retries=0
            )
            response = await client.chat.completions.with_raw_response.create(
                model="m", messages=MESSAGES
            )
        info = response.http_response.extensions[stormguard.CALL_INFO_EXTENSION]
        assert route.call_count == 2 and clock.now() >= 2.0
        assert [a.outcome for a in info.attempt_history] == ["paced", "ok"]
        sent = route.calls[0].request
        assert json.loads(sent.content)["model"] == "m"
        stats = http._transport.client.stats()
        assert stats.quota[0].key == stormguard._policies.quota.fingerprint("sk-openai")


@pytest.mark.parametrize("headers", [True, False])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_openai_python_over_the_transport_calibrates_the_estimate_too(
    mode: str, headers: bool
) -> None:
    # Without headers the key is not paced yet: its answers calibrate it all the same.
    key_name = f"sk-o-{mode}-{headers}"  # keys are process-wide: one of this test's own
    with respx.mock(base_url=BASE) as mock:
        mock.post("/chat/completions").mock(
            side_effect=counted(0.5, **(quota_headers(60_000, 60_000) if headers else {}))
        )
        if mode == "sync":
            http: Any = stormguard.httpx_client(base_url=BASE)
            openai.OpenAI(
                base_url=BASE, api_key=key_name, http_client=http
            ).chat.completions.create(model="m", messages=MESSAGES)
        else:
            http = stormguard.async_httpx_client(base_url=BASE)
            client = openai.AsyncOpenAI(base_url=BASE, api_key=key_name, http_client=http)
            await client.chat.completions.create(model="m", messages=MESSAGES)
        quota = http._transport.client._core.quota
        (key,) = quota._scales
        assert quota.prompt_scale(key) == pytest.approx(0.5, rel=0.05)
        assert (quota.registry.get(key) is not None) == headers  # paced only with headers


async def test_a_result_says_how_long_its_call_waited_for_the_quota(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(
        side_effect=[ok(**quota_headers()), refused(**{"retry-after": "1"}), ok()]
    )
    client = api.client()
    first = await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    assert first.call_info.quota_wait_s == 0.0 and first.call_info.paced_429s == 0
    second = await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    info = second.call_info
    assert info.paced_429s == 1
    assert info.quota_wait_s == pytest.approx(sum(a.quota_wait for a in second.attempt_history))
    assert info.quota_wait_s == pytest.approx(api.clock.now())


async def test_the_log_says_when_a_key_s_rate_is_learned_and_calls_first_wait(
    api: Api, mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    mock.post("/chat/completions").mock(return_value=ok(**quota_headers()))
    client = api.client()
    with caplog.at_level(logging.INFO, logger="stormguard"):
        for _ in range(3):
            await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    lines = [r.getMessage() for r in caplog.records if "quota" in r.getMessage()]
    label = stormguard._policies.quota.fingerprint("sk-test-secret-key")
    assert len(lines) == 2, lines  # learned once, first wait once
    assert any("600 tokens per minute" in line for line in lines)
    assert any("the first waits" in line for line in lines)
    assert all(label in line and "sk-test" not in line for line in lines)


async def test_a_call_waits_in_its_x_priority_class_before_later_arrivals(
    api: Api, mock: respx.MockRouter
) -> None:
    from stormguard._call.arguments import CallExtras
    from stormguard._call.pipeline import LogicalCall

    mock.post("/chat/completions").mock(return_value=ok(**quota_headers()))
    client = api.client()
    await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    core = client._core

    def call(priority: str) -> LogicalCall:
        extras = CallExtras(extra_headers={"x-priority": priority})
        spec = core.chat_spec(
            messages=MESSAGES, model=None, stream=None, extras=extras, params={"max_tokens": 10}
        )
        return LogicalCall(core, spec)

    sheddable, critical = call("sheddable"), call("critical")
    first = sheddable.pace()  # it waits first...
    ahead = critical.pace()  # ...but a critical call asked after it goes before it
    assert first is not None and ahead is not None and not first.granted
    assert sheddable._quota is not None and critical._quota is not None
    assert sheddable._quota.ticket[0] == stormguard.Priority.SHEDDABLE.rank
    assert critical._quota.ticket[0] == stormguard.Priority.CRITICAL.rank
    behind = sheddable.pace()
    assert behind is not None and behind.seconds >= ahead.seconds
    for one in (sheddable, critical):
        one.left_pacing()
    assert client.stats().quota[0].waiting == 0
