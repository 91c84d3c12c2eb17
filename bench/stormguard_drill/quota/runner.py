"""Runs the quota scenario's pairings: one client x one variant, each on a fresh server.

One pairing:

1. P worker processes are spawned (``quota/worker.py``, through
   ``worker_pipe.WorkerProcess``, as the fleet's are) and given their jobs (call ``i``
   to process ``i % P``), while a fresh reference server starts with the variant's
   quota flags (and, for the Redis row, a fresh ``redis-server``: ``redis_server.py``);
2. each process warms up on the drill's warm-up server (no quota there) and says it is
   ready;
3. the batch starts at one ``time.monotonic()`` instant sent to every process; the
   server's ``/metrics`` is sampled meanwhile (the quota's admissions and refusals over
   time);
4. each process sends its results; ``/metrics`` is read once more for the server's
   counts (``server_counts``): requests on the chat route by status, and the key's
   admissions, tokens charged and refusals by reason.

A process that fails or says nothing in time fails the pairing, with its log's tail;
every process, server and Redis is stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from stormguard_drill.quota.client_names import REDIS_CLIENTS, QuotaClientName
from stormguard_drill.quota.config import QuotaRunConfig, QuotaVariant, server_args
from stormguard_drill.quota.records import QuotaRun
from stormguard_drill.quota.worker import QuotaJob, QuotaWorkerResult
from stormguard_drill.redis_server import RedisServer, start_redis
from stormguard_drill.sampler import MetricsSampler
from stormguard_drill.servers import ServerFleet, ServerProcess, free_port
from stormguard_drill.worker_pipe import READY_TIMEOUT_S, RESULT_SLACK_S, WorkerProcess
from stormguard_drill.workload import Arrival

CHAT_ROUTE = "/v1/chat/completions"
# The batch starts this long after the last process is ready: time to send t0.
START_DELAY_S = 0.3
#: How long the drill waits for a killed worker process to be reaped.
_REAP_TIMEOUT_S = 10.0


def server_counts(text: str) -> dict[str, Any]:
    """The figures of one ``/metrics`` text the quota scenario reads (the drill sends
    every call on one key: the key's series are summed over keys all the same)."""
    by_status: dict[str, int] = {}
    refused: dict[str, int] = {}
    admitted = charged = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels, value = sample.labels, sample.value
            if sample.name == "stormguard_responses_total" and labels.get("route") == CHAT_ROUTE:
                status = labels.get("status", "?")
                by_status[status] = by_status.get(status, 0) + int(value)
            elif sample.name == "stormguard_quota_admitted_total":
                admitted += value
            elif sample.name == "stormguard_quota_tokens_charged_total":
                charged += value
            elif sample.name == "stormguard_quota_refused_total":
                reason = labels.get("reason", "?")
                refused[reason] = refused.get(reason, 0) + int(value)
    return {
        "requests": sum(by_status.values()),
        "responses_by_status": dict(sorted(by_status.items())),
        "quota_admitted": int(admitted),
        "quota_tokens_charged": int(charged),
        "quota_refused_by_reason": dict(sorted(refused.items())),
    }


async def demand_tokens(server: ServerProcess, schedule: Sequence[Arrival]) -> int:
    """What the batch costs at the server: each call's prompt tokens (``/tokenize``, the
    count the quota charges) plus its ``max_tokens``. ``/tokenize`` is free."""
    total = 0
    async with httpx.AsyncClient(timeout=30.0) as http:
        for arrival in schedule:
            body = {"messages": arrival.messages, "add_generation_prompt": True}
            response = await http.post(f"{server.root}/tokenize", json=body)
            response.raise_for_status()
            total += int(response.json()["count"]) + arrival.max_tokens
    return total


async def _final_metrics(root: str) -> str:
    async with httpx.AsyncClient(timeout=10.0) as http:
        for _ in range(5):
            with contextlib.suppress(httpx.HTTPError):
                response = await http.get(f"{root}/metrics")
                if response.status_code == 200:
                    return response.text
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{root}/metrics did not answer at the end of the pairing")


async def run_quota_pairing(
    servers: ServerFleet,
    config: QuotaRunConfig,
    client: QuotaClientName,
    variant: QuotaVariant,
    schedule: list[Arrival],
    warmup: ServerProcess,
    log_dir: Path,
) -> QuotaRun:
    """One pairing on a fresh server (see the module doc)."""
    workload = config.workload
    limits = workload.limits(variant.bound)
    label = f"quota-{variant.slug}-{client}".replace("+", "-")
    redis: RedisServer | None = None
    server: ServerProcess | None = None
    workers: list[WorkerProcess] = []
    sampler_task: asyncio.Task[None] | None = None
    try:
        if client in REDIS_CLIENTS:
            redis = await asyncio.to_thread(start_redis, log_path=log_dir / f"{label}-redis.log")
        workers = [
            await WorkerProcess.spawn(
                log_dir / f"{label}-worker{k}.log", "stormguard_drill.quota.worker"
            )
            for k in range(variant.processes)
        ]
        port = free_port()
        # The machine's shared quota buckets (the default client's), this pairing's own.
        quota_dir = tempfile.mkdtemp(prefix=f"{label}-quota-", dir=log_dir)
        jobs = [
            QuotaJob(
                client=client,
                process=k,
                base_url=f"http://127.0.0.1:{port}/v1",
                warmup_url=warmup.base_url,
                workers=workload.workers,
                deadline_s=workload.deadline_s,
                give_up_after_s=workload.give_up_after_s,
                tpm=limits.tpm,
                rpm=limits.rpm,
                arrivals=[a for a in schedule if a.index % variant.processes == k],
                redis_host=None if redis is None else redis.host,
                redis_port=None if redis is None else redis.port,
                stream=config.stream,
                quota_dir=quota_dir,
            )
            for k in range(variant.processes)
        ]
        # The processes import and warm up while the server starts.
        started = await asyncio.gather(
            servers.start(label, *server_args(workload, variant), port=port),
            *(w.send(j.to_json()) for w, j in zip(workers, jobs, strict=True)),
        )
        server = started[0]
        assert server is not None
        for worker in workers:
            await worker.receive(READY_TIMEOUT_S, "it was ready")
        t0 = time.monotonic() + START_DELAY_S
        started_at_unix = time.time() + START_DELAY_S
        sampler = MetricsSampler(server.root, t0, config.sample_hz)
        sampler_task = asyncio.create_task(sampler.run())
        for worker in workers:
            await worker.send(json.dumps({"t0": t0}))
        wait = START_DELAY_S + workload.give_up_after_s + workload.deadline_s + RESULT_SLACK_S
        outputs = [
            QuotaWorkerResult.from_json(await worker.receive(wait, "its results"))
            for worker in workers
        ]
        sampler_task.cancel()
        await asyncio.gather(sampler_task, return_exceptions=True)
        text = await _final_metrics(server.root)
        return QuotaRun(
            client=client,
            variant=variant,
            results=sorted((r for o in outputs for r in o.results), key=lambda r: r.index),
            server=server_counts(text),
            samples=sampler.samples,
            started_at_unix=started_at_unix,
            processes=[
                {
                    "process": o.process,
                    "calls": len(o.results),
                    "client_attempts": o.client_attempts,
                    "client_stats": o.client_stats,
                    "cpu_s": o.cpu_s,
                }
                for o in outputs
            ],
        )
    finally:
        if sampler_task is not None:
            sampler_task.cancel()
            await asyncio.gather(sampler_task, return_exceptions=True)
        for worker in workers:
            worker.kill()
        # Bounded: a process that never started has nothing to wait for, and a wait
        # that never ends would hang the drill's shutdown.
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(w.process.wait() for w in workers), return_exceptions=True),
                _REAP_TIMEOUT_S,
            )
        if server is not None:
            servers.stop(server)
        if redis is not None:
            redis.stop()


