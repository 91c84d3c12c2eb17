"""The quota shared in a real redis-server (``QuotaPolicy(redis_url=...)``), against the
reference server's hosted-API quota without headers (429s only, whole-second
Retry-After): several processes on one key finish every call with ~no 429s; Redis
killed mid-run: the calls go on, paced locally, with one WARNING, and come back to
Redis when it answers again.

Each test starts its own redis-server on a free loopback port (no persistence) and
stops it (tests/e2e/redis_server.py); without redis-server they skip, except in CI.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import re
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import stormguard
from tests.e2e.redis_server import RedisServer, running_redis, start_redis
from tests.e2e.server_process import RunningServer, run_server

pytestmark = pytest.mark.e2e

KEY = "sk-e2e-shared-quota-key"
MODEL = "stormguard-sim"
MESSAGES = [{"role": "user", "content": "Summarize the report."}]
#: 12,000 tokens a minute (200 a second); each call is charged ~210 (its ~10 prompt
#: tokens and 200 max_tokens): the bucket holds ~57 calls, then ~1 a second.
TPM = 12_000
MAX_TOKENS = 200
PROCESSES = 3
THREADS = 4
CALLS = 22  # per process: 66 in all, ~9 past the bucket


def quota_server(*extra: str) -> Any:
    return run_server(
        "--quota-tpm",
        str(TPM),
        "--no-quota-headers",
        "--quota-retry-after",
        "seconds",
        # ~0.1 s answers whatever their length, and room for every call at once: the
        # time is the quota's, not the simulated engine's.
        "--added-latency-ms",
        "100",
        "--step-base-ms",
        "0",
        "--prefill-token-us",
        "0",
        "--decode-seq-us",
        "0",
        "--num-kv-blocks",
        "8192",
        "--max-num-seqs",
        "256",
        *extra,
    )


def server_counts(server: RunningServer) -> tuple[float, float]:
    """Requests the key's quota admitted, and its 429s."""
    samples = server.metrics()

    def total(name: str) -> float:
        return sum(v for k, v in samples.items() if re.match(rf"stormguard_{name}_total\{{", k))

    return total("quota_admitted"), total("quota_refused")


def worker(base_url: str, redis_url: str, calls: int, threads: int, start_at: float) -> dict:
    """One process of the batch (spawned): ``calls`` chat calls on ``threads`` threads."""
    client = stormguard.Client(
        base_url=base_url,
        api_key=KEY,
        model=MODEL,
        timeout=90.0,
        quota=stormguard.QuotaPolicy(redis_url=redis_url),
    )
    outcomes: Counter[str] = Counter()

    def one(_: int) -> None:
        try:
            client.chat.completions.create(messages=MESSAGES, max_tokens=MAX_TOKENS)
            outcomes["ok"] += 1
        except stormguard.StormguardError as exc:
            outcomes[type(exc).__name__] += 1

    time.sleep(max(0.0, start_at - time.time()))  # every process starts at once
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(calls)))
    stats = client.stats()
    client.close()
    return {
        "outcomes": dict(outcomes),
        "attempts": stats.attempts,
        "backends": [q.backend for q in stats.quota],
    }


def test_processes_on_one_key_share_its_bucket_in_redis_without_429s() -> None:
    with running_redis() as redis, quota_server() as server:
        start_at = time.time() + 3.0  # time for every process to start and import
        jobs = [(server.base_url, redis.url, CALLS, THREADS, start_at)] * PROCESSES
        with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
            results = pool.starmap(worker, jobs)
        wall = time.time() - start_at
        admitted, refused = server_counts(server)
    calls = PROCESSES * CALLS
    ok = sum(r["outcomes"].get("ok", 0) for r in results)
    attempts = sum(r["attempts"] for r in results)
    assert ok == calls, results
    assert all(r["backends"] == ["redis"] for r in results), results
    assert admitted == calls
    # The first 429 anywhere teaches every process: only the calls already on their
    # way when it came, and a few paced retries, are refused (measured: 5 of 66 on
    # an instant engine; without Redis each process meets its own, again and again).
    assert refused <= 8, (refused, attempts)
    assert attempts == calls + refused
    assert wall < 60, wall  # ~9 calls past the bucket at ~1 a second


def test_redis_killed_mid_run_calls_go_on_locally_with_one_warning_and_come_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="stormguard")
    redis = start_redis()
    try:
        with quota_server() as server:
            client = stormguard.Client(
                base_url=server.base_url,
                api_key=KEY,
                model=MODEL,
                timeout=60.0,
                quota=stormguard.QuotaPolicy(redis_url=redis.url),
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

            batch(8)
            assert client.stats().quota[0].backend == "redis"
            redis.kill()
            batch(8)  # Redis gone: refused connections, then its back-off
            assert client.stats().quota[0].backend == "local-fallback"
            warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert len(warnings) == 1, caplog.text
            assert f"127.0.0.1:{redis.port}" in warnings[0].getMessage()
            redis = restart_on(redis.port)
            deadline = time.monotonic() + 40  # the back-off: 1 s, then 2, 4... jittered
            while client.stats().quota[0].backend != "redis":
                assert time.monotonic() < deadline, caplog.text
                batch(2)
                time.sleep(0.2)
            client.close()
        assert errors == [] and done["ok"] >= 18
        assert "answers again" in caplog.text
        assert sum(r.levelno >= logging.WARNING for r in caplog.records) == 1
    finally:
        redis.stop()


def restart_on(port: int) -> RedisServer:
    """A new redis-server on ``port`` (the old one's, now free)."""
    for _ in range(50):
        try:
            return start_redis(port=port)
        except RuntimeError:
            time.sleep(0.1)
    raise RuntimeError(f"redis-server did not start again on port {port}")


async def test_async_clients_of_two_processes_share_one_bucket() -> None:
    # Two registries (two policies) stand for two processes; redis.asyncio on one loop.
    with running_redis() as redis, quota_server() as server:
        clients = [
            stormguard.AsyncClient(
                base_url=server.base_url,
                api_key=KEY,
                model=MODEL,
                timeout=60.0,
                quota=stormguard.QuotaPolicy(redis_url=redis.url, max_keys=1024 - i),
            )
            for i in range(2)
        ]

        async def one(client: stormguard.AsyncClient) -> None:
            await client.chat.completions.create(messages=MESSAGES, max_tokens=MAX_TOKENS)

        await asyncio.gather(*(one(clients[i % 2]) for i in range(62)))
        admitted, refused = server_counts(server)
        for client in clients:
            assert client.stats().quota[0].backend == "redis"
            await client.close()
    # 62 calls at once on an instant engine, before any limit is known: the ~6 past the
    # bucket are refused at once, and their paced retries met 429s again (measured:
    # 18-19 in all, at most a third of the calls; see docs/quotas.md, "Not done").
    assert admitted == 62 and refused <= 21
