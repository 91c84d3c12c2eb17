"""The token pre-check wired into the call: refusals before any I/O, fallbacks, the rate limit."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
import respx

import stormguard
from stormguard.testing import FakeClock
from stormguard.tokens import TokenPolicy, TokenRateLimiter
from tests.sdk.helpers import BASE, Api, chat_json, chunk, event_stream, sse

LONG = [{"role": "user", "content": "word " * 400}]
SHORT = [{"role": "user", "content": "hi"}]


def offline_policy(**kwargs: object) -> TokenPolicy:
    return TokenPolicy(server_context_windows=False, server_tokenize=False, **kwargs)  # type: ignore[arg-type]


async def test_too_long_is_refused_with_zero_requests(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client(
        model="gpt-4o", token_policy=offline_policy(context_windows={"gpt-4o": 300})
    )
    with pytest.raises(stormguard.ContextWindowExceededError) as info:
        await api.run(client.chat.completions.create(messages=LONG, max_tokens=50))
    err = info.value
    assert route.call_count == 0 and len(mock.calls) == 0
    assert err.attempts == 0 and err.attempt_history == ()
    assert err.context_window == 300 and err.max_tokens == 50 and err.prompt_tokens > 250
    assert err.counter == "tiktoken:o200k_base"
    for number in (str(err.prompt_tokens), "50", "300", "tiktoken:o200k_base"):
        assert number in str(err)
    assert client.stats().attempts == 0


async def test_a_request_that_fits_carries_its_precheck(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client(model="gpt-4o", token_policy=offline_policy())
    resp = await api.run(client.chat.completions.create(messages=SHORT, max_tokens=10))
    check = resp.precheck
    assert check is not None
    assert check.counter == "tiktoken:o200k_base"
    assert check.prompt_tokens == 8  # 3 per message + "user" + "hi" + 3 reply priming
    assert (check.max_tokens, check.context_window, check.context_window_source) == (
        10,
        128_000,
        "table",
    )


async def test_context_fallback_sends_the_larger_model(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    policy = offline_policy(
        context_windows={"small": 200, "big": 10_000}, context_fallbacks={"small": "big"}
    )
    client = api.client(model="small", token_policy=policy)
    resp = await api.run(client.chat.completions.create(messages=LONG, max_tokens=20))
    assert json.loads(route.calls.last.request.content)["model"] == "big"
    assert resp.precheck.model == "big" and resp.precheck.fallback_from == "small"


async def test_server_window_from_models_list(api: Api, mock: respx.MockRouter) -> None:
    models = mock.get("/models").respond(
        200, json={"object": "list", "data": [{"id": "m", "max_model_len": 256}]}
    )
    chat = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client(token_policy=TokenPolicy(server_tokenize=False))
    with pytest.raises(stormguard.ContextWindowExceededError, match="256"):
        await api.run(client.chat.completions.create(messages=LONG, max_tokens=16))
    assert chat.call_count == 0
    assert models.calls.last.request.headers["authorization"] == "Bearer sk-test-secret-key"
    await api.run(client.chat.completions.create(messages=SHORT, max_tokens=16))
    assert models.call_count == 1  # cached per endpoint
    assert chat.call_count == 1


async def test_rate_limit_waits_inside_the_deadline_then_refuses(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    limiter = TokenRateLimiter(tokens_per_minute=60, clock=api.clock.now)  # 1 token/s
    client = api.client(
        model="gpt-4o", timeout=30.0, token_policy=offline_policy(rate_limiter=limiter)
    )
    # Each call reserves 8 prompt + 12 max_tokens = 20 of the 60-token bucket, and the
    # response's usage (7 tokens) refunds 13: without refunds the fourth would wait.
    for _ in range(4):
        await api.run(client.chat.completions.create(messages=SHORT, max_tokens=12))
    assert api.clock.sleeps == []
    with pytest.raises(stormguard.TokenRateLimitedError) as info:  # can never fit the bucket
        await api.run(client.chat.completions.create(messages=SHORT, max_tokens=1000))
    assert info.value.attempts == 0
    assert route.call_count == 4


async def test_rate_limit_wait_is_slept_before_sending(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").respond(
        200, json=chat_json(usage={"prompt_tokens": 8, "completion_tokens": 12, "total_tokens": 20})
    )
    limiter = TokenRateLimiter(tokens_per_minute=60, burst=20, clock=api.clock.now)
    client = api.client(model="gpt-4o", token_policy=offline_policy(rate_limiter=limiter))
    await api.run(client.chat.completions.create(messages=SHORT, max_tokens=12))
    await api.run(client.chat.completions.create(messages=SHORT, max_tokens=12))
    assert api.clock.sleeps == [pytest.approx(20.0)]  # 20 tokens at 1 token/s


def test_no_policy_means_no_lookups() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        return httpx.Response(200, json=chat_json())

    client = stormguard.Client(
        base_url="http://x/v1",
        model="m",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    client.chat.completions.create(messages=LONG)
    assert seen == ["/v1/chat/completions"]


async def test_stream_usage_settles_the_reservation(api: Api, mock: respx.MockRouter) -> None:
    usage = {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10}
    body = sse(chunk("a"), json.dumps({"choices": [], "usage": usage}))
    mock.post("/chat/completions").mock(side_effect=lambda _: event_stream(body))
    limiter = TokenRateLimiter(tokens_per_minute=60, burst=60, clock=api.clock.now)
    client = api.client(model="gpt-4o", token_policy=offline_policy(rate_limiter=limiter))
    for _ in range(2):  # 2 x 48 reserved would not fit 60; 10 used + 48 does
        stream = await api.run(
            client.chat.completions.create(
                messages=SHORT, max_tokens=40, stream=True, stream_options={"include_usage": True}
            )
        )
        await api.collect(stream)
    assert api.clock.sleeps == []


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_openai_python_over_the_transport_settles_the_reservation(mode: str) -> None:
    usage = {"prompt_tokens": 8, "completion_tokens": 2, "total_tokens": 10}
    clock = FakeClock()
    limiter = TokenRateLimiter(tokens_per_minute=60, burst=60, clock=clock.now)
    options: dict[str, Any] = {
        "base_url": BASE,
        "clock": clock,
        "token_policy": offline_policy(rate_limiter=limiter),
    }
    with respx.mock(base_url=BASE) as mock:
        mock.post("/chat/completions").respond(200, json=chat_json(usage=usage))
        for _ in range(2):  # 2 x 48 reserved would not fit 60; 10 used + 48 does
            if mode == "sync":
                http: Any = stormguard.httpx_client(**options)
                openai.OpenAI(base_url=BASE, api_key="k", http_client=http).chat.completions.create(
                    model="gpt-4o", messages=SHORT, max_tokens=40
                )
            else:
                http = stormguard.async_httpx_client(**options)
                client = openai.AsyncOpenAI(base_url=BASE, api_key="k", http_client=http)
                await client.chat.completions.create(model="gpt-4o", messages=SHORT, max_tokens=40)
    assert clock.sleeps == []
