"""One worker process of the quota scenario's batch: its share of the calls, through its
own client, in W threads or tasks.

``python -m stormguard_drill.quota.worker``, started by the quota runner, which talks
to it as the fleet's runner talks to its workers (``worker_pipe.py``):

1. the runner writes the job (``QuotaJob``): which client, the server, this process's
   calls, its workers, each call's deadline, the key's limits (LiteLLM's deployment is
   given them) and, for the Redis row, the run's Redis;
2. the worker makes one call through a throwaway client of the same kind on the
   warm-up server (no quota there: imports and first-call costs stay out of the run),
   builds its real client and writes ``{"ready": true}``;
3. the runner writes ``{"t0": ...}`` (a ``time.monotonic()`` value, the machine's
   clock); at t0 each of the W workers takes the next call of the process's share and
   runs it to its end, then the next, until none is left or the batch gives up
   (``give_up_after_s``: calls not started by then are failures, "not started");
4. the worker writes its results (``QuotaWorkerResult``) and exits.

A call succeeds when its client returns a whole answer within its deadline. Tasks
get the drill's own caller (``app.run_logical``: the caller gives up at the deadline,
the client's ``timeout`` is the deadline too); a thread cannot be cut short, so a
threaded call is given the deadline as its client's ``timeout`` and an answer that
comes after it counts as a failure ("deadline").
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field

from stormguard_drill.app import DEADLINE, run_logical
from stormguard_drill.clients.drill_client import CallOutcome, DrillClient
from stormguard_drill.config import Patience
from stormguard_drill.quota.client_names import REDIS_CLIENTS, THREADED_CLIENTS, QuotaClientName
from stormguard_drill.quota.clients import SyncStormguardClient, make_async_quota_client
from stormguard_drill.quota.config import QuotaLimits
from stormguard_drill.quota.records import NOT_STARTED
from stormguard_drill.records import LogicalResult
from stormguard_drill.worker_pipe import claim_stdout, send
from stormguard_drill.workload import Arrival


@dataclass(frozen=True, slots=True)
class QuotaJob:
    """What one worker process runs."""

    client: QuotaClientName
    process: int
    base_url: str
    warmup_url: str
    workers: int
    deadline_s: float
    give_up_after_s: float  # from t0: start no call after it
    tpm: int
    rpm: int
    arrivals: list[Arrival]
    redis_host: str | None = None
    redis_port: int | None = None
    stream: bool = False  # streamed calls, or whole answers (a batch job's)
    #: This pairing's directory of the machine's shared quota buckets: a pairing never
    #: finds the buckets of the one before it (whose server had the same key).
    quota_dir: str | None = None

    @property
    def limits(self) -> QuotaLimits:
        return QuotaLimits(tpm=self.tpm, rpm=self.rpm)

    @property
    def redis(self) -> tuple[str, int] | None:
        if self.redis_host is None or self.redis_port is None:
            return None
        return self.redis_host, self.redis_port

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> QuotaJob:
        raw = json.loads(text)
        raw["arrivals"] = [Arrival(**a) for a in raw["arrivals"]]
        return cls(**raw)


@dataclass
class QuotaWorkerResult:
    """One process's calls, and its client's own counts."""

    process: int
    results: list[LogicalResult]
    client_attempts: int | None
    client_stats: dict[str, float] = field(default_factory=dict)
    cpu_s: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> QuotaWorkerResult:
        raw = json.loads(text)
        raw["results"] = [LogicalResult(**r) for r in raw["results"]]
        return cls(**raw)


def not_started(arrival: Arrival, at_s: float) -> LogicalResult:
    """A call the batch gave up on before any worker started it."""
    return LogicalResult(
        index=arrival.index,
        kind=arrival.kind,
        start_s=at_s,
        end_s=at_s,
        ok=False,
        completion_tokens=0,
        first_token_s=None,
        app_calls=0,
        error=NOT_STARTED,
    )


def _warmup_arrival(job: QuotaJob) -> Arrival:
    return job.arrivals[0] if job.arrivals else _WARMUP


_WARMUP = Arrival(index=-1, at_s=0.0, kind="medium", prompt="warm up", max_tokens=4)


def _wait_for_t0() -> float:
    """``{"ready": true}`` sent: the runner's t0, slept until."""
    t0 = float(json.loads(sys.stdin.readline())["t0"])
    time.sleep(max(0.0, t0 - time.monotonic()))
    return t0


# -- threads: stormguard.Client -------------------------------------------------------


