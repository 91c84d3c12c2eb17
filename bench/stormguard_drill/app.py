"""The application around a client: one logical request, retried once by the app.

What users do when a call finally fails: wait a moment, then call once more. So a
logical request (one business request, the denominator of retry amplification)
can be several client calls, each of them several HTTP attempts.

Where the patience has a deadline (the burst and the rebound: 60 s), the caller gives
up on the logical request that long after issuing it, whatever the client is doing
then (a call still waiting, retrying or streaming is cancelled): a success is always
one within the deadline.

The application issues its logical requests open loop, each at its time in the
schedule, whatever the earlier ones are doing (``replay``): the runner of the
avalanche, the burst and the rebound, and each client process of the fleet, replay
their arrivals through it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

from stormguard_drill.clients.drill_client import CallOutcome, DrillClient
from stormguard_drill.config import Patience
from stormguard_drill.records import LogicalResult
from stormguard_drill.workload import Arrival

DEADLINE = "deadline"  # the error of a logical request that the caller gave up on


async def _one_call(client: DrillClient, arrival: Arrival, left_s: float | None) -> CallOutcome:
    try:
        if left_s is None:
            return await client.call(arrival)
        return await asyncio.wait_for(client.call(arrival), timeout=left_s)
    except asyncio.TimeoutError:  # the caller's deadline (a client's own is its exception)
        return CallOutcome(ok=False, error=DEADLINE)
    except Exception as exc:  # anything a client lets escape is a failed call to the app
        return CallOutcome(ok=False, error=type(exc).__name__)


async def run_logical(
    client: DrillClient, arrival: Arrival, patience: Patience, t0: float
) -> LogicalResult:
    """Issue ``arrival`` through ``client`` as the application would."""
    start = time.monotonic()
    deadline = None if patience.deadline_s is None else start + patience.deadline_s
    outcome = CallOutcome(ok=False, error="not started")
    calls = 0
    for app_try in range(1 + patience.app_retries):
        if app_try:
            if deadline is not None and time.monotonic() + patience.app_retry_pause_s >= deadline:
                break
            await asyncio.sleep(patience.app_retry_pause_s)
        calls += 1
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        outcome = await _one_call(client, arrival, left)
        if outcome.ok or outcome.error == DEADLINE:
            break
    end = time.monotonic()
    first = outcome.first_token_at if outcome.ok else None
    return LogicalResult(
        index=arrival.index,
        kind=arrival.kind,
        start_s=start - t0,
        end_s=end - t0,
        ok=outcome.ok,
        completion_tokens=outcome.completion_tokens if outcome.ok else 0,
        first_token_s=None if first is None else first - t0,
        app_calls=calls,
        error=outcome.error,
    )


def unfinished(arrival: Arrival, start_s: float, end_s: float) -> LogicalResult:
    """A logical request still running when the drill stopped waiting: a failure."""
    return LogicalResult(
        index=arrival.index,
        kind=arrival.kind,
        start_s=start_s,
        end_s=end_s,
        ok=False,
        completion_tokens=0,
        first_token_s=None,
        app_calls=0,
        error="unfinished",
    )


async def replay(
    schedule: Sequence[Arrival],
    t0: float,
    logical: Callable[[Arrival], Coroutine[Any, Any, LogicalResult]],
    end_at: float,
    *,
    before: Callable[[float], Awaitable[None]] | None = None,
) -> list[LogicalResult]:
    """Fire every arrival at ``t0`` + its time, open loop (``before(at_s)`` first: the
    mid-run actions due by then), wait for the calls until ``end_at`` at most, cancel
    what still runs (each an ``unfinished`` failure); the results in arrival order."""
    tasks: dict[asyncio.Task[LogicalResult], Arrival] = {}
    try:
        for arrival in schedule:
            if before is not None:
                await before(arrival.at_s)
            await sleep_until(t0 + arrival.at_s)
            tasks[asyncio.create_task(logical(arrival))] = arrival
        if before is not None:
            await before(float("inf"))
        if not tasks:
            return []
        _, pending = await asyncio.wait(tasks, timeout=max(0.0, end_at - time.monotonic()))
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        stopped = time.monotonic() - t0
        results = [
            unfinished(arrival, arrival.at_s, stopped) if task in pending else task.result()
            for task, arrival in tasks.items()
        ]
        return sorted(results, key=lambda r: r.index)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def sleep_until(when: float) -> None:
    delay = when - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
