"""The SDK against plain vLLM (no middleware): its 503s, before a stream starts and
inside a 200 stream, and its ORCA load report."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator

import httpx

import stormguard
from stormguard import ConcurrencyLimiter, RetryBudget, RetryPolicy
from tests.e2e.server_process import wait_for_metric
from tests.vllm.vllm_process import METRIC_WAIT_S, VllmServer

MESSAGES = [{"role": "user", "content": "count the blocks"}]
# Seconds of generation for the tiny model on 2 cores; closed long before its end.
FILLER_TOKENS = 3000
MAX_BURSTS = 20
SDK_STREAMS = 3


def _stream_body(server: VllmServer, max_tokens: int) -> dict[str, object]:
    return {
        "model": server.model,
        "messages": MESSAGES,
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }


@contextlib.asynccontextmanager
async def _server_held(http: httpx.AsyncClient, server: VllmServer) -> AsyncIterator[None]:
    """Fill plain vLLM's only place (``--max-num-queued-reqs 1``) with a long stream
    until the block ends, then close it (vLLM aborts it).

    Shedding is then certain, not a matter of how concurrent requests happen to be
    spread in time on a loaded machine."""
    body = _stream_body(server, FILLER_TOKENS)
    async with http.stream("POST", f"{server.base_url}/chat/completions", json=body) as r:
        # Kept referenced: an abandoned line iterator is finalized at once, and that
        # closes the connection (vLLM would abort the filler there and then).
        lines = r.aiter_lines()
        async for line in lines:  # its first chunk: it holds the place
            if line.startswith("data: {"):
                assert '"error"' not in line, line
                break
        yield
    await wait_for_metric(server, "vllm:num_requests_running", lambda n: n == 0, METRIC_WAIT_S)


async def _raw_stream_status(http: httpx.AsyncClient, server: VllmServer) -> str:
    """What one raw streaming request got: 'status:ok' or 'status:<error code>'."""
    body = _stream_body(server, 20)
    async with http.stream("POST", f"{server.base_url}/chat/completions", json=body) as r:
        if r.status_code != 200:
            await r.aread()
            return f"{r.status_code}:{r.json()['error'].get('code')}"
        async for line in r.aiter_lines():
            if line.startswith("data: {") and '"error"' in line:
                return f"{r.status_code}:{json.loads(line[6:])['error'].get('code')}"
        return f"{r.status_code}:ok"


async def test_vllm_sheds_a_burst_inside_a_200_stream(plain_vllm: VllmServer) -> None:
    """vLLM checks its queue limit twice: before the response starts (a plain 503)
    and again when the request reaches the engine. Requests that pass the first check
    together are shed by the second inside a 200 stream, the shape the SDK must read
    as a 503. It is a race by nature: bursts are sent until one shows it (bounded)."""
    seen: list[str] = []
    async with httpx.AsyncClient(timeout=120) as http:
        for _ in range(MAX_BURSTS):
            burst = [_raw_stream_status(http, plain_vllm) for _ in range(10)]
            seen += await asyncio.gather(*burst)
            if "200:503" in seen:
                break
    assert "200:503" in seen, seen
    assert set(seen) <= {"200:ok", "200:503", "503:503"}, set(seen)


async def test_the_sdk_requeues_streams_vllm_sheds_until_they_get_in(
    plain_vllm: VllmServer,
) -> None:
    # One client per stream, so that each one's own counters say it was shed.
    clients = [
        stormguard.AsyncClient(
            base_url=plain_vllm.base_url,
            model=plain_vllm.model,
            # Requeues for far longer than the streams need to take turns (alone on
            # the endpoint, each waits the backoff: vLLM sends no Retry-After).
            retry_policy=RetryPolicy(base_delay=0.2, max_delay=1.0),
            concurrency=ConcurrencyLimiter(
                requeue_budget=RetryBudget(ratio=1.0, min_retries_per_second=10)
            ),
            timeout=120,
        )
        for _ in range(SDK_STREAMS)
    ]

    async def read_all(
        client: stormguard.AsyncClient,
    ) -> stormguard.AsyncStream[stormguard.ChatCompletionChunk]:
        stream = await client.chat.completions.create(
            messages=MESSAGES, max_tokens=50, ignore_eos=True, stream=True
        )
        async for _ in stream:
            pass
        return stream

    async with contextlib.AsyncExitStack() as stack:
        for client in clients:
            await stack.enter_async_context(client)
        http = await stack.enter_async_context(httpx.AsyncClient(timeout=120))
        async with _server_held(http, plain_vllm):
            # vLLM's own shedding while it is full: a 503 before the stream starts.
            assert await _raw_stream_status(http, plain_vllm) == "503:503"
            calls = [asyncio.ensure_future(read_all(client)) for client in clients]
            # Every stream's first attempt is shed while the filler holds the server.
            deadline = time.monotonic() + 60
            while not all(client.stats().requeues >= 1 for client in clients):
                assert time.monotonic() < deadline, [client.stats() for client in clients]
                await asyncio.sleep(0.02)
        # The server has room again, for one stream at a time: each retry gets in in
        # turn (shed before the stream starts or inside it, as the race goes).
        streams = await asyncio.gather(*calls)
    for stream, client in zip(streams, clients, strict=True):
        assert stream.attempts > 1
        first, last = stream.attempt_history[0], stream.attempt_history[-1]
        assert first.error_type == "ServiceUnavailableError" and first.outcome == "requeued"
        assert last.outcome == "ok"
        assert stream.chunks_received > 0
        stats = client.stats()
        assert stats.retries == 0  # vLLM's sheds are requeues, never retries
        assert {b.state for b in stats.breakers} == {stormguard.CircuitState.CLOSED}


def test_sdk_reads_endpoint_load_metrics_from_plain_vllm(plain_vllm: VllmServer) -> None:
    with stormguard.Client(base_url=plain_vllm.base_url, model=plain_vllm.model) as client:
        resp = client.chat.completions.create(messages=MESSAGES, max_tokens=4)
    assert resp.server_load.kv_cache_usage is not None
    assert resp.server_load.queue_depth is not None
    assert resp.server_load.token_capacity is None  # plain vLLM has no admission budget
