"""Latency the admission layer adds per request, at 500 concurrent requests.

    .venv/bin/python bench/bench_admission.py [--concurrency 500] [--rounds 20]

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

Target: p99 < 1 ms. Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections import deque

from stormguard_server.admission import AdmissionController
from stormguard_server.config import AdmissionConfig
from stormguard_server.engine import EngineLoad

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


def show(title: str, samples: list[float]) -> float:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]
    print(
        f"  {title:<34} n={len(samples):6d}  p50 {statistics.median(samples) * 1e6:7.1f} us"
        f"  p99 {p99 * 1e6:7.1f} us  max {ordered[-1] * 1e6:7.1f} us"
    )
    return p99


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=20, help="requests per concurrent caller")
    parser.add_argument(
        "--slots", type=int, default=50, help="contended: requests admitted at once"
    )
    args = parser.parse_args()
    print(f"admission at {args.concurrency} concurrent requests, zero-cost engine")
    p99_ample = show(
        "ample: ticket+acquire+release", asyncio.run(ample(args.concurrency, args.rounds))
    )
    handoffs, releases = asyncio.run(contended(args.concurrency, args.rounds, args.slots))
    p99_handoff = show("contended: release -> waiter runs", handoffs)
    p99_release = show("contended: release() itself", releases)
    baseline = semaphore_baseline(args.concurrency, args.rounds, args.slots)
    p99_baseline = show("baseline: asyncio.Semaphore hand-off", asyncio.run(baseline))
    added = max(p99_ample, p99_handoff - p99_baseline + p99_release)
    verdict = "met" if added < 1e-3 else "MISSED"
    print(f"  admission's added latency, p99: {added * 1e3:.3f} ms (target < 1 ms): {verdict}")


if __name__ == "__main__":
    main()
