"""Latency the admission layer adds per request, at 500 concurrent requests.

    .venv/bin/python bench/bench_admission.py [--concurrency 500] [--rounds 20] [--runs 5]
    .venv/bin/python bench/bench_admission.py --profile   # cProfile of the contended case

In-process, the server's own ``AdmissionController`` in front of a zero-cost engine
(a static ``EngineLoad``; "generation" is one event-loop turn), so every microsecond
measured is admission's, not HTTP's or the engine's. Two cases:

- ample: the budget holds all 500 requests; the figure is make_ticket + acquire +
  release per request (admission's whole cost when nothing has to wait; the turn of
  the loop in between is the engine's, not counted);
- contended: the budget holds 50 requests, 450 wait; the figure is the hand-off
  delay, from the release that admits a waiter (its ``admitted_at``) until that
  waiter runs again, plus the time the release itself took. Queue *wait* is the
  point of admission, not overhead, so it is not counted. At 500 tasks most of the
  hand-off is asyncio's ready queue, which any queue pays: the same hand-off through
  an ``asyncio.Semaphore`` of the same size is the baseline, and admission's added
  latency is the difference.

Each run times the three cases one after another (interleaved across ``--runs``), and
the summary gives the median and the spread of the runs. An untimed pass then counts
the event loop's work per request of each case: callbacks put on the ready queue
(``call_soon``: task wake-ups and future callbacks) and timers (``call_at``). A
waiter's hand-off delay is about the number of ready-queue hops between the release
and the waiter's own step, times the length of the queue ahead of each hop.

Target: p99 < 1 ms. Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import statistics
import time
from collections import deque
from collections.abc import Callable, Coroutine
from typing import Any

from stormguard_server.admission.controller import AdmissionController
from stormguard_server.config import AdmissionConfig
from stormguard_server.engine.base import EngineLoad

COST = 128  # a short chat request: prompt + max_tokens, whole 16-token blocks


def controller(slots: int) -> AdmissionController:
    """Admission over a ready engine whose budget (x 0.9 watermark) holds ``slots`` requests."""
    capacity = int(slots * COST / 0.9) + COST
    load = EngineLoad(
        state="ready",
        kv_cache_usage=0.0,
        kv_capacity_tokens=capacity,
        running=0,
        waiting=0,
        kv_block_size=16,
    )
    config = AdmissionConfig(max_queue_requests=10_000, max_queue_tokens=10_000_000)
    return AdmissionController(config, lambda: load)


async def ample(concurrency: int, rounds: int) -> list[float]:
    admission = controller(concurrency * 2)
    samples: list[float] = []

    async def request() -> None:
        for _ in range(rounds):
            start = time.perf_counter()
            permit = await admission.acquire(admission.make_ticket(COST))
            admitted = time.perf_counter() - start
            await asyncio.sleep(0)  # the zero-cost engine: one turn of the loop
            start = time.perf_counter()
            admission.release(permit)
            samples.append(admitted + time.perf_counter() - start)

    await asyncio.gather(*(request() for _ in range(concurrency)))
    return samples


async def contended(concurrency: int, rounds: int, slots: int) -> tuple[list[float], list[float]]:
    admission = controller(slots)
    handoffs: list[float] = []
    releases: list[float] = []

    async def request() -> None:
        for _ in range(rounds):
            ticket = admission.make_ticket(COST)
            permit = await admission.acquire(ticket)
            resumed = time.monotonic()
            if permit.waited_s > 0 and ticket.admitted_at is not None:
                handoffs.append(resumed - ticket.admitted_at)
            await asyncio.sleep(0)
            start = time.perf_counter()
            admission.release(permit)
            releases.append(time.perf_counter() - start)

    await asyncio.gather(*(request() for _ in range(concurrency)))
    return handoffs, releases


async def semaphore_baseline(concurrency: int, rounds: int, slots: int) -> list[float]:
    """The same hand-off through the plainest asyncio queue (FIFO wake-ups: the k-th
    release that found waiters wakes the k-th waiter)."""
    gate = asyncio.Semaphore(slots)
    released: deque[float] = deque()
    handoffs: list[float] = []
    waiting = 0

    async def request() -> None:
        nonlocal waiting
        for _ in range(rounds):
            queued = gate.locked()
            waiting += queued
            await gate.acquire()
            if queued:
                waiting -= 1
                handoffs.append(time.monotonic() - released.popleft())
            await asyncio.sleep(0)
            if waiting:
                released.append(time.monotonic())
            gate.release()

    await asyncio.gather(*(request() for _ in range(concurrency)))
    return handoffs


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that counts what it is asked to run: callbacks put on the ready
    queue (task wake-ups, future callbacks) and timers."""

    soon = 0
    timers = 0

    def call_soon(self, callback: Any, *args: Any, context: Any = None) -> Any:  # type: ignore[override]
        CountingLoop.soon += 1
        return super().call_soon(callback, *args, context=context)

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None) -> Any:  # type: ignore[override]
        CountingLoop.timers += 1
        return super().call_at(when, callback, *args, context=context)