async def run_quota_pairings(
    servers: ServerFleet,
    config: QuotaRunConfig,
    pairings: Sequence[tuple[QuotaVariant, QuotaClientName]],
    schedule: list[Arrival],
    warmup: ServerProcess,
    log_dir: Path,
    failed: dict[str, str],
    on_run: Callable[[QuotaRun], None] | None = None,
) -> list[QuotaRun]:
    """Every pairing, ``config.concurrency`` at a time (1: one after another), in order.
    A pairing that fails (a process that did not start, a server that did not come
    up) is tried once more, then left out with its error in ``failed``: one broken
    pairing does not cost the others' figures. ``on_run`` hears each run as it ends."""
    gate = asyncio.Semaphore(config.concurrency)

    async def gated(variant: QuotaVariant, client: QuotaClientName) -> QuotaRun | None:
        async with gate:
            for attempt in (1, 2):
                print(f"quota: {variant.name} / {client} ...", file=sys.stderr)
                try:
                    run = await run_quota_pairing(
                        servers, config, client, variant, schedule, warmup, log_dir
                    )
                except Exception as exc:  # reported, and the drill goes on
                    error = f"{type(exc).__name__}: {exc}"
                    print(f"quota: {variant.name} / {client} failed: {error}", file=sys.stderr)
                    traceback.print_exc(file=sys.stderr)
                    if attempt == 2:
                        failed[f"{variant.name} / {client}"] = error
                    continue
                if on_run is not None:
                    on_run(run)
                return run
            return None

    runs = await asyncio.gather(*(gated(v, c) for v, c in pairings))
    return [run for run in runs if run is not None]
