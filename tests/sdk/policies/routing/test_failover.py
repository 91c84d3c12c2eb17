"""Several endpoints through the client, sync and async, on a fake clock: ejection
wired into endpoint choice, and failover outside the retry budget."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import pytest
import respx
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stormguard
from stormguard import (
    BreakerConfig,
    CircuitState,
    ConcurrencyLimiter,
    EjectionConfig,
    EjectionTransition,
    Endpoint,
    EndpointStatus,
    RetryBudget,
    RetryPolicy,
    ServerLoad,
)
from stormguard._policies.limiter.lease import Lease
from stormguard.telemetry import Telemetry
from tests.sdk.helpers import MESSAGES, Api, chat_json

A, B, C = "http://a.test/v1", "http://b.test/v1", "http://c.test/v1"
NAMES = {A: "a.test:80", B: "b.test:80", C: "c.test:80"}
ANY_HOST = r"http://[abc]\.test/v1/chat/completions"
#: A weight that makes power of two choices pick ``A`` first: 1 - 1e-9 of the time (with
#: 100, one run in about a hundred picked another and failed).
HEAVY = 1e9


def no_budget(api: Api) -> RetryBudget:
    """A budget that allows no retry at all."""
    return RetryBudget(ratio=0.0, min_retries_per_second=0.0, clock=api.clock)


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def by_host(answers: dict[str, Any]) -> Any:
    """A respx side effect answering each host its own way (a response or a function)."""
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        seen.append(f"{host}:80")
        reply = answers[host]
        return reply(request) if callable(reply) else reply

    answer.seen = seen  # type: ignore[attr-defined]
    return answer


def ok() -> httpx.Response:
    return httpx.Response(200, json=chat_json())


def failing() -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "engine failed"}})


async def test_a_refused_endpoint_is_out_at_once_for_every_model(api: Api) -> None:
    events: list[EjectionTransition] = []
    with respx.mock(assert_all_called=False) as mock:
        answer = by_host({"a.test": refuse, "b.test": ok(), "c.test": ok()})
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        # a weighs the most, so the first call's two choices land on it.
        client = api.client(
            base_url=[Endpoint(A, weight=HEAVY), B, C], ejection_listeners=[events.append]
        )
        first = await api.run(client.chat.completions.create(messages=MESSAGES))
        for model in ("m", "other", "m", "other") * 5:
            resp = await api.run(client.chat.completions.create(messages=MESSAGES, model=model))
            assert "a.test:80" not in [a.endpoint for a in resp.attempt_history]
    assert (first.attempt_history[0].endpoint, first.attempt_history[0].outcome) == (
        "a.test:80",
        "failover",
    )
    assert answer.seen.count("a.test:80") == 1  # type: ignore[attr-defined]
    [ejected] = events
    assert (ejected.endpoint, ejected.to_status, ejected.reason) == (
        "a.test:80",
        EndpointStatus.EJECTED,
        "unreachable",
    )
    stats = client.stats()
    health = {h.endpoint: h for h in stats.endpoints}
    assert health["a.test:80"].status is EndpointStatus.EJECTED
    assert health["a.test:80"].reason == "unreachable"
    assert health["a.test:80"].ejected_for is not None and health["a.test:80"].ejected_for <= 1.2
    assert health["b.test:80"].status is EndpointStatus.ACTIVE
    # One refusal is not enough for the breaker: ejection is what took it out.
    assert {b.state for b in stats.breakers} == {CircuitState.CLOSED}
    assert stats.failovers == 1 and stats.retries_refused_by_budget == 0


async def test_a_failover_to_a_fresh_endpoint_spends_no_budget(api: Api) -> None:
    budget = no_budget(api)
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_HOST).mock(
            side_effect=by_host({"a.test": failing(), "b.test": ok()})
        )
        client = api.client(base_url=[Endpoint(A, weight=HEAVY), B], retry_budget=budget)
        resp = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert [(a.endpoint, a.status_code, a.outcome) for a in resp.attempt_history] == [
        ("a.test:80", 500, "failover"),
        ("b.test:80", 200, "ok"),
    ]
    assert resp.attempt_history[1].delay_before == 0.0  # nothing to wait for
    assert budget.state().retries == 0 and budget.state().refused == 0
    stats = client.stats()
    assert (stats.failovers, stats.retries, stats.retries_refused_by_budget) == (1, 1, 0)


async def test_a_retry_to_an_endpoint_already_tried_spends_the_budget(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_HOST).mock(
            side_effect=by_host({"a.test": failing(), "b.test": failing()})
        )
        empty = api.client(base_url=[A, B], retry_budget=no_budget(api))
        with pytest.raises(stormguard.InternalServerError) as refused:
            await api.run(empty.chat.completions.create(messages=MESSAGES))
        budget = RetryBudget(ratio=1.0, min_retries_per_second=1.0, clock=api.clock)
        roomy = api.client(base_url=[A, B], retry_budget=budget)
        with pytest.raises(stormguard.InternalServerError) as spent:
            await api.run(roomy.chat.completions.create(messages=MESSAGES))
    # The failover to the other endpoint was free; going back to the first was not.
    assert [a.outcome for a in refused.value.attempt_history] == ["failover", "budget"]
    assert refused.value.retry_stopped_by == "budget"
    history = spent.value.attempt_history
    assert [a.outcome for a in history] == ["failover", "retry", "max_attempts"]
    assert history[2].endpoint in {history[0].endpoint, history[1].endpoint}
    assert budget.state().retries == 1


async def test_each_endpoint_is_failed_over_to_at_most_once_per_call(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        route = mock.post(url__regex=ANY_HOST).mock(return_value=failing())
        client = api.client(
            base_url=[A, B, C],
            retry_budget=no_budget(api),
            retry_policy=RetryPolicy(max_attempts=10),
        )
        with pytest.raises(stormguard.InternalServerError) as info:
            await api.run(client.chat.completions.create(messages=MESSAGES))
    endpoints = [a.endpoint for a in info.value.attempt_history]
    assert sorted(endpoints) == ["a.test:80", "b.test:80", "c.test:80"]
    assert info.value.retry_stopped_by == "budget" and route.call_count == 3


async def test_no_free_failover_into_an_endpoint_that_says_it_sheds(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        answer = by_host({"a.test": failing(), "b.test": ok()})
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        client = api.client(base_url=[A, B], retry_budget=no_budget(api))
        core = client._core
        full = ServerLoad(queue_depth=8, load_shed="queue_full", retry_after=1.0)
        core.picker.observe(core.picker.states[1], full)  # b's last answer was a shed
        with pytest.raises(stormguard.InternalServerError) as info:
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert [a.outcome for a in info.value.attempt_history] == ["budget"]
    assert answer.seen == ["a.test:80"]  # type: ignore[attr-defined]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_failover_waits_for_a_slot_of_the_new_endpoint(mode: str) -> None:
    api = Api(mode)
    limiter = ConcurrencyLimiter(initial_limit=1, clock=api.clock)
    held = limiter.endpoint("b.test:80").acquire(1, -1, deadline_at=1e9)  # b is full
    assert isinstance(held, Lease)
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_HOST).mock(
            side_effect=by_host({"a.test": failing(), "b.test": ok()})
        )
        client = api.client(base_url=[A, B], concurrency=limiter, retry_budget=no_budget(api))
        b_limit = limiter.endpoint("b.test:80")
        if mode == "sync":
            results: list[Any] = []
            worker = threading.Thread(
                target=lambda: results.append(client.chat.completions.create(messages=MESSAGES))
            )
            worker.start()
            await _until(lambda: b_limit.state().waiting == 1)
            assert not results  # it waits behind b's limit, not past it
            held.release()
            worker.join(timeout=30)
            [resp] = results
        else:
            task = asyncio.ensure_future(client.chat.completions.create(messages=MESSAGES))
            await _until(lambda: b_limit.state().waiting == 1)
            assert not task.done()
            held.release()
            resp = await asyncio.wait_for(task, 30)
        assert b_limit.state().in_flight == 0
    assert [(a.endpoint, a.outcome) for a in resp.attempt_history] == [
        ("a.test:80", "failover"),
        ("b.test:80", "ok"),
    ]
    await api.close_all()


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_call_waiting_for_a_slot_of_an_endpoint_ejected_meanwhile_goes_elsewhere(
    mode: str,
) -> None:
    api = Api(mode)
    limiter = ConcurrencyLimiter(initial_limit=1, clock=api.clock)
    held = limiter.endpoint("b.test:80").acquire(1, -1, deadline_at=1e9)  # b is full
    held_a = limiter.endpoint("a.test:80").acquire(1, -1, deadline_at=1e9)  # and a
    assert isinstance(held, Lease)
    assert isinstance(held_a, Lease)
    with respx.mock(assert_all_called=False) as mock:
        answer = by_host({"a.test": ok(), "b.test": ok()})
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        client = api.client(base_url=[A, Endpoint(B, weight=HEAVY)], concurrency=limiter)
        b_limit, b_state = limiter.endpoint("b.test:80"), client._core.picker.states[1]
        if mode == "sync":
            results: list[Any] = []
            worker = threading.Thread(
                target=lambda: results.append(client.chat.completions.create(messages=MESSAGES))
            )
            worker.start()
            await _until(lambda: b_limit.state().waiting == 1)
        else:
            task = asyncio.ensure_future(client.chat.completions.create(messages=MESSAGES))
            await _until(lambda: b_limit.state().waiting == 1)
        # Another call finds b unreachable while this one waits for b's slot.
        assert client._core.ejection.record(
            b_state, stormguard._policies.routing.ejection.Evidence.UNREACHABLE
        )
        held.release()  # b's slot is free: the call takes it, sees b out, waits for a's
        a_limit = limiter.endpoint("a.test:80")
        await _until(lambda: a_limit.state().waiting == 1)
        held_a.release()
        if mode == "sync":
            worker.join(timeout=30)
            [resp] = results
        else:
            resp = await asyncio.wait_for(task, 30)
    assert [(a.endpoint, a.outcome) for a in resp.attempt_history] == [("a.test:80", "ok")]
    assert answer.seen == ["a.test:80"]  # type: ignore[attr-defined]
    assert b_limit.state().in_flight == 0 and b_limit.state().waiting == 0
    await api.close_all()


async def _until(condition: Any, timeout: float = 30.0) -> None:
    """Wait (on the real clock) until ``condition()`` holds; fail after ``timeout``."""
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "the condition never held"
        await asyncio.sleep(0.001)


async def test_with_every_endpoint_out_calls_fail_fast(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        route = mock.post(url__regex=ANY_HOST).mock(
            side_effect=by_host({"a.test": refuse, "b.test": failing()})
        )
        client = api.client(
            base_url=[Endpoint(A, weight=HEAVY), B],
            breaker=BreakerConfig(consecutive_failures=2, open_time=5.0, jitter=0.0),
        )
        # a is ejected at its first refusal; b, the last one, never is: its breaker
        # opens on its second failure (a failover, then a budgeted retry).
        with pytest.raises(stormguard.InternalServerError) as first:
            await api.run(client.chat.completions.create(messages=MESSAGES))
        sent = route.call_count
        with pytest.raises(stormguard.CircuitOpenError) as info:
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert [a.endpoint for a in first.value.attempt_history] == [
        "a.test:80",
        "b.test:80",
        "b.test:80",
    ]
    assert route.call_count == sent == 3  # no I/O
    health = {h.endpoint: h.status for h in client.stats().endpoints}
    assert health == {"a.test:80": EndpointStatus.EJECTED, "b.test:80": EndpointStatus.ACTIVE}
    # The soonest way back: a's next connect check, before b's breaker (5 s). The
    # retry's backoff moved the clock past a's first check, which runs in a thread:
    # 1 s +-20 % if it has not failed yet, 1.6 s +-20 % if it has.
    assert info.value.retry_in is not None and info.value.retry_in <= 1.6 * 1.2


async def test_ejection_can_be_turned_off(api: Api) -> None:
    with respx.mock(assert_all_called=False) as mock:
        answer = by_host({"a.test": refuse, "b.test": ok()})
        mock.post(url__regex=ANY_HOST).mock(side_effect=answer)
        client = api.client(base_url=[Endpoint(A, weight=HEAVY), B], ejection=None)
        for _ in range(3):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    assert answer.seen.count("a.test:80") >= 2  # type: ignore[attr-defined]
    assert client.stats().endpoints == ()
    with pytest.raises(TypeError, match="EjectionConfig"):
        api.client(ejection={"probe": "call"})


async def test_failover_and_ejection_in_telemetry(api: Api) -> None:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    with respx.mock(assert_all_called=False) as mock:
        mock.post(url__regex=ANY_HOST).mock(side_effect=by_host({"a.test": refuse, "b.test": ok()}))
        client = api.client(base_url=[Endpoint(A, weight=HEAVY), B], telemetry=telemetry)
        await api.run(client.chat.completions.create(messages=MESSAGES))
    spans = exporter.get_finished_spans()
    [logical] = [s for s in spans if s.parent is None]
    attempts = sorted((s for s in spans if s.parent is not None), key=lambda s: s.start_time or 0)
    assert [dict(s.attributes or {}).get("stormguard.attempt.outcome") for s in attempts] == [
        "failover",
        "ok",
    ]
    assert dict(attempts[1].attributes or {})["stormguard.attempt.failover"] is True
    assert "stormguard.attempt.failover" not in dict(attempts[0].attributes or {})
    [event] = [e for e in logical.events if e.name == "stormguard.endpoint.transition"]
    attributes = dict(event.attributes or {})
    assert attributes["stormguard.attempt.endpoint"] == "a.test:80"
    assert attributes["stormguard.endpoint.status"] == "ejected"
    assert attributes["stormguard.endpoint.reason"] == "unreachable"
    assert 0.8 <= attributes["stormguard.endpoint.ejected_for_s"] <= 1.2
    data = reader.get_metrics_data()
    assert data is not None
    points = {
        metric.name: list(metric.data.data_points)
        for resource in data.resource_metrics
        for scope in resource.scope_metrics
        for metric in scope.metrics
    }
    [gauge] = points["stormguard.client.endpoint.status"]
    assert (gauge.attributes["stormguard.attempt.endpoint"], gauge.value) == ("a.test:80", 2)
    [counted] = points["stormguard.client.endpoint.transitions"]
    assert counted.value == 1 and counted.attributes["stormguard.endpoint.reason"] == "unreachable"
    tracer_provider.shutdown()
    meter_provider.shutdown()


def test_ejection_settings_reach_the_tracker() -> None:
    config = EjectionConfig(consecutive_failures=3, probe="call")
    client = stormguard.Client(base_url=[A, B], ejection=config)
    try:
        assert client._core.ejection is not None and client._core.ejection.config is config
    finally:
        client.close()
