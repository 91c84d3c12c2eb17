"""``Client`` and ``AsyncClient`` behave the same: one attempt flow, two I/O shells.

Each scenario is a real server on 127.0.0.1 (``HostileServer``) that answers a
sequence of attempts; the same call runs through the sync and the async client
(each against a server of its own), and both must end the same way: the same
result or error class, the same attempts with the same outcomes, the same stop
reason, and by the call's deadline. The two differ only in how they bound I/O
by the deadline (a cancel scope for async, the deadline-clipping transport for
sync), so the scenarios include a server that never answers, one that drips its
headers and one that drips its body.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

import stormguard
from tests.e2e.hostile_server import (
    HEAD_JSON,
    HEAD_SSE,
    Behaviour,
    HostileServer,
    RawRequest,
    answer,
    drip,
    never_answer,
)

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "ping"}]
PATH = "/v1/chat/completions"
#: The calls' deadline: short, so that the scenarios that run into it stay fast.
DEADLINE = 1.0
#: How late a call may return past its deadline on a busy 2-core machine.
SLACK = 1.5
CHAT = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "pong"}}],
}
EVENT = b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'
QUOTA = {"error": {"message": "no credit", "type": "insufficient_quota"}}


def in_turn(*behaviours: Behaviour) -> Behaviour:
    """The n-th request gets the n-th behaviour (the last one from then on)."""
    count = 0

    async def behaviour(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        index, count = min(count, len(behaviours) - 1), count + 1
        await behaviours[index](request, writer)

    return behaviour


def sse(*raw: bytes, cut: bool = False) -> Behaviour:
    """A stream of ``raw`` events, ending with ``[DONE]`` unless ``cut``."""
    body = b"".join(raw) + (b"" if cut else b"data: [DONE]\n\n")

    async def behaviour(_: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD_SSE + body)
        await writer.drain()

    return behaviour


@dataclass(frozen=True)
class Scenario:
    server: Callable[[], Behaviour]
    #: The error class (None: the call succeeds), the attempts' outcomes, the stop reason.
    error: type[Exception] | None
    outcomes: Sequence[str]
    stopped_by: str | None
    stream: bool = False
    #: Builds the clients' options (one set per client: a budget is not shared).
    options: Callable[[], dict[str, Any]] = dict


def generous() -> dict[str, Any]:
    """Retries allowed by the budget from the first call (a fresh budget is empty)."""
    return {
        "retry_budget": stormguard.RetryBudget(min_retries_per_second=100.0),
        # Short backoffs, so that retries fit in the deadline whatever the jitter draws.
        "retry_policy": stormguard.RetryPolicy(base_delay=0.01, max_delay=0.02),
    }


SCENARIOS = {
    "ok": Scenario(lambda: answer(200, CHAT), None, ["ok"], None),
    "crash-twice-then-ok": Scenario(
        lambda: in_turn(answer(500, {}), answer(502, {}), answer(200, CHAT)),
        None,
        ["retry", "retry", "ok"],
        None,
        options=generous,
    ),
    "crash-every-attempt": Scenario(
        lambda: answer(500, {}),
        stormguard.InternalServerError,
        ["retry", "retry", "max_attempts"],
        "max_attempts",
        options=generous,
    ),
    "caller-error": Scenario(
        lambda: answer(400, {}), stormguard.BadRequestError, ["not_retryable"], "not_retryable"
    ),
    "should-retry-false": Scenario(
        lambda: answer(503, {}, [("x-should-retry", "false")]),
        stormguard.ServiceUnavailableError,
        ["should_retry_false"],
        "should_retry_false",
    ),
    "out-of-quota": Scenario(
        lambda: answer(429, QUOTA), stormguard.RateLimitError, ["not_retryable"], "not_retryable"
    ),
    "retry-after-past-the-deadline": Scenario(
        lambda: answer(502, {}, [("retry-after", "30")]),
        stormguard.InternalServerError,
        ["deadline"],
        "deadline",
        options=generous,
    ),
    "never-answers": Scenario(
        never_answer, stormguard.APITimeoutError, ["deadline"], "deadline", options=generous
    ),
    "headers-dripped": Scenario(
        lambda: drip(HEAD_JSON, interval=0.05),
        stormguard.APITimeoutError,
        ["deadline"],
        "deadline",
        options=generous,
    ),
    "body-dripped": Scenario(
        lambda: drip(HEAD_JSON + b'{"id": "c', interval=0.05, then=b" ", step=len(HEAD_JSON) + 9),
        stormguard.APITimeoutError,
        ["not_retryable"],
        "not_retryable",
        options=generous,
    ),
    "stream-cut-before-its-first-chunk": Scenario(
        lambda: in_turn(sse(cut=True), sse(EVENT)),
        None,
        ["retry", "ok"],
        None,
        stream=True,
        options=generous,
    ),
    "stream-cut-after-its-first-chunk": Scenario(
        lambda: sse(EVENT, cut=True),
        stormguard.StreamInterruptedError,
        ["ok"],
        None,
        stream=True,
        options=generous,
    ),
}


@dataclass(frozen=True)
class Outcome:
    error: type[Exception] | None
    outcomes: tuple[str, ...]
    stopped_by: str | None
    requests: int


def _outcome(error: BaseException | None, result: Any, requests: int) -> Outcome:
    if error is not None:
        assert isinstance(error, stormguard.StormguardError), repr(error)
        history = error.attempt_history
        return Outcome(
            type(error), tuple(a.outcome for a in history), error.retry_stopped_by, requests
        )
    return Outcome(None, tuple(a.outcome for a in result.attempt_history), None, requests)


def run_sync(scenario: Scenario) -> tuple[Outcome, float]:
    with HostileServer({PATH: scenario.server()}) as server:
        client = stormguard.Client(
            base_url=server.base_url, model="m", timeout=DEADLINE, **scenario.options()
        )
        started = time.monotonic()
        error, result = None, None
        try:
            result = client.chat.completions.create(messages=MESSAGES, stream=scenario.stream)
            if scenario.stream:
                list(result)
        except stormguard.StormguardError as exc:
            error = exc
        elapsed = time.monotonic() - started
        client.close()
        return _outcome(error, result, len(server.requests_to(PATH))), elapsed


async def run_async(scenario: Scenario) -> tuple[Outcome, float]:
    with HostileServer({PATH: scenario.server()}) as server:
        client = stormguard.AsyncClient(
            base_url=server.base_url, model="m", timeout=DEADLINE, **scenario.options()
        )
        started = time.monotonic()
        error, result = None, None
        try:
            result = await client.chat.completions.create(messages=MESSAGES, stream=scenario.stream)
            if scenario.stream:
                async for _ in result:
                    pass
        except stormguard.StormguardError as exc:
            error = exc
        elapsed = time.monotonic() - started
        await client.close()
        return _outcome(error, result, len(server.requests_to(PATH))), elapsed


@pytest.mark.parametrize("scenario", SCENARIOS.values(), ids=SCENARIOS.keys())
async def test_client_and_async_client_end_the_same_way(scenario: Scenario) -> None:
    # Both at once, each with a server of its own: the deadline cases take the time of one.
    (sync, sync_s), (async_, async_s) = await asyncio.gather(
        asyncio.to_thread(run_sync, scenario), run_async(scenario)
    )
    expected = Outcome(
        scenario.error, tuple(scenario.outcomes), scenario.stopped_by, len(scenario.outcomes)
    )
    assert sync == expected, "sync"
    assert async_ == expected, "async"
    assert sync_s < DEADLINE + SLACK and async_s < DEADLINE + SLACK, (sync_s, async_s)
