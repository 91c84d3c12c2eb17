"""The SDK against plain vLLM (no middleware): its in-stream 503 and its ORCA load report."""

from __future__ import annotations

import asyncio
import json

import httpx

import stormguard
from stormguard import RetryBudget, RetryPolicy
from tests.vllm.vllm_process import VllmServer

MESSAGES = [{"role": "user", "content": "count the blocks"}]


async def _raw_stream_statuses(server: VllmServer, n: int) -> list[str]:
    """What n concurrent raw streaming requests got: 'ok' or the in-stream error code."""

    async def one(http: httpx.AsyncClient) -> str:
        body = {
            "model": server.model,
            "messages": MESSAGES,
            "max_tokens": 200,
            "ignore_eos": True,
            "stream": True,
        }
        async with http.stream("POST", f"{server.base_url}/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {") and '"error"' in line:
                    return f"{r.status_code}:{json.loads(line[6:])['error'].get('code')}"
            return f"{r.status_code}:ok"

    async with httpx.AsyncClient(timeout=120) as http:
        return list(await asyncio.gather(*(one(http) for _ in range(n))))


async def test_vllm_sheds_inside_a_200_stream_and_the_sdk_retries_it(
    plain_vllm: VllmServer,
) -> None:
    statuses = await _raw_stream_statuses(plain_vllm, 10)
    assert "200:503" in statuses, statuses  # vLLM's own shedding: 200, then an error event
    async with stormguard.AsyncClient(
        base_url=plain_vllm.base_url,
        model=plain_vllm.model,
        retry_policy=RetryPolicy(max_attempts=6, base_delay=0.2, max_delay=1.0),
        retry_budget=RetryBudget(ratio=1.0, min_retries_per_second=10),
        breaker=None,
        timeout=120,
    ) as client:

        async def one() -> stormguard.AsyncStream[stormguard.ChatCompletionChunk]:
            stream = await client.chat.completions.create(
                messages=MESSAGES, max_tokens=200, ignore_eos=True, stream=True
            )
            async for _ in stream:
                pass
            return stream

        results = await asyncio.gather(*(one() for _ in range(10)), return_exceptions=True)
    streams = [r for r in results if isinstance(r, stormguard.AsyncStream)]
    failed = [r for r in results if not isinstance(r, stormguard.AsyncStream)]
    # On a loaded machine a stream can be shed more times than it may retry; it then
    # fails as what it was: a retryable 503 whose retries ran out.
    for error in failed:
        assert isinstance(error, stormguard.ServiceUnavailableError), repr(error)
        assert error.retry_stopped_by in {"max_attempts", "budget", "deadline"}
    retried = [s for s in streams if s.attempts > 1]
    assert retried, "the flood should have been shed at least once"
    for stream in retried:
        first = stream.attempt_history[0]
        assert first.error_type == "ServiceUnavailableError" and first.outcome == "retry"
        assert stream.attempt_history[-1].outcome == "ok"


def test_sdk_reads_endpoint_load_metrics_from_plain_vllm(plain_vllm: VllmServer) -> None:
    with stormguard.Client(base_url=plain_vllm.base_url, model=plain_vllm.model) as client:
        resp = client.chat.completions.create(messages=MESSAGES, max_tokens=4)
    assert resp.server_load.kv_cache_usage is not None
    assert resp.server_load.queue_depth is not None
    assert resp.server_load.token_capacity is None  # plain vLLM has no admission budget
