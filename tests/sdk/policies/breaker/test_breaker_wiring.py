"""Breakers and adaptive throttling inside the call: fail fast, eject, probe, recover.

The failures here are crash-like (500, 502): sheds (503, 429) never open a
breaker; ``policies/limiter/test_limiter_wiring.py`` shows what they do instead."""

from __future__ import annotations

import random

import httpx
import pytest
import respx

import stormguard
from stormguard import RetryPolicy
from stormguard._policies.breaker.config import BreakerConfig
from stormguard._policies.breaker.states import BreakerTransition, CircuitState
from stormguard._policies.retry.throttle import AdaptiveThrottle
from tests.sdk.helpers import MESSAGES, Api, chat_json

A, B = "http://a.test/v1", "http://b.test/v1"
ONE_TRY = RetryPolicy(max_attempts=1)
FAST_TRIP = BreakerConfig(consecutive_failures=3, open_time=5.0, jitter=0.0, half_open_calls=1)


async def test_consecutive_failures_open_the_breaker_then_calls_fail_fast(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(500, json={})
    events: list[BreakerTransition] = []
    client = api.client(retry_policy=ONE_TRY, breaker=FAST_TRIP, breaker_listeners=[events.append])
    for _ in range(3):
        with pytest.raises(stormguard.InternalServerError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    with pytest.raises(stormguard.CircuitOpenError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 3  # the fourth call made no request
    err = info.value
    assert err.attempts == 0 and err.attempt_history == ()
    assert err.breaker == "m@llm.test:80"
    assert err.retry_in == pytest.approx(5.0)
    assert [(e.from_state, e.to_state, e.reason) for e in events] == [
        (CircuitState.CLOSED, CircuitState.OPEN, "consecutive_failures")
    ]
    [state] = client.stats().breakers
    assert state.state is CircuitState.OPEN


async def test_half_open_probe_closes_on_success(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(
        side_effect=[httpx.Response(500, json={})] * 3 + [httpx.Response(200, json=chat_json())]
    )
    events: list[BreakerTransition] = []
    client = api.client(retry_policy=ONE_TRY, breaker=FAST_TRIP, breaker_listeners=[events.append])
    for _ in range(3):
        with pytest.raises(stormguard.InternalServerError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    api.clock.advance(5.1)
    resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resp.choices[0].message.content == "hello"
    assert route.call_count == 4
    assert [e.to_state for e in events] == [
        CircuitState.OPEN,
        CircuitState.HALF_OPEN,
        CircuitState.CLOSED,
    ]


async def test_retry_after_keeps_the_breaker_open_at_least_that_long(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").respond(500, json={}, headers={"retry-after": "30"})
    client = api.client(retry_policy=ONE_TRY, breaker=FAST_TRIP)
    for _ in range(3):
        with pytest.raises(stormguard.InternalServerError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    api.clock.advance(10.0)  # past open_time (5 s), not past the server's Retry-After
    with pytest.raises(stormguard.CircuitOpenError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert info.value.retry_in == pytest.approx(20.0)


async def test_caller_errors_do_not_trip_the_breaker(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").respond(400, json={})
    client = api.client(retry_policy=ONE_TRY, breaker=FAST_TRIP)
    for _ in range(6):
        with pytest.raises(stormguard.BadRequestError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 6


async def test_an_ejected_endpoint_gets_no_traffic_the_healthy_one_serves(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        sick = mock.post(f"{A}/chat/completions").respond(502, json={})
        healthy = mock.post(f"{B}/chat/completions").respond(200, json=chat_json())
        client = api.client(base_url=[A, B], breaker=FAST_TRIP)
        for _ in range(30):
            resp = await api.run(client.chat.completions.create(messages=MESSAGES))
            assert resp.choices[0].message.content == "hello"
    assert sick.call_count == 3  # ejected after three failures, each retried on b
    assert healthy.call_count == 30
    states = {s.name: s.state for s in client.stats().breakers}
    assert states == {"m@a.test:80": CircuitState.OPEN, "m@b.test:80": CircuitState.CLOSED}


async def test_all_endpoints_open_stops_retries_with_the_last_error(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=r"http://[ab]\.test/v1/chat/completions").respond(500, json={})
        config = BreakerConfig(consecutive_failures=1, open_time=5.0, jitter=0.0)
        client = api.client(base_url=[A, B], breaker=config)
        with pytest.raises(stormguard.InternalServerError) as info:
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert info.value.attempts == 2  # a, then b, then nowhere left to go
    assert info.value.retry_stopped_by == "circuit_open"


async def test_open_breaker_falls_back_to_the_next_model(api: Api, mock: respx.MockRouter) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        model = request.content.decode()
        return (
            httpx.Response(500, json={})
            if '"big"' in model
            else httpx.Response(200, json=chat_json())
        )

    route = mock.post("/chat/completions").mock(side_effect=answer)
    client = api.client(
        model="big", fallback_models=["small"], retry_policy=ONE_TRY, breaker=FAST_TRIP
    )
    for _ in range(3):
        resp = await api.run(client.chat.completions.create(messages=MESSAGES))
        assert resp.degraded
    calls_before = route.call_count
    resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert resp.degraded and resp.served_model == "small"
    assert route.call_count == calls_before + 1  # "big" was refused locally: no request


async def test_breakers_can_be_turned_off(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").respond(500, json={})
    client = api.client(retry_policy=ONE_TRY, breaker=None)
    for _ in range(12):
        with pytest.raises(stormguard.InternalServerError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 12
    assert client.stats().breakers == ()


async def test_adaptive_throttle_rejects_locally_as_the_server_refuses(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(500, json={})
    throttle = AdaptiveThrottle(k=2.0, clock=api.clock, rng=random.Random(3))
    client = api.client(retry_policy=ONE_TRY, breaker=None, throttle=throttle)
    outcomes: dict[str, int] = {"sent": 0, "throttled": 0}
    for _ in range(200):
        try:
            await api.run(client.chat.completions.create(messages=MESSAGES))
        except stormguard.ThrottledError as exc:
            assert 0 < exc.probability < 1
            outcomes["throttled"] += 1
        except stormguard.InternalServerError:
            outcomes["sent"] += 1
    assert outcomes["sent"] == route.call_count
    # With no accepts, p = requests / (requests + 1): nearly everything is refused
    # once a few requests have failed.
    assert outcomes["throttled"] > 180


def test_breaker_and_throttle_stop_reasons_in_the_policy() -> None:
    policy = RetryPolicy()
    assert policy.decide(stormguard.CircuitOpenError("x", breaker="b")).reason == "circuit_open"
    assert policy.decide(stormguard.ThrottledError("x", probability=0.5)).reason == "throttled"
