"""The application around a client: one logical request, retried once by the app.

What users do when a call finally fails: wait a moment, then call once more. So a
logical request (one business request, the denominator of retry amplification)
can be several client calls, each of them several HTTP attempts.

Where the patience has a deadline (the burst and the rebound: 60 s), the caller gives
up on the logical request that long after issuing it, whatever the client is doing
then (a call still waiting, retrying or streaming is cancelled): a success is always
one within the deadline.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from stormguard_drill.clients.registry import CallOutcome, DrillClient
from stormguard_drill.config import Patience
from stormguard_drill.workload import Arrival, Kind


@dataclass(frozen=True, slots=True)
class LogicalResult:
    """How one logical request ended; times in seconds from the pairing's start."""

    index: int
    kind: Kind
    start_s: float
    end_s: float
    ok: bool
    completion_tokens: int
    first_token_s: float | None  # when its successful call's first chunk came
    app_calls: int
    error: str | None  # the last failure's exception class

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.start_s


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
