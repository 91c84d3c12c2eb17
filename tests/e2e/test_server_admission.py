"""Admission on the real server: shedding, priorities, deadlines, disconnects, floods."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from stormguard.protocol import ServerLoad
from tests.e2e.raw_http import RawResponse, post_all
from tests.e2e.server_process import RunningServer, wait_for_metric

pytestmark = pytest.mark.e2e

Start = Callable[..., RunningServer]

# The fast test engine admits floor(2048 x 0.9) = 1843 tokens; a holder of
# 8 + 1830 leaves 5, too few for any test request (8 + 4 tokens).
HOLD_TOKENS = 1830


def completion(prompt_words: int, max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": "stormguard-sim",
        "prompt": " ".join(["word"] * prompt_words),
        "max_tokens": max_tokens,
        "ignore_eos": True,
        **extra,
    }


async def hold_budget(client: httpx.AsyncClient, server: RunningServer, tokens: int) -> None:
    """One critical streaming request that keeps ``tokens`` of budget busy until cancelled."""
    body = completion(8, tokens, stream=True)
    async with client.stream(
        "POST", server.url("/v1/completions"), json=body, headers={"x-priority": "critical"}
    ) as response:
        assert response.status_code == 200
        async for _ in response.aiter_bytes():
            pass


@pytest.mark.slow
async def test_flood_keeps_queue_bounded_and_memory_flat(stormguard_server_factory: Start) -> None:
    server = stormguard_server_factory("--max-queue-requests", "64", "--max-queue-wait-s", "30")
    n = 2000
    body = completion(400, 16)

    async def flood() -> list[RawResponse]:
        # Raw connections: an httpx client would spend twice the server's CPU on them.
        return await post_all(server.port, "/v1/completions", body, n=n)

    first = await flood()
    rss_after_first = server.rss_bytes()
    second = await flood()
    rss_after_second = server.rss_bytes()

    for responses in (first, second):
        statuses = collections.Counter(r.status_code for r in responses)
        assert set(statuses) <= {200, 503}, statuses
        assert statuses[200] >= 64  # the queue's worth, plus what ran at once
        depths = [ServerLoad.from_headers(r.headers).queue_depth for r in responses]
        assert max(d for d in depths if d is not None) <= 64
        for shed in (r for r in responses if r.status_code == 503):
            load = ServerLoad.from_headers(shed.headers)
            assert load.load_shed == "queue_full"
            assert load.should_retry is True
            assert load.retry_after is not None and 0.05 <= load.retry_after <= 30
            assert shed.json()["error"]["code"] == "queue_full"
    # Memory: the second flood reuses what the first one grew; no per-request leak.
    assert rss_after_second - rss_after_first < 20 * 1024 * 1024
    metrics = server.metrics()
    assert metrics["stormguard_engine_oom_total"] == 0
    assert metrics["stormguard_queue_depth"] == 0
    assert metrics["stormguard_inflight_tokens"] == 0
    shed_total = sum(v for k, v in metrics.items() if k.startswith("stormguard_shed_total"))
    assert shed_total == sum(r.status_code == 503 for r in (*first, *second))


async def test_priorities_and_retries_are_shed_first(stormguard_server_factory: Start) -> None:
    server = stormguard_server_factory("--max-queue-requests", "2", "--retry-queue-fraction", "1")
    async with httpx.AsyncClient(timeout=30) as client:
        holder = asyncio.create_task(hold_budget(client, server, HOLD_TOKENS))
        await wait_for_metric(server, "stormguard_inflight_tokens", lambda v: v > 0)

        def post(priority: str, attempt: int = 1) -> asyncio.Task[httpx.Response]:
            headers = {"x-priority": priority, "x-stormguard-attempt": str(attempt)}
            return asyncio.create_task(
                client.post(server.url("/v1/completions"), json=completion(8, 4), headers=headers)
            )

        sheddable = post("sheddable")
        retry = post("standard", attempt=2)
        await wait_for_metric(server, "stormguard_queue_depth", lambda v: v == 2)
        # The queue is full: a first-attempt standard request evicts the sheddable one...
        standard = post("standard")
        evicted = await sheddable
        assert evicted.status_code == 503
        assert evicted.headers["x-load-shed"] == "queue_full"
        assert evicted.headers["x-should-retry"] == "true"
        # ...and a critical one evicts the retry, which is told not to come back now.
        critical = post("critical")
        shed_retry = await retry
        assert shed_retry.status_code == 503
        assert shed_retry.headers["x-load-shed"] == "retry_shed"
        assert shed_retry.headers["x-should-retry"] == "false"
        assert int(shed_retry.headers["retry-after"]) >= 1
        # A new sheddable request matters least of all: shed itself, at once.
        late = await post("sheddable")
        assert late.status_code == 503 and late.headers["x-load-shed"] == "queue_full"

        holder.cancel()
        assert (await standard).status_code == 200
        assert (await critical).status_code == 200
    metrics = server.metrics()
    assert metrics['stormguard_shed_total{priority="sheddable",reason="queue_full"}'] == 2
    assert metrics['stormguard_shed_total{priority="standard",reason="retry_shed"}'] == 1
    assert metrics['stormguard_attempts_total{attempt="2"}'] == 1


async def test_expired_and_disconnected_requests_never_reach_the_engine(
    stormguard_server_factory: Start,
) -> None:
    server = stormguard_server_factory()
    async with httpx.AsyncClient(timeout=30) as client:
        holder = asyncio.create_task(hold_budget(client, server, HOLD_TOKENS))
        await wait_for_metric(server, "stormguard_inflight_tokens", lambda v: v > 0)
        engine_before = server.metric("stormguard_engine_requests_total")

        # Deadline 0: refused at once.
        zero = await client.post(
            server.url("/v1/completions"),
            json=completion(8, 4),
            headers={"x-request-deadline-ms": "0"},
        )
        assert zero.status_code == 503 and zero.headers["x-load-shed"] == "deadline"
        assert zero.headers["x-should-retry"] == "false"
        # Refused on arrival, not queued: the message names the decision (a time bound
        # would measure how busy the machine is, not which path refused it).
        assert "has passed" in zero.json()["error"]["message"]

        # A deadline that passes while queued: shed when it passes, never run.
        started = time.monotonic()
        expired = await client.post(
            server.url("/v1/completions"),
            json=completion(8, 4),
            headers={"x-request-deadline-ms": "300"},
        )
        waited = time.monotonic() - started
        assert expired.status_code == 503 and expired.headers["x-load-shed"] == "deadline"
        assert 0.25 <= waited < 2.0

        # A caller that gives up while queued: removed from the queue, never run.
        with pytest.raises(httpx.ReadTimeout):
            await client.post(server.url("/v1/completions"), json=completion(8, 4), timeout=0.3)
        gone = await wait_for_metric(
            server, 'stormguard_client_disconnects_total{stage="queued"}', lambda v: v >= 1
        )
        assert gone == 1
        assert server.metric("stormguard_queue_depth") == 0
        assert server.metric("stormguard_engine_requests_total") == engine_before
        holder.cancel()


async def test_deadline_that_cannot_be_met_is_refused_at_once(
    stormguard_server_factory: Start,
) -> None:
    server = stormguard_server_factory()
    async with httpx.AsyncClient(timeout=30) as client:
        # Measure a drain rate first: a few requests complete.
        for _ in range(3):
            ok = await client.post(server.url("/v1/completions"), json=completion(8, 8))
            assert ok.status_code == 200
        holder = asyncio.create_task(hold_budget(client, server, HOLD_TOKENS))
        await wait_for_metric(server, "stormguard_inflight_tokens", lambda v: v > 0)
        refused = await client.post(
            server.url("/v1/completions"),
            json=completion(8, 100),
            headers={"x-request-deadline-ms": "20"},
        )
        assert refused.status_code == 503
        assert refused.headers["x-load-shed"] == "deadline"
        # Refused on arrival from the estimated wait, not queued until the deadline
        # passed ("deadline passed while queued"): the message names the decision.
        assert "cannot be met" in refused.json()["error"]["message"]
        holder.cancel()


async def test_running_request_whose_client_leaves_is_aborted(
    stormguard_server_factory: Start,
) -> None:
    server = stormguard_server_factory()
    async with httpx.AsyncClient(timeout=30) as client:
        async with client.stream(
            "POST", server.url("/v1/completions"), json=completion(8, 1500, stream=True)
        ) as response:
            chunks = 0
            async for _ in response.aiter_lines():
                chunks += 1
                if chunks > 10:
                    break
        # Within about one engine step the engine drops it and frees its KV blocks.
        aborted = await wait_for_metric(
            server, "stormguard_engine_requests_aborted_total", lambda v: v >= 1, timeout=2
        )
        assert aborted == 1
        assert server.metric("stormguard_running_requests") == 0
        assert server.metric("stormguard_kv_cache_usage_ratio") == 0
        assert server.metric("stormguard_inflight_tokens") == 0
        assert server.metric('stormguard_client_disconnects_total{stage="running"}') == 1
        assert 0 < server.metric("stormguard_gone_client_tokens_total") < 1500

        # Same for a non-streaming request whose caller times out mid-generation.
        with pytest.raises(httpx.ReadTimeout):
            await client.post(server.url("/v1/completions"), json=completion(8, 1500), timeout=0.3)
        aborted = await wait_for_metric(
            server, "stormguard_engine_requests_aborted_total", lambda v: v >= 2, timeout=2
        )
        assert aborted == 2


async def test_openai_retries_stop_at_the_first_shed_retry(
    stormguard_server_factory: Start,
) -> None:
    """openai-python (3 retries allowed) honours Retry-After and x-should-retry: one retry
    reaches the server, is shed as retry_shed with x-should-retry false, and openai stops."""
    import openai

    server = stormguard_server_factory("--max-queue-requests", "2")
    async with httpx.AsyncClient(timeout=30) as client:
        holder = asyncio.create_task(hold_budget(client, server, HOLD_TOKENS))
        await wait_for_metric(server, "stormguard_inflight_tokens", lambda v: v > 0)
        queued = [
            asyncio.create_task(client.post(server.url("/v1/completions"), json=completion(8, 4)))
            for _ in range(2)
        ]
        await wait_for_metric(server, "stormguard_queue_depth", lambda v: v == 2)

        caller = openai.AsyncOpenAI(base_url=server.base_url, api_key="t", max_retries=3)
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as refused:
            await caller.completions.create(
                model="stormguard-sim",
                prompt="please",
                max_tokens=4,
                extra_headers={"x-priority": "sheddable"},
            )
        elapsed = time.monotonic() - started
        await caller.close()
        assert refused.value.status_code == 503
        assert refused.value.response.headers["x-load-shed"] == "retry_shed"
        assert refused.value.response.headers["x-should-retry"] == "false"
        # It waited the server's Retry-After (1 s before any drain was measured) once.
        assert 0.9 <= elapsed < 5
        holder.cancel()
        for task in queued:
            assert (await task).status_code == 200
    metrics = server.metrics()
    # the holder, the 2 queued, openai's first attempt
    assert metrics['stormguard_attempts_total{attempt="1"}'] == 4
    assert metrics['stormguard_attempts_total{attempt="2"}'] == 1
    assert 'stormguard_attempts_total{attempt="3"}' not in metrics