def _call_in_thread(
    client: SyncStormguardClient, arrival: Arrival, deadline_s: float, t0: float
) -> LogicalResult:
    start = time.monotonic()
    try:
        outcome = client.call(arrival)
    except Exception as exc:  # anything a client lets escape is a failed call to the app
        outcome = CallOutcome(ok=False, error=type(exc).__name__)
    end = time.monotonic()
    late = outcome.ok and end - start > deadline_s
    ok = outcome.ok and not late
    first = outcome.first_token_at if ok else None
    return LogicalResult(
        index=arrival.index,
        kind=arrival.kind,
        start_s=start - t0,
        end_s=end - t0,
        ok=ok,
        completion_tokens=outcome.completion_tokens if ok else 0,
        first_token_s=None if first is None else first - t0,
        app_calls=1,
        error=DEADLINE if late else outcome.error,
    )


def run_threads(
    arrivals: list[Arrival],
    workers: int,
    give_up_at: float,
    t0: float,
    call: Callable[[Arrival], LogicalResult],
) -> list[LogicalResult]:
    """``workers`` threads, each taking the next arrival until none is left or
    ``give_up_at`` (monotonic) has passed; the calls not started are failures."""
    pending = deque(arrivals)
    lock = threading.Lock()
    results: list[LogicalResult] = []

    def take() -> Arrival | None:
        with lock:
            if pending and time.monotonic() < give_up_at:
                return pending.popleft()
            return None

    def worker() -> None:
        while (arrival := take()) is not None:
            results.append(call(arrival))  # list.append is atomic

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stopped = max(0.0, time.monotonic() - t0)
    return sorted([*results, *(not_started(a, stopped) for a in pending)], key=_index)


def _index(result: LogicalResult) -> int:
    return result.index


def _run_sync(job: QuotaJob) -> QuotaWorkerResult:
    warm = SyncStormguardClient(job.warmup_url, job.deadline_s, stream=job.stream)
    try:
        warm.call(_warmup_arrival(job))
    finally:
        warm.close()
    redis = job.redis if job.client in REDIS_CLIENTS else None
    client = SyncStormguardClient(job.base_url, job.deadline_s, stream=job.stream, redis=redis)
    try:
        send({"ready": True})
        t0 = _wait_for_t0()
        cpu0 = time.process_time()
        results = run_threads(
            job.arrivals,
            job.workers,
            t0 + job.give_up_after_s,
            t0,
            lambda arrival: _call_in_thread(client, arrival, job.deadline_s, t0),
        )
        return QuotaWorkerResult(
            process=job.process,
            results=results,
            client_attempts=client.attempts(),
            client_stats=client.stats(),
            cpu_s=round(time.process_time() - cpu0, 2),
        )
    finally:
        client.close()


# -- tasks: every other client ----------------------------------------------------------


async def run_tasks(
    arrivals: list[Arrival],
    workers: int,
    give_up_at: float,
    t0: float,
    call: Callable[[Arrival], Awaitable[LogicalResult]],
) -> list[LogicalResult]:
    """``workers`` tasks, each awaiting the next arrival's call until none is left or
    ``give_up_at`` (monotonic) has passed; the calls not started are failures."""
    pending = deque(arrivals)
    results: list[LogicalResult] = []

    async def worker() -> None:
        while pending and time.monotonic() < give_up_at:
            arrival = pending.popleft()
            results.append(await call(arrival))

    await asyncio.gather(*(worker() for _ in range(workers)))
    stopped = max(0.0, time.monotonic() - t0)
    return sorted([*results, *(not_started(a, stopped) for a in pending)], key=_index)


def _async_client(job: QuotaJob, base_url: str) -> DrillClient:
    return make_async_quota_client(
        job.client, base_url, job.deadline_s, job.limits, job.redis, stream=job.stream
    )


async def _run_async(job: QuotaJob) -> QuotaWorkerResult:
    warm = _async_client(job, job.warmup_url)
    try:
        await warm.call(_warmup_arrival(job))
    finally:
        await warm.aclose()
    client = _async_client(job, job.base_url)
    patience = Patience(timeout_s=job.deadline_s, app_retries=0, deadline_s=job.deadline_s)
    try:
        send({"ready": True})
        t0 = await asyncio.to_thread(_wait_for_t0)
        cpu0 = time.process_time()

        async def call(arrival: Arrival) -> LogicalResult:
            return await run_logical(client, arrival, patience, t0)

        results = await run_tasks(job.arrivals, job.workers, t0 + job.give_up_after_s, t0, call)
        return QuotaWorkerResult(
            process=job.process,
            results=results,
            client_attempts=client.attempts(),
            client_stats=client.stats(),
            cpu_s=round(time.process_time() - cpu0, 2),
        )
    finally:
        await client.aclose()


def main() -> None:
    claim_stdout()
    job = QuotaJob.from_json(sys.stdin.readline())
    if job.quota_dir is not None:
        os.environ["STORMGUARD_QUOTA_DIR"] = job.quota_dir
    threaded = job.client in THREADED_CLIENTS
    result = _run_sync(job) if threaded else asyncio.run(_run_async(job))
    send(result.to_json())


if __name__ == "__main__":
    main()
