"""The quota shared in a real redis-server (``QuotaPolicy(redis_url=...)``), against the
reference server's hosted-API quota without headers (429s only, whole-second
Retry-After): several processes on one key finish every call, and only the first wave
(the calls on their way when the first 429 taught the shared bucket the limit) meets a
429; Redis killed mid-run: the calls go on, paced locally, with one WARNING, and come
back to Redis when it answers again.

Each test starts its own redis-server on a free loopback port (no persistence) and
stops it (the drill's helper, bench/stormguard_drill/redis_server.py); without
redis-server they skip, except in CI (tests/e2e/conftest.py).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

import stormguard
from stormguard_drill.redis_server import RedisServer
from tests.e2e.conftest import start_redis_or_skip
from tests.e2e.quota_batch import (
    MAX_TOKENS,
    MESSAGES,
    MODEL,
    PROCESSES,
    THREADS,
    TPM,
    ideal_s,
    run_batch,
    server_counts,
)
from tests.e2e.quota_batch import quota_server as batch_server
from tests.e2e.server_process import RunningServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: The most one Redis call may take. The default (0.5 s) is a production budget: on
#: this shared 2-core machine a burst of asks can take longer, and the call then paces
#: locally (the fall-back, tested below) instead of on the shared bucket under test.
REDIS_TIMEOUT = 5.0


@pytest.fixture(scope="module")
def quota_server() -> Iterator[RunningServer]:
    """One server for the module: each test calls on a key of its own (a quota of its own)."""
    with batch_server() as server:
        yield server


def shared(redis_url: str) -> stormguard.QuotaPolicy:
    return stormguard.QuotaPolicy(redis_url=redis_url, redis_timeout=REDIS_TIMEOUT)


def test_processes_on_one_key_share_its_bucket_in_redis(
    quota_server: RunningServer, redis_server: RedisServer
) -> None:
    batch = run_batch(quota_server, shared(redis_server.url), "sk-e2e-shared-quota-processes")
    batch.check_every_call_paced()
    assert all(r["backends"] == ["redis"] for r in batch.results), batch.results
    # Only the first wave may be refused: the calls already on their way when the first
    # 429 anywhere taught the shared bucket the limit, at most one per thread. Every
    # call the bucket granted after that finds its room (each process alone meets its
    # own 429s, again and again: docs/quotas.md).
    assert batch.refused <= PROCESSES * THREADS, (batch.refused, batch.attempts)
    # The bucket is charged the estimate (the body's bytes / 4 + max_tokens, a little
    # above the server's charge) and paces no faster than the key: within 1.5 x the
    # least time, and 2 s for the start-up and the first wave's pause.
    assert batch.wall < 1.5 * ideal_s(batch.calls, batch.charged / batch.calls) + 2.0


def test_redis_killed_mid_run_calls_go_on_locally_with_one_warning_and_come_back(
    quota_server: RunningServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="stormguard")
    redis = start_redis_or_skip()
    client = stormguard.Client(
        base_url=quota_server.base_url,
        api_key="sk-e2e-shared-quota-killed",
        model=MODEL,
        timeout=60.0,
        quota=shared(redis.url),
    )
    errors: list[BaseException] = []
    done = Counter[str]()
    lock = threading.Lock()

    def one() -> None:
        try:
            client.chat.completions.create(messages=MESSAGES, max_tokens=10)
            with lock:
                done["ok"] += 1
        except BaseException as exc:  # every error counts against the test
            errors.append(exc)

    def batch(n: int) -> None:
        with ThreadPoolExecutor(4) as pool:
            for future in [pool.submit(one) for _ in range(n)]:
                future.result()

    try:
        batch(8)
        assert client.stats().quota[0].backend == "redis"
        redis.kill()
        batch(8)  # Redis gone: refused connections, then its back-off
        assert client.stats().quota[0].backend == "local-fallback"
        warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert len(warnings) == 1, caplog.text
        assert f"127.0.0.1:{redis.port}" in warnings[0].getMessage()
        redis.stop()
        redis = start_redis_or_skip(port=redis.port)  # where the client looks for it
        deadline = time.monotonic() + 40  # the back-off: 1 s, then 2, 4... jittered
        while client.stats().quota[0].backend != "redis":
            assert time.monotonic() < deadline, caplog.text
            batch(2)
            time.sleep(0.2)
    finally:
        client.close()
        redis.stop()
    assert errors == [] and done["ok"] >= 18
    assert "answers again" in caplog.text
    assert sum(r.levelno >= logging.WARNING for r in caplog.records) == 1


async def test_async_clients_of_two_processes_share_one_bucket(
    quota_server: RunningServer, redis_server: RedisServer
) -> None:
    # Two registries (two policies) stand for two processes; redis.asyncio on one loop.
    key = "sk-e2e-shared-quota-async"
    clients = [
        stormguard.AsyncClient(
            base_url=quota_server.base_url,
            api_key=key,
            model=MODEL,
            timeout=60.0,
            quota=stormguard.QuotaPolicy(
                redis_url=redis_server.url, redis_timeout=REDIS_TIMEOUT, max_keys=1024 - i
            ),
        )
        for i in range(2)
    ]

    async def one(client: stormguard.AsyncClient) -> int:
        result = await client.chat.completions.create(messages=MESSAGES, max_tokens=MAX_TOKENS)
        return result.call_info.paced_429s

    paced = await asyncio.gather(*(one(clients[i % 2]) for i in range(62)))
    admitted, refused, charged = server_counts(quota_server, key)
    for client in clients:
        assert client.stats().quota[0].backend == "redis"
        await client.close()
    # 62 calls at once before any limit is known: a full bucket takes 55 (12,000 / 215),
    # and the 7 past it (the first wave) are refused; their paced retries, and every
    # call after, find their room in the shared bucket. Beside a CPU hog, once in ~12
    # runs one retry found the server's bucket a few tokens short of Redis's (their
    # clocks read apart under load) and met one more 429: room for two.
    assert admitted == 62 and charged == 62 * 215
    assert refused <= 62 - TPM // 215 + 2, paced
    assert sum(paced) == refused
