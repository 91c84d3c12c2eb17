"""Several servers end to end: a restarting instance is paused and traffic flows to
the healthy one; a backlog waits out a restart; breakers fail fast when every server
is broken, and recover; fallback to a second model; openai-python through
stormguard.httpx_client.

Faults come from the reference server's admin endpoint: ``POST /admin/crash`` (the
engine dies as on an OOM and stays cold for ``--restart-s``, answering 503
``x-load-shed: engine_restart`` with the remaining time as Retry-After) and
``POST /admin/faults`` (``error_rate``: the engine fails requests with 500s).
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

import stormguard
from stormguard import BreakerConfig, CircuitState, Endpoint
from tests.e2e.conftest import ServerFactory, spec
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
    server.admin_post("/admin/crash", timeout=5).raise_for_status()
    deadline = time.monotonic() + 5
    while httpx.get(server.url("/ready"), timeout=5).status_code == 200:
        assert time.monotonic() < deadline, "the engine did not go down"
        time.sleep(0.02)


def broken(server: RunningServer, error_rate: float) -> None:
    """Make the engine fail that share of requests with 500s (crash-like failures)."""
    server.admin_post("/admin/faults", {"error_rate": error_rate}, timeout=5).raise_for_status()


def test_restarting_instance_is_paused_and_traffic_flows_to_the_healthy_one(
    stormguard_server_factory: ServerFactory,
) -> None:
    sick, healthy = stormguard_server_factory.together(
        spec("--restart-s", "30", admin=True), spec()
    )
    with stormguard.Client(
        base_url=[sick.base_url, healthy.base_url], model=MODEL, timeout=10
    ) as client:
        crash(sick)
        before = requests_seen(sick)
        for _ in range(30):
            resp = client.chat.completions.create(messages=MESSAGES, max_tokens=4)
            assert resp.choices[0].message.content
        to_sick = requests_seen(sick) - before
        stats = client.stats()
    # The first call to find it restarting was requeued on the healthy one; its
    # Retry-After (~30 s) then keeps it paused: no slot of it is handed out.
    assert to_sick <= 1
    limits = {s.endpoint: s for s in stats.concurrency}
    assert limits[f"127.0.0.1:{sick.port}"].paused_for > 20
    assert limits[f"127.0.0.1:{healthy.port}"].paused_for == 0
    assert {b.state for b in stats.breakers} == {CircuitState.CLOSED}  # restarting is not dead


def test_a_backlog_waits_out_a_restart_and_the_hopeless_fail_at_once(
    stormguard_server_factory: ServerFactory,
) -> None:
    server = stormguard_server_factory("--restart-s", "2", admin=True)
    with stormguard.Client(base_url=server.base_url, model=MODEL, timeout=30) as client:
        client.chat.completions.create(messages=MESSAGES, max_tokens=4)
        crash(server)
        results: list[object] = []

        def call(timeout: float) -> None:
            try:
                results.append(
                    client.chat.completions.create(messages=MESSAGES, max_tokens=4, timeout=timeout)
                    .choices[0]
                    .message.content
                )
            except stormguard.StormguardError as exc:
                results.append(exc)

        patient = [threading.Thread(target=call, args=(30.0,)) for _ in range(20)]
        patient[0].start()  # finds the engine down: the endpoint pauses for its Retry-After
        endpoint = client.concurrency.endpoint(f"127.0.0.1:{server.port}")
        deadline = time.monotonic() + 10
        while endpoint.state().paused_for == 0:
            assert time.monotonic() < deadline, "the restart was never seen"
            time.sleep(0.01)
        for t in patient[1:]:  # the backlog arrives while it is paused
            t.start()
        for t in patient:
            t.join(60)
        assert all(isinstance(r, str) for r in results), results  # every one waited
        stats = client.stats()
        # The restart cost the first call's attempt and a probe per Retry-After while
        # the engine was still cold or warming, not an attempt per waiting call.
        assert stats.attempts == requests_seen(server)
        assert stats.attempts <= 1 + 20 + 5, stats
        assert stats.retries == 0
        # While paused, a call whose deadline ends before the server is back is told
        # so at once, with no request.
        crash(server)
        # "At once" is shown by what the errors say (decided on the server's Retry-After
        # or the pause), not by a wall-clock bound: a refusal at the deadline itself
        # would be a QueueTimeoutError without an estimate.
        with pytest.raises(stormguard.StormguardError) as found:  # finds it down: ~2 s to wait
            client.chat.completions.create(messages=MESSAGES, max_tokens=4, timeout=0.5)
        first = found.value
        assert first.retry_stopped_by == "deadline" and first.attempts == 1
        assert not isinstance(first, stormguard.QueueTimeoutError) or first.estimated_wait_s
        seen = requests_seen(server)
        with pytest.raises(stormguard.QueueTimeoutError) as info:
            client.chat.completions.create(messages=MESSAGES, max_tokens=4, timeout=0.5)
        assert info.value.retry_stopped_by == "deadline" and info.value.attempts == 0
        assert info.value.estimated_wait_s is not None and info.value.estimated_wait_s > 0.5
        assert requests_seen(server) == seen


def test_all_broken_calls_fail_fast_then_recover(stormguard_server_factory: ServerFactory) -> None:
    servers = stormguard_server_factory.together(spec(admin=True), spec(admin=True))
    breaker = BreakerConfig(consecutive_failures=2, open_time=2.0, jitter=0.0)
    with stormguard.Client(
        base_url=[s.base_url for s in servers], model=MODEL, breaker=breaker, timeout=5
    ) as client:
        for server in servers:
            broken(server, 1.0)
        failures: list[type[BaseException]] = []
        for _ in range(6):
            try:
                client.chat.completions.create(messages=MESSAGES, max_tokens=4)
            except stormguard.StormguardError as exc:
                failures.append(type(exc))
        assert len(failures) == 6
        assert stormguard.CircuitOpenError in failures
        # While the breakers are open (2 s), every call is refused before any I/O: no
        # attempt, no request reaching either server. (How fast a refusal is belongs to
        # the benchmarks; the loop only stays well inside the open time, so that a
        # stalled machine cannot reach the half-open probe.)
        seen = [requests_seen(s) for s in servers]
        started = time.monotonic()
        refused = 0
        while refused < 20 and time.monotonic() - started < 1.0:
            with pytest.raises(stormguard.CircuitOpenError) as info:
                client.chat.completions.create(messages=MESSAGES, max_tokens=4)
            assert info.value.attempts == 0
            assert info.value.retry_stopped_by == "circuit_open"
            refused += 1
        assert refused >= 1
        assert [requests_seen(s) for s in servers] == seen
        for server in servers:
            broken(server, 0.0)
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
    big, small = stormguard_server_factory.together(
        spec("--model", "big", "--restart-s", "6", admin=True), spec("--model", "small")
    )
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
    started = stormguard_server_factory.together(spec(admin=True), spec(admin=True))
    servers = dict(zip(("sg", "oai"), started, strict=True))
    breaker = BreakerConfig(consecutive_failures=3, open_time=30.0, jitter=0.0)
    sg = stormguard.Client(base_url=servers["sg"].base_url, model=MODEL, breaker=breaker, timeout=2)
    http = stormguard.httpx_client(base_url=servers["oai"].base_url, breaker=breaker, timeout=2)
    oai = openai.OpenAI(
        base_url=servers["oai"].base_url, api_key="none", http_client=http, max_retries=0
    )
    for server in servers.values():
        broken(server, 1.0)
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
            outcomes["oai"].append("CircuitOpenError" if shed == "circuit_open" else "5xx")
    seen = {name: requests_seen(server) for name, server in servers.items()}
    sg_stats, oai_stats = sg.stats(), http._transport.client.stats()  # type: ignore[attr-defined]
    sg.close()
    http.close()
    # The same budgeted retries and the same breaker, whichever client library calls.
    assert seen["sg"] == seen["oai"] == sg_stats.attempts == oai_stats.attempts
    assert outcomes["sg"].count("CircuitOpenError") == outcomes["oai"].count("CircuitOpenError")
    assert outcomes["sg"].count("CircuitOpenError") >= 7
    # The first call and its one budgeted retry, the second call trips it: 3 requests.
    assert sg_stats.attempts == 3
