"""The SDK and the admission middleware against real vLLM (CPU build, tiny model)."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

import stormguard
from stormguard import RetryPolicy
from tests.vllm.vllm_process import VllmServer

ONE_TRY = RetryPolicy(max_attempts=1)
MESSAGES = [{"role": "user", "content": "tell me about the token cache"}]


def test_sync_calls_streams_and_load_headers(guarded_vllm: VllmServer) -> None:
    with stormguard.Client(base_url=guarded_vllm.base_url, model=guarded_vllm.model) as client:
        resp = client.chat.completions.create(messages=MESSAGES, max_tokens=8)
        assert isinstance(resp.choices[0].message.content, str)
        assert resp.usage.completion_tokens == 8
        load = resp.server_load
        assert load.token_capacity and load.token_capacity > 0
        assert load.kv_cache_usage is not None and load.queue_depth is not None
        text = client.completions.create(prompt="the queue", max_tokens=5)
        assert text.usage.completion_tokens == 5
        chunks = list(
            client.chat.completions.create(
                messages=MESSAGES,
                max_tokens=6,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert chunks[-1].usage.completion_tokens == 6
        assert [m.max_model_len for m in client.models.list()] == [1024]


async def test_async_calls_and_stream(guarded_vllm: VllmServer) -> None:
    async with stormguard.AsyncClient(
        base_url=guarded_vllm.base_url, model=guarded_vllm.model
    ) as client:
        resp = await client.chat.completions.create(messages=MESSAGES, max_tokens=4)
        assert resp.usage.completion_tokens == 4
        stream = await client.chat.completions.create(messages=MESSAGES, max_tokens=5, stream=True)
        pieces = [c async for c in stream]
        assert pieces and stream.response.is_closed


async def test_a_flood_is_shed_with_our_headers_and_retry_after(guarded_vllm: VllmServer) -> None:
    async with stormguard.AsyncClient(
        base_url=guarded_vllm.base_url,
        model=guarded_vllm.model,
        retry_policy=ONE_TRY,
        breaker=None,
        timeout=60,
    ) as client:

        async def one() -> stormguard.ChatCompletion | stormguard.APIStatusError:
            try:
                return await client.chat.completions.create(
                    messages=MESSAGES, max_tokens=400, ignore_eos=True
                )
            except stormguard.APIStatusError as exc:
                return exc

        results = await asyncio.gather(*(one() for _ in range(40)))
    served = [r for r in results if isinstance(r, stormguard.ChatCompletion)]
    shed = [r for r in results if isinstance(r, stormguard.APIStatusError)]
    assert served and shed
    for err in shed:
        assert err.status_code == 503
        assert err.server_load.load_shed in {"queue_full", "token_budget"}
        assert err.server_load.retry_after is not None and err.server_load.retry_after > 0
    depths = [
        r.server_load.queue_depth for r in served + shed if r.server_load.queue_depth is not None
    ]
    assert max(depths) <= 6  # --max-queue-requests 6
    assert all(r.usage.completion_tokens == 400 for r in served)


async def test_cancelling_a_stream_aborts_the_engine_request(guarded_vllm: VllmServer) -> None:
    def metric(name: str) -> float:
        return guarded_vllm.metric(name)

    tokens_before = await asyncio.to_thread(metric, "vllm:generation_tokens_total")
    async with stormguard.AsyncClient(
        base_url=guarded_vllm.base_url, model=guarded_vllm.model
    ) as client:
        stream = await client.chat.completions.create(
            messages=MESSAGES, max_tokens=1000, ignore_eos=True, stream=True
        )
        got = 0
        async for _ in stream:
            got += 1
            if got == 3:
                break
        await stream.aclose()
        deadline = time.monotonic() + 3
        while await asyncio.to_thread(metric, "vllm:num_requests_running") > 0:
            assert time.monotonic() < deadline, "vLLM kept generating for a caller that left"
            await asyncio.sleep(0.05)
    # Unaborted, the tiny model would produce its 1000 tokens in about 5 s; it stops
    # where the caller left.
    await asyncio.sleep(2.0)
    generated = await asyncio.to_thread(metric, "vllm:generation_tokens_total") - tokens_before
    assert generated < 400, generated


def test_too_long_is_refused_by_the_middleware(guarded_vllm: VllmServer) -> None:
    client = stormguard.Client(base_url=guarded_vllm.base_url, model=guarded_vllm.model)
    with client, pytest.raises(stormguard.BadRequestError) as info:
        client.chat.completions.create(messages=MESSAGES, max_tokens=1020)
    err = info.value
    assert err.server_load.load_shed == "too_long"
    assert err.server_load.should_retry is False
    assert err.attempts == 1


def test_a_deadline_that_cannot_be_met_is_refused_at_once(guarded_vllm: VllmServer) -> None:
    # The SDK always sends its own remaining time; a caller that is already out of
    # time is a raw request with x-request-deadline-ms: 0.
    response = httpx.post(
        f"{guarded_vllm.base_url}/chat/completions",
        json={"model": guarded_vllm.model, "messages": MESSAGES, "max_tokens": 8},
        headers={"x-request-deadline-ms": "0"},
        timeout=30,
    )
    assert response.status_code == 503
    assert response.headers["x-load-shed"] == "deadline"
    assert response.headers["x-should-retry"] == "false"
