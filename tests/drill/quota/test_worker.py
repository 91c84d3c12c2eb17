"""A quota worker process's pool: W threads (or tasks) take the process's calls one after
another; the batch starts none after it gives up, and those are failures."""

from __future__ import annotations

import asyncio
import threading
import time

from stormguard_drill.quota.records import NOT_STARTED
from stormguard_drill.quota.worker import QuotaJob, run_tasks, run_threads
from stormguard_drill.records import LogicalResult
from stormguard_drill.workload import Arrival


def _arrivals(n: int) -> list[Arrival]:
    return [
        Arrival(index=i, at_s=0.0, kind="medium", prompt=f"p{i}", max_tokens=8) for i in range(n)
    ]


def _done(arrival: Arrival) -> LogicalResult:
    return LogicalResult(arrival.index, arrival.kind, 0.0, 0.1, True, 8, 0.05, 1, None)


def test_threads_run_every_call_with_at_most_w_at_once() -> None:
    running = peak = 0
    lock = threading.Lock()
    three_in = threading.Barrier(3, timeout=10)  # three workers must be in calls together

    def call(arrival: Arrival) -> LogicalResult:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        if arrival.index < 3:
            three_in.wait()
        with lock:
            running -= 1
        return _done(arrival)

    results = run_threads(_arrivals(12), 3, time.monotonic() + 60, time.monotonic(), call)

    assert [r.index for r in results] == list(range(12))  # sorted by call
    assert all(r.ok for r in results)
    assert peak == 3


def test_threads_start_nothing_after_the_batch_gives_up() -> None:
    gave_up = threading.Event()
    t0 = time.monotonic()

    def call(arrival: Arrival) -> LogicalResult:
        gave_up.wait(10)  # the first call outlasts the give-up time
        return _done(arrival)

    give_up_at = time.monotonic() + 0.05
    threading.Timer(0.1, gave_up.set).start()
    results = run_threads(_arrivals(5), 1, give_up_at, t0, call)

    assert [r.ok for r in results] == [True, False, False, False, False]
    late = results[1:]
    assert {r.error for r in late} == {NOT_STARTED}
    assert all(r.app_calls == 0 and r.start_s == r.end_s >= 0.05 for r in late)


async def test_tasks_run_every_call_with_at_most_w_at_once() -> None:
    running = peak = 0
    all_in = asyncio.Event()

    async def call(arrival: Arrival) -> LogicalResult:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        if running == 4:
            all_in.set()
        await all_in.wait()
        running -= 1
        return _done(arrival)

    t0 = time.monotonic()
    results = await run_tasks(_arrivals(10), 4, t0 + 60, t0, call)

    assert [r.index for r in results] == list(range(10))
    assert peak == 4


async def test_tasks_start_nothing_after_the_batch_gives_up() -> None:
    t0 = time.monotonic()
    results = await run_tasks(_arrivals(3), 2, t0 - 1, t0, lambda a: asyncio.sleep(0, _done(a)))
    assert [r.error for r in results] == [NOT_STARTED] * 3


def test_a_job_survives_its_json_line() -> None:
    job = QuotaJob(
        client="litellm-router+redis",
        process=1,
        base_url="http://127.0.0.1:1/v1",
        warmup_url="http://127.0.0.1:2/v1",
        workers=8,
        deadline_s=120.0,
        give_up_after_s=300.0,
        tpm=60_000,
        rpm=3_000,
        arrivals=_arrivals(2),
        redis_host="127.0.0.1",
        redis_port=6380,
    )
    again = QuotaJob.from_json(job.to_json())
    assert again == job
    assert again.redis == ("127.0.0.1", 6380)
    assert again.limits.tpm == 60_000


def test_the_stormguard_redis_rows_share_the_key_s_bucket_in_the_run_s_redis() -> None:
    from stormguard_drill.quota.client_names import REDIS_CLIENTS, THREADED_CLIENTS
    from stormguard_drill.quota.clients import SyncStormguardClient, make_async_quota_client
    from stormguard_drill.quota.config import QuotaLimits

    assert {"stormguard-sync+redis", "stormguard-async+redis"} <= REDIS_CLIENTS
    assert "stormguard-sync+redis" in THREADED_CLIENTS
    limits = QuotaLimits(tpm=60_000, rpm=3_000)
    url = "http://127.0.0.1:1/v1"
    shared = make_async_quota_client("stormguard-async+redis", url, 10.0, limits, ("h", 6380))
    alone = make_async_quota_client("stormguard-async", url, 10.0, limits, ("h", 6380))
    sync = SyncStormguardClient(url, 10.0, redis=("h", 6380))
    try:
        policies = [c._client._core.quota.policy for c in (shared, alone, sync)]  # type: ignore[attr-defined]
        assert [p.redis_url for p in policies] == ["redis://h:6380/0", None, "redis://h:6380/0"]
    finally:
        asyncio.run(shared.aclose())
        asyncio.run(alone.aclose())
        sync.close()
