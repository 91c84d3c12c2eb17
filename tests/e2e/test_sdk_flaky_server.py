"""The SDK end to end against a real HTTP server on 127.0.0.1 that misbehaves on demand."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import stormguard
from stormguard import RetryBudget
from stormguard.testing import FakeClock
from tests.e2e.flaky_server import FlakyServer, running, wait_for
from tests.sdk.helpers import local, own_pools

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "ping"}]


@pytest.fixture(scope="module")
def server() -> Iterator[FlakyServer]:
    yield from running()


@pytest.fixture(autouse=True)
def _fresh(server: FlakyServer) -> None:
    server.reset()


def pool_requests(client: stormguard.Client | stormguard.AsyncClient) -> int:
    """Requests httpcore still holds (in flight or waiting), and those the pool's
    shards still count as in flight; on aiohttp (``make test-aiohttp``), the
    connector's connections in use: 0 once nothing leaked."""
    shards = getattr(local(client._http._transport), "shards", ())
    held = sum(_held(pool) for pool in own_pools(client))
    return int(held + sum(shard.in_flight for shard in shards))


def _held(pool: Any) -> int:
    inner = getattr(pool, "_pool", None)
    if inner is not None:  # httpcore's pool
        return len(inner._requests)
    session = pool._session  # aiohttp's (_io/aiohttp_transport.py)
    connector = None if session is None else session.connector
    return 0 if connector is None else len(connector._acquired)


