"""Issue 6 end to end: breakers eject a restarting instance, fail fast when all are down,
recover; fallback to a second model; openai-python through stormguard.httpx_client.

Faults come from the reference server's admin endpoint (``POST /admin/crash``: the
engine dies as on an OOM and stays cold for ``--restart-s``, answering 503
``x-load-shed: engine_restart`` with the remaining time as Retry-After).
"""

from __future__ import annotations

import time

import httpx
import openai
import pytest

import stormguard
from stormguard import BreakerConfig, CircuitState, Endpoint
from tests.e2e.conftest import ServerFactory
from tests.e2e.server_process import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"
MESSAGES = [{"role": "user", "content": "ping"}]
TRIP_FAST = BreakerConfig(consecutive_failures=2, open_time=0.5, jitter=0.0)


def requests_seen(server: RunningServer) -> int:
    """Generation requests the server received (every attempt number)."""
    return int(
        sum(v for k, v in server.metrics().items() if k.startswith("stormguard_attempts_total{"))
    )


def crash(server: RunningServer) -> None:
    httpx.post(server.admin_url("/admin/crash"), timeout=5).raise_for_status()
    deadline = time.monotonic() + 5
    while httpx.get(server.url("/ready"), timeout=5).status_code == 200:
        assert time.monotonic() < deadline, "the engine did not go down"
        time.sleep(0.02)


def test_restarting_instance_is_ejected_and_traffic_flows_to_the_healthy_one(
    stormguard_server_factory: ServerFactory,
) -> None:
    sick = stormguard_server_factory("--restart-s", "6", admin=True)
    healthy = stormguard_server_factory()
    breaker = BreakerConfig(consecutive_failures=2, open_time=30.0, jitter=0.0)
    # A fresh client's budget holds one retry (the floor); allow the two this test needs.
    budget = stormguard.RetryBudget(min_retries_per_second=0.5)
    with stormguard.Client(
        base_url=[sick.base_url, healthy.base_url],
        model=MODEL,
        breaker=breaker,
        retry_budget=budget,
        timeout=10,
    ) as client:
        crash(sick)
        before = requests_seen(sick)
        for _ in range(30):
            resp = client.chat.completions.create(messages=MESSAGES, max_tokens=4)
            assert resp.choices[0].message.content
        to_sick = requests_seen(sick) - before
        states = {s.name: s.state for s in client.stats().breakers}
    assert to_sick <= 2  # two engine_restart answers eject it; each was retried elsewhere
    assert states[f"{MODEL}@127.0.0.1:{sick.port}"] is CircuitState.OPEN
    assert states[f"{MODEL}@127.0.0.1:{healthy.port}"] is CircuitState.CLOSED


def test_all_down_calls_fail_fast_then_recover(stormguard_server_factory: ServerFactory) -> None:
    servers = [stormguard_server_factory("--restart-s", "2", admin=True) for _ in range(2)]
    with stormguard.Client(
        base_url=[s.base_url for s in servers], model=MODEL, breaker=TRIP_FAST, timeout=5
    ) as client:
        for server in servers:
            crash(server)
        failures: list[type[BaseException]] = []
        for _ in range(6):
            try:
                client.chat.completions.create(messages=MESSAGES, max_tokens=4)
            except stormguard.StormguardError as exc:
                failures.append(type(exc))
        assert len(failures) == 6
        assert stormguard.CircuitOpenError in failures
        # While the breakers are open (at least the servers' Retry-After, ~2 s), no
        # request reaches either server.
        seen = [requests_seen(s) for s in servers]
        started = time.monotonic()
        fast = 0
        while time.monotonic() - started < 0.8:
            with pytest.raises(stormguard.CircuitOpenError):
                client.chat.completions.create(messages=MESSAGES, max_tokens=4)
            fast += 1
        assert fast > 20
        assert [requests_seen(s) for s in servers] == seen
        for server in servers:
            server.wait_ready()
        recovered = time.monotonic() + 10
        while True:  # the half-open probe closes each breaker once its open time is over
            try:
                resp = client.chat.completions.create(messages=MESSAGES, max_tokens=4)
                break
            except stormguard.StormguardError:
                assert time.monotonic() < recovered, "calls did not recover"
                time.sleep(0.1)
        assert resp.choices[0].message.content
        for _ in range(10):
            client.chat.completions.create(messages=MESSAGES, max_tokens=4)


def test_fallback_to_a_second_model_on_another_server(
    stormguard_server_factory: ServerFactory,
) -> None:
    big = stormguard_server_factory("--model", "big", "--restart-s", "6", admin=True)
    small = stormguard_server_factory("--model", "small")
    with stormguard.Client(
        base_url=[
            Endpoint(big.base_url, models=["big"]),
            Endpoint(small.base_url, models=["small"]),
        ],
        model="big",
        fallback_models=["small"],
        breaker=TRIP_FAST,
        # Shorter than big's Retry-After (~6 s): waiting it out is not an option, so
        # the call falls back instead.
        timeout=3,
    ) as client:
        assert not client.chat.completions.create(messages=MESSAGES, max_tokens=4).degraded
        crash(big)
        served = [client.chat.completions.create(messages=MESSAGES, max_tokens=4) for _ in range(5)]
        stats = client.stats()
    assert all(r.degraded and r.served_model == "small" and r.model == "small" for r in served)
    assert stats.fallbacks == 5


def test_openai_through_httpx_client_gets_the_same_protection(
    stormguard_server_factory: ServerFactory,
) -> None:
    servers = {
        name: stormguard_server_factory("--restart-s", "8", admin=True) for name in ("sg", "oai")
    }
    breaker = BreakerConfig(consecutive_failures=3, open_time=30.0, jitter=0.0)
    # A 2 s deadline: the servers' Retry-After (8 s) cannot be waited out, so every
    # call fails and the breakers' work is visible.
    sg = stormguard.Client(base_url=servers["sg"].base_url, model=MODEL, breaker=breaker, timeout=2)
    http = stormguard.httpx_client(base_url=servers["oai"].base_url, breaker=breaker, timeout=2)
    oai = openai.OpenAI(
        base_url=servers["oai"].base_url, api_key="none", http_client=http, max_retries=0
    )
    for server in servers.values():
        crash(server)
    outcomes: dict[str, list[str]] = {"sg": [], "oai": []}
    for _ in range(10):
        try:
            sg.chat.completions.create(messages=MESSAGES, max_tokens=4)
        except stormguard.StormguardError as exc:
            outcomes["sg"].append(type(exc).__name__)
        try:
            oai.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
        except openai.APIStatusError as exc:
            shed = exc.response.headers.get("x-load-shed")
            outcomes["oai"].append("CircuitOpenError" if shed == "circuit_open" else "503")
    seen = {name: requests_seen(server) for name, server in servers.items()}
    sg_stats, oai_stats = sg.stats(), http._transport.client.stats()  # type: ignore[attr-defined]
    sg.close()
    http.close()
    # The same budgeted retries and the same breaker, whichever client library calls.
    assert seen["sg"] == seen["oai"] == sg_stats.attempts == oai_stats.attempts
    assert outcomes["sg"].count("CircuitOpenError") == outcomes["oai"].count("CircuitOpenError")
    assert outcomes["sg"].count("CircuitOpenError") >= 7
    assert sg_stats.attempts == 3  # 3 to trip, no retry: Retry-After is past the deadline
