"""The SDK and the admission middleware against real vLLM (CPU build, tiny model)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import stormguard
from stormguard import RetryPolicy
from tests.e2e.server_process import wait_for_metric
from tests.vllm.vllm_process import METRIC_WAIT_S, VllmServer

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
        assert [m.max_model_len for m in client.models.list()] == [4096]


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
        concurrency=None,  # no local pacing: the whole flood reaches the server at once
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
        # A shed before processing: the queue or the token budget full, or (on a machine
        # busy enough that vLLM's measured pace makes the wait longer than the call's 60 s)
        # the deadline the queue could not meet.
        assert err.server_load.load_shed in {"queue_full", "token_budget", "deadline"}
        assert err.server_load.retry_after is not None and err.server_load.retry_after > 0
    depths = [
        r.server_load.queue_depth for r in served + shed if r.server_load.queue_depth is not None
    ]
    assert max(depths) <= 6  # --max-queue-requests 6
    assert all(r.usage.completion_tokens == 400 for r in served)


# Long enough (about 6 s for the tiny model on 2 cores) that the stream is still
# generating when its caller leaves, even on a machine that starves this test process
# of CPU for seconds while vLLM runs (seen: 2.6 s); small enough to fit the budget.
LONG_STREAM_TOKENS = 3000
# What the engine may still generate between the caller's close and the abort: the
# disconnect, the handler's cancellation and one engine step (tens of tokens here).
ABORT_SLACK_TOKENS = 200


async def test_cancelling_a_stream_aborts_the_engine_request(guarded_vllm: VllmServer) -> None:
    generated, running = "vllm:generation_tokens_total", "vllm:num_requests_running"
    # Earlier tests' work is done.
    await wait_for_metric(guarded_vllm, running, lambda n: n == 0, METRIC_WAIT_S)
    tokens_before = await asyncio.to_thread(guarded_vllm.metric, generated)
    async with stormguard.AsyncClient(
        base_url=guarded_vllm.base_url, model=guarded_vllm.model
    ) as client:
        stream = await client.chat.completions.create(
            messages=MESSAGES, max_tokens=LONG_STREAM_TOKENS, ignore_eos=True, stream=True
        )
        got = 0
        async for _ in stream:
            got += 1
            if got == 3:
                break
        await stream.aclose()
        at_close = await asyncio.to_thread(guarded_vllm.metric, generated) - tokens_before
        # The request leaves the engine: aborted, not run to its end.
        await wait_for_metric(guarded_vllm, running, lambda n: n == 0, METRIC_WAIT_S)
    total = await asyncio.to_thread(guarded_vllm.metric, generated) - tokens_before
    assert at_close < LONG_STREAM_TOKENS, "the stream ended before its caller could leave it"
    assert total < LONG_STREAM_TOKENS, f"vLLM generated all {total:.0f} tokens; its caller left"
    # It stops where the caller left, not some time later.
    assert total - at_close < ABORT_SLACK_TOKENS, (at_close, total)


def test_too_long_is_refused_by_the_middleware(guarded_vllm: VllmServer) -> None:
    client = stormguard.Client(base_url=guarded_vllm.base_url, model=guarded_vllm.model)
    with client, pytest.raises(stormguard.BadRequestError) as info:
        client.chat.completions.create(messages=MESSAGES, max_tokens=4090)
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