def run_calls(client: stormguard.Client, n: int, workers: int = 4) -> tuple[int, int]:
    """n calls from ``workers`` threads; (successes, failures)."""
    results: list[bool] = []
    lock = threading.Lock()

    def worker(count: int) -> None:
        for _ in range(count):
            try:
                client.chat.completions.create(messages=MESSAGES, max_tokens=4)
                ok = True
            except stormguard.StormguardError:  # open breakers fail fast, without I/O
                ok = False
            with lock:
                results.append(ok)

    threads = [threading.Thread(target=worker, args=(n // workers,)) for _ in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(results), len(results) - sum(results)


def test_plain_calls_sync(server: FlakyServer) -> None:
    with stormguard.Client(base_url=server.base_url, model="e2e") as client:
        resp = client.chat.completions.create(messages=MESSAGES)
        assert resp.choices[0].message.content == "pong"
        assert resp.server_load.queue_depth == 0
        chunks = list(client.chat.completions.create(messages=MESSAGES, stream=True))
        assert "".join(c.choices[0].delta.content for c in chunks) == "t0 t1 t2 "
        assert [m.max_model_len for m in client.models.list()] == [4096]
    assert server.seen.attempts == {1: 2}


async def test_plain_calls_async(server: FlakyServer) -> None:
    async with stormguard.AsyncClient(base_url=server.base_url, model="e2e") as client:
        resp = await client.chat.completions.create(messages=MESSAGES)
        assert resp.choices[0].message.content == "pong"
        stream = await client.chat.completions.create(messages=MESSAGES, stream=True)
        assert len([c async for c in stream]) == 3


def test_transient_503s_are_ridden_out(server: FlakyServer) -> None:
    server.reset(error_rate=0.2, retry_after_ms=10)
    # A budget sized for a 20% transient error rate (first retries ~0.2 per call,
    # second ~0.04): the default 10% deliberately lets an error rate above 10%
    # surface instead of masking it with load (see docs/retries.md).
    budget = RetryBudget(ratio=0.3)
    with stormguard.Client(base_url=server.base_url, model="e2e", retry_budget=budget) as client:
        ok, failed = run_calls(client, 300)
        stats = client.stats()
    # Nearly all: what fails is the first few calls of a cold budget (deposits not
    # yet made) and the 0.8% that fail three attempts in a row.
    assert ok >= 0.95 * 300, (ok, failed)
    assert server.seen.requests == stats.attempts
    assert 1.15 < stats.retry_amplification < 1.35


def test_transient_503s_with_default_budget_stay_within_it(server: FlakyServer) -> None:
    server.reset(error_rate=0.2, retry_after_ms=10)
    with stormguard.Client(base_url=server.base_url, model="e2e") as client:
        ok, _ = run_calls(client, 200)
        stats = client.stats()
    # 80% succeed at once; the rest are sheds ("overloaded" 503s), requeued from the
    # limiter's budget (5% + floor), then retried from the retry budget (10% + floor).
    assert ok >= 170
    assert stats.retry_amplification <= 1 + 0.1 + 0.05 + 2.0 / 200 + 1e-9


def test_full_outage_amplification_stays_within_the_budget(server: FlakyServer) -> None:
    server.reset(outage=True, retry_after_ms=5)
    # The budget alone (breaker off): the breaker would stop the calls even sooner.
    with stormguard.Client(base_url=server.base_url, model="e2e", breaker=None) as client:
        ok, failed = run_calls(client, 100)
        stats = client.stats()
        assert pool_requests(client) == 0  # 100 failed calls and their retries leaked nothing
    assert (ok, failed) == (0, 100)
    # At the server, from the attempt headers: 100 first attempts, retries only as budgeted.
    assert server.seen.attempts[1] == 100
    retries = server.seen.requests - 100
    assert retries <= 0.1 * 100 + 0.1 * 10  # ratio * calls + floor * window
    assert stats.retry_amplification == server.seen.requests / 100
    assert stats.retries_refused_by_budget >= 100 - retries - 1


def test_full_outage_breaker_fails_fast_then_recovers(server: FlakyServer) -> None:
    server.reset(outage=True, retry_after_ms=5)
    breaker = stormguard.BreakerConfig(consecutive_failures=5, open_time=0.3, jitter=0.0)
    # The breaker's open time runs on a fake clock: on a busy machine the 100 calls
    # may take longer than 0.3 s of real time, which would let probes through (and
    # lengthen the open time) in the middle of the outage.
    clock = FakeClock()
    with stormguard.Client(
        base_url=server.base_url, model="e2e", breaker=breaker, clock=clock
    ) as client:
        ok, failed = run_calls(client, 100, workers=1)
        assert (ok, failed) == (0, 100)
        assert server.seen.requests <= 6  # 5 to trip it (+1 budgeted retry), then none
        server.reset(outage=False)
        clock.advance(0.35)  # the open time passes: the next call is a half-open probe
        ok, failed = run_calls(client, 20, workers=1)
    assert (ok, failed) == (20, 0)
    assert server.seen.requests == 20


def test_slow_server_hits_the_total_deadline(server: FlakyServer) -> None:
    server.reset(delay=3.0)
    with stormguard.Client(base_url=server.base_url, model="e2e", timeout=0.5) as client:
        started = time.monotonic()
        with pytest.raises(stormguard.APITimeoutError) as info:
            client.chat.completions.create(messages=MESSAGES)
        elapsed = time.monotonic() - started
    assert elapsed < 1.5  # one deadline for the call, not one per attempt
    assert info.value.retry_stopped_by == "deadline"


async def test_async_slow_server_hits_the_total_deadline(server: FlakyServer) -> None:
    server.reset(delay=3.0)
    async with stormguard.AsyncClient(base_url=server.base_url, model="e2e", timeout=0.5) as client:
        started = time.monotonic()
        with pytest.raises(stormguard.APITimeoutError):
            await client.chat.completions.create(messages=MESSAGES)
    assert time.monotonic() - started < 1.5


async def test_cancelled_task_mid_stream_closes_the_connection(server: FlakyServer) -> None:
    server.reset(stream_chunks=200, stream_interval=0.02)
    got: list[str] = []
    three_chunks = asyncio.Event()
    async with stormguard.AsyncClient(base_url=server.base_url, model="e2e") as client:

        async def consume() -> None:
            stream = await client.chat.completions.create(messages=MESSAGES, stream=True)
            async for chunk in stream:
                got.append(chunk.choices[0].delta.content)
                if len(got) == 3:
                    three_chunks.set()

        task = asyncio.create_task(consume())
        await asyncio.wait_for(three_chunks.wait(), timeout=5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        disconnected = await asyncio.to_thread(
            wait_for, lambda: server.seen.streams_disconnected == 1, 3.0
        )
        assert pool_requests(client) == 0
        assert asyncio.all_tasks() == {asyncio.current_task()}
    assert disconnected, "the server never saw the client go away"
    assert server.seen.streams_finished == 0
    assert len(got) < 50


async def test_deadline_mid_stream_closes_the_connection(server: FlakyServer) -> None:
    server.reset(stream_chunks=200, stream_interval=0.02)
    async with stormguard.AsyncClient(base_url=server.base_url, model="e2e", timeout=0.4) as client:
        stream = await client.chat.completions.create(messages=MESSAGES, stream=True)
        with pytest.raises(stormguard.APITimeoutError):
            async for _ in stream:
                pass
        assert await asyncio.to_thread(wait_for, lambda: server.seen.streams_disconnected == 1, 3.0)
        assert pool_requests(client) == 0


def test_closing_a_sync_stream_closes_the_connection(server: FlakyServer) -> None:
    server.reset(stream_chunks=200, stream_interval=0.02)
    with stormguard.Client(base_url=server.base_url, model="e2e") as client:
        stream = client.chat.completions.create(messages=MESSAGES, stream=True)
        for i, _ in enumerate(stream):
            if i == 2:
                break
        stream.close()
        assert wait_for(lambda: server.seen.streams_disconnected == 1, 3.0)
        assert pool_requests(client) == 0
    assert server.seen.streams_finished == 0
