"""One logical call through the pipeline: retries, budget, deadline, history, stats.

Time is a FakeClock: sleeps are recorded, never waited; a slow server is a
handler that moves the clock forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import anyio
import httpx
import pytest
import respx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stormguard
from stormguard import RetryBudget, RetryPolicy
from stormguard.testing import FakeClock
from tests.sdk.helpers import BASE, MESSAGES, Api, chat_json


def busy(**headers: str) -> httpx.Response:
    return httpx.Response(503, json={"error": {"message": "busy"}}, headers=headers)


# The retry loop on its own: without a concurrency limiter a shed is an ordinary
# retry (with one, it is requeued: tests/sdk/policies/limiter/test_limiter_wiring.py).
NO_LIMITER: dict[str, None] = {"concurrency": None}


async def test_retry_after_then_success_with_history(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(
        side_effect=[
            busy(**{"retry-after": "2"}),
            busy(**{"retry-after-ms": "300"}),
            httpx.Response(200, json=chat_json()),
        ]
    )
    client = api.client(**NO_LIMITER)
    resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert api.clock.sleeps == [2.0, 0.3]
    assert [r.headers["x-stormguard-attempt"] for r in (c.request for c in route.calls)] == [
        "1",
        "2",
        "3",
    ]
    history = resp.attempt_history
    assert [(a.number, a.status_code, a.outcome) for a in history] == [
        (1, 503, "retry"),
        (2, 503, "retry"),
        (3, 200, "ok"),
    ]
    assert [a.delay_before for a in history] == [0.0, 2.0, 0.3]
    assert history[0].error_type == "ServiceUnavailableError"
    stats = client.stats()
    assert (stats.logical_calls, stats.attempts, stats.retries) == (1, 3, 2)
    assert stats.retry_amplification == 3.0


async def test_stopped_by_max_attempts_keeps_the_last_error_type(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(
        side_effect=[busy(), httpx.Response(429, json={}), httpx.Response(429, json={})]
    )
    client = api.client(**NO_LIMITER)
    with pytest.raises(stormguard.RateLimitError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    err = info.value
    assert err.retry_stopped_by == "max_attempts"
    assert err.attempts == 3
    assert [a.outcome for a in err.attempt_history] == ["retry", "retry", "max_attempts"]
    assert [a.status_code for a in err.attempt_history] == [503, 429, 429]


async def test_stopped_by_not_retryable(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").mock(side_effect=[busy(), httpx.Response(400, json={})])
    with pytest.raises(stormguard.BadRequestError) as info:
        await api.run(api.client().chat.completions.create(messages=MESSAGES))
    assert info.value.retry_stopped_by == "not_retryable"
    assert info.value.attempts == 2


async def test_stopped_by_should_retry_false(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(
        return_value=busy(**{"x-should-retry": "false", "x-load-shed": "retry_shed"})
    )
    with pytest.raises(stormguard.ServiceUnavailableError) as info:
        await api.run(api.client().chat.completions.create(messages=MESSAGES))
    assert info.value.retry_stopped_by == "should_retry_false"
    assert info.value.server_load.load_shed == "retry_shed"
    assert route.call_count == 1


async def test_stopped_by_budget(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(return_value=busy())
    budget = RetryBudget(ratio=0.0, min_retries_per_second=0.0, clock=api.clock)
    client = api.client(retry_budget=budget, **NO_LIMITER)
    with pytest.raises(stormguard.ServiceUnavailableError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert info.value.retry_stopped_by == "budget"
    assert route.call_count == 1
    assert client.stats().retries_refused_by_budget == 1
    assert api.clock.sleeps == []


async def test_stopped_by_deadline_when_retry_after_would_pass_it(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").mock(return_value=busy(**{"retry-after": "30"}))
    client = api.client(timeout=10.0)
    with pytest.raises(stormguard.ServiceUnavailableError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert info.value.retry_stopped_by == "deadline"
    assert route.call_count == 1
    assert api.clock.sleeps == []  # the call failed now instead of sleeping past its deadline


async def test_deadline_is_shared_by_attempts_and_sleeps(api: Api, mock: respx.MockRouter) -> None:
    sent: list[httpx.Request] = []

    def slow_then_ok(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        api.clock.advance(2.0)  # every attempt takes 2 s of the budget
        return (
            busy(**{"retry-after": "1"}) if len(sent) < 3 else httpx.Response(200, json=chat_json())
        )

    mock.post("/chat/completions").mock(side_effect=slow_then_ok)
    client = api.client(timeout=10.0, connect_timeout=60.0)
    resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resp.attempts == 3
    deadlines = [int(r.headers["x-request-deadline-ms"]) for r in sent]
    assert deadlines == [10_000, 7_000, 4_000]  # 10 - (2 + 1), 10 - 2 * (2 + 1)
    timeouts = [r.extensions["timeout"] for r in sent]
    assert [t["read"] for t in timeouts] == [10.0, 7.0, 4.0]
    assert [t["connect"] for t in timeouts] == [10.0, 7.0, 4.0]


async def test_per_call_timeout_overrides_the_client(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    client = api.client(timeout=100.0)
    await api.run(client.chat.completions.create(messages=MESSAGES, timeout=2.5))
    assert route.calls.last.request.headers["x-request-deadline-ms"] == "2500"
    await api.run(client.chat.completions.create(messages=MESSAGES, timeout=None))
    assert "x-request-deadline-ms" not in route.calls.last.request.headers


async def test_connection_errors_are_retried_with_backoff(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").mock(
        side_effect=[
            httpx.ConnectError("refused"),
            httpx.ReadTimeout("t"),
            httpx.Response(200, json=chat_json()),
        ]
    )
    client = api.client(retry_policy=RetryPolicy(base_delay=1.0, max_delay=1.0))
    resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert [a.error_type for a in resp.attempt_history] == [
        "APIConnectionError",
        "APITimeoutError",
        None,
    ]
    assert len(api.clock.sleeps) == 2 and all(0 <= s <= 1.0 for s in api.clock.sleeps)


async def test_stream_cut_before_first_chunk_is_retried(api: Api, mock: respx.MockRouter) -> None:
    ok = b'data: {"choices": [{"index": 0, "delta": {"content": "x"}}]}\n\ndata: [DONE]\n\n'
    mock.post("/chat/completions").mock(
        side_effect=[
            httpx.Response(
                200, headers={"content-type": "text/event-stream"}, content=b'data: {"cho'
            ),
            httpx.Response(200, headers={"content-type": "text/event-stream"}, content=ok),
        ]
    )
    stream = await api.run(api.client().chat.completions.create(messages=MESSAGES, stream=True))
    assert [c.choices[0].delta.content for c in await api.collect(stream)] == ["x"]
    assert [a.outcome for a in stream.attempt_history] == ["retry", "ok"]


async def test_budget_is_shared_between_clients(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").mock(return_value=busy())
    shared = RetryBudget(ratio=0.0, min_retries_per_second=0.1, window=10, clock=api.clock)
    a, b = api.client(retry_budget=shared), api.client(retry_budget=shared)
    assert a.retry_budget is b.retry_budget is shared
    for client in (a, b):
        with pytest.raises(stormguard.ServiceUnavailableError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    # One retry in the floor (0.1/s * 10 s): the first client's retry used it up.
    assert (a.stats().retries, b.stats().retries) == (1, 0)
    assert shared.state().retries == 1
    assert b.stats().retries_refused_by_budget == 1


async def test_async_cancel_during_backoff_stops_at_once() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return busy(**{"retry-after": "30"})

    client = stormguard.AsyncClient(
        base_url=BASE,
        model="m",
        retry_budget=RetryBudget(min_retries_per_second=10),
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
    )
    started = time.monotonic()
    with anyio.move_on_after(0.2):
        await client.chat.completions.create(messages=MESSAGES)
    assert time.monotonic() - started < 2.0
    assert len(calls) == 1
    task = asyncio.create_task(client.chat.completions.create(messages=MESSAGES))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(calls) == 2
    await client.close()


# -- the budget's promise, as a property ----------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    outcomes=st.lists(
        st.sampled_from([200, 429, 500, 502, 503, 504, "reset", "timeout"]), min_size=1, max_size=40
    ),
    calls=st.integers(min_value=1, max_value=60),
    threads=st.integers(min_value=1, max_value=4),
)
def test_amplification_bounded_by_budget_whatever_the_server_does(
    outcomes: list[object], calls: int, threads: int
) -> None:
    # A window longer than any run (sleeps and the limiter's pauses move the fake
    # clock), with the default floor of one retry per window: the bound is the tightest.
    ratio, window = 0.1, 10_000.0
    floor = 1.0 / window
    clock = FakeClock()
    lock = threading.Lock()
    position = [0]

    def handler(request: httpx.Request) -> httpx.Response:
        with lock:
            outcome = outcomes[position[0] % len(outcomes)]
            position[0] += 1
        if outcome == "reset":
            raise httpx.ReadError("reset")
        if outcome == "timeout":
            raise httpx.ConnectTimeout("t")
        assert isinstance(outcome, int)
        return httpx.Response(outcome, json=chat_json() if outcome == 200 else {})

    budget = RetryBudget(ratio=ratio, min_retries_per_second=floor, window=window, clock=clock)
    # Sheds (429, 503) are requeued from the limiter's own budget first, then retried.
    requeue = RetryBudget(ratio=0.05, min_retries_per_second=floor, window=window, clock=clock)
    limiter = stormguard.ConcurrencyLimiter(clock=clock, requeue_budget=requeue)
    policy = RetryPolicy(max_attempts=5, base_delay=0.0, max_delay=0.0, max_retry_after=0.0)
    client = stormguard.Client(
        base_url=BASE,
        model="m",
        clock=clock,
        retry_budget=budget,
        retry_policy=policy,
        concurrency=limiter,
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
    )
    per_thread = [calls // threads + (1 if i < calls % threads else 0) for i in range(threads)]

    def worker(n: int) -> None:
        for _ in range(n):
            with contextlib.suppress(stormguard.StormguardError):  # open breakers too
                client.chat.completions.create(messages=MESSAGES)

    pool = [threading.Thread(target=worker, args=(n,)) for n in per_thread]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    stats = client.stats()
    assert stats.logical_calls == calls
    assert position[0] == stats.attempts  # every attempt reached the server, none other
    floors = floor * window + requeue.min_retries_per_second * requeue.window
    assert stats.retry_amplification <= 1 + ratio + requeue.ratio + floors / calls + 1e-9
    assert stats.retries <= ratio * calls + floor * window + 1e-9
    client.close()


def test_retry_bodies_are_identical(mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(
        side_effect=[busy(), httpx.Response(200, json=chat_json())]
    )
    client = stormguard.Client(base_url=BASE, model="m", clock=FakeClock())
    client.chat.completions.create(messages=MESSAGES, max_tokens=3)
    first, second = (c.request.content for c in route.calls)
    assert first == second and json.loads(first)["max_tokens"] == 3