def count_loop_work(case: Callable[[], Coroutine[Any, Any, object]], requests: int) -> str:
    """Ready-queue callbacks and timers per request of ``case``, on a counting loop."""
    CountingLoop.soon = CountingLoop.timers = 0

    async def run_and_clean_up() -> None:
        await case()
        for task in asyncio.all_tasks() - {asyncio.current_task()}:
            task.cancel()  # admission's queue timer, if one is still set
        await asyncio.sleep(0)

    loop = CountingLoop()
    try:
        loop.run_until_complete(run_and_clean_up())
    finally:
        loop.close()
    return (
        f"{CountingLoop.soon / requests:5.2f} callbacks, "
        f"{CountingLoop.timers / requests:5.2f} timers per request"
    )


def p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def show(title: str, samples: list[float]) -> float:
    ordered = sorted(samples)
    print(
        f"  {title:<37} n={len(samples):6d}  p50 {statistics.median(samples) * 1e6:7.1f} us"
        f"  p99 {p99(samples) * 1e6:7.1f} us  max {ordered[-1] * 1e6:7.1f} us"
    )
    return p99(samples)


def one_run(concurrency: int, rounds: int, slots: int) -> dict[str, float]:
    """The three cases once; returns their p50 and p99 and the added latency (seconds)."""
    ample_samples = asyncio.run(ample(concurrency, rounds))
    handoffs, releases = asyncio.run(contended(concurrency, rounds, slots))
    baseline = asyncio.run(semaphore_baseline(concurrency, rounds, slots))
    p99_ample = show("ample: ticket+acquire+release", ample_samples)
    p99_handoff = show("contended: release -> waiter runs", handoffs)
    p99_release = show("contended: release() itself", releases)
    p99_baseline = show("baseline: asyncio.Semaphore hand-off", baseline)
    added = max(p99_ample, p99_handoff - p99_baseline + p99_release)
    print(f"  admission's added latency, p99: {added * 1e3:.3f} ms")
    return {
        "handoff p50": statistics.median(handoffs),
        "handoff p99": p99_handoff,
        "baseline p50": statistics.median(baseline),
        "baseline p99": p99_baseline,
        "added p99": added,
    }


def profile(concurrency: int, rounds: int, slots: int) -> None:
    """cProfile of the contended case: where the event loop's time goes."""
    profiler = cProfile.Profile()
    profiler.enable()
    asyncio.run(contended(concurrency, rounds, slots))
    profiler.disable()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=20, help="requests per concurrent caller")
    parser.add_argument(
        "--slots", type=int, default=50, help="contended: requests admitted at once"
    )
    parser.add_argument("--runs", type=int, default=1, help="runs of the three cases")
    parser.add_argument("--profile", action="store_true", help="profile the contended case")
    args = parser.parse_args()
    n, rounds, slots = args.concurrency, args.rounds, args.slots
    if args.profile:
        profile(n, rounds, slots)
        return
    print(f"admission at {n} concurrent requests, zero-cost engine; load {os.getloadavg()}")
    runs = []
    for run in range(args.runs):
        print(f"run {run + 1}:")
        runs.append(one_run(n, rounds, slots))
    print(f"over {len(runs)} run(s), median (min-max), ms; load {os.getloadavg()}")
    for key in runs[0]:
        values = sorted(r[key] * 1e3 for r in runs)
        spread = f"{values[0]:.3f}-{values[-1]:.3f}"
        print(f"  {key:<13} {statistics.median(values):.3f} ({spread})")
    added = statistics.median(r["added p99"] for r in runs)
    print(f"  admission's added latency, p99: {'met' if added < 1e-3 else 'MISSED'} (< 1 ms)")
    print("event loop work, untimed pass:")
    requests = n * rounds
    print("  contended: " + count_loop_work(lambda: contended(n, rounds, slots), requests))
    print("  baseline:  " + count_loop_work(lambda: semaphore_baseline(n, rounds, slots), requests))


if __name__ == "__main__":
    main()
