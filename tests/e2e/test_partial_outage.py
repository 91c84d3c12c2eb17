"""A partial outage end to end, sync and async: three real reference servers, one
dead (its port refuses connections), one failing half its calls with 500, one
healthy. Every call succeeds; the dead one is out at its first refusal and gets no
attempt after it; failovers spend no retry budget; when a server comes back on the
dead port, a connect check (no call) returns it to rotation.

Assertions are on counts and on the ejection events, never on wall-clock timings.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

import stormguard
from stormguard import EjectionTransition, EndpointStatus
from tests.e2e.conftest import ServerFactory, spec
from tests.e2e.server_process import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"
MESSAGES = [{"role": "user", "content": "ping"}]
CALLS = 60
AT_ONCE = 6


@pytest.fixture
def dead_socket() -> Iterator[socket.socket]:
    """A loopback port bound but never listened on: every connection is refused, and
    no other process can take the port while the test holds it (close it to let one)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock


def attempts_seen(server: RunningServer) -> int:
    """Generation requests the server received (every attempt number)."""
    return int(
        sum(v for k, v in server.metrics().items() if k.startswith("stormguard_attempts_total{"))
    )


def run_calls(mode: str, urls: list[str], events: list[EjectionTransition]) -> tuple[Any, Any]:
    """``CALLS`` chat calls, ``AT_ONCE`` at a time, from a fresh client of ``mode``;
    each one's result or error, and the client's stats after them."""
    options: dict[str, Any] = {
        "base_url": urls,
        "model": MODEL,
        "timeout": 10,
        "ejection_listeners": [events.append],
    }
    if mode == "sync":

        def one(client: stormguard.Client) -> Any:
            try:
                return client.chat.completions.create(messages=MESSAGES, max_tokens=4)
            except stormguard.StormguardError as exc:
                return exc

        with stormguard.Client(**options) as client, ThreadPoolExecutor(AT_ONCE) as pool:
            return list(pool.map(lambda _: one(client), range(CALLS))), client.stats()

    async def run() -> tuple[Any, Any]:
        gate = asyncio.Semaphore(AT_ONCE)
        async with stormguard.AsyncClient(**options) as client:

            async def call() -> Any:
                async with gate:
                    try:
                        return await client.chat.completions.create(messages=MESSAGES, max_tokens=4)
                    except stormguard.StormguardError as exc:
                        return exc

            return await asyncio.gather(*(call() for _ in range(CALLS))), client.stats()

    return asyncio.run(run())


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_partial_outage_loses_no_call_and_spares_the_dead_replica(
    mode: str, dead_socket: socket.socket, stormguard_server_factory: ServerFactory
) -> None:
    dead_port = dead_socket.getsockname()[1]
    erroring, healthy = stormguard_server_factory.together(spec("--error-rate", "0.5"), spec())
    dead = f"127.0.0.1:{dead_port}"
    events: list[EjectionTransition] = []
    urls = [f"http://{dead}/v1", erroring.base_url, healthy.base_url]
    results, stats = run_calls(mode, urls, events)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, errors[:3]
    # Out at its first refusal, for good: no probation, no return while it refuses.
    to_dead = [e for e in events if e.endpoint == dead]
    assert to_dead[0].to_status is EndpointStatus.EJECTED
    assert to_dead[0].reason == "unreachable"
    assert {e.to_status for e in to_dead} == {EndpointStatus.EJECTED}
    # No attempt was sent to it after it was ejected: only calls already under way
    # when it refused the first one (at most one each) had picked it.
    ejected_at = to_dead[0].at
    dead_attempts = [a for r in results for a in r.attempt_history if a.endpoint == dead]
    assert 1 <= len(dead_attempts) <= AT_ONCE
    assert all(a.started_at is not None and a.started_at <= ejected_at for a in dead_attempts)
    # Every failover was free: the budget refused nothing, and each call made at most
    # one attempt per server, so the live servers saw about one attempt per call.
    assert stats.retries_refused_by_budget == 0
    for r in results:
        endpoints = [a.endpoint for a in r.attempt_history]
        assert len(endpoints) == len(set(endpoints)), endpoints
    live = attempts_seen(erroring) + attempts_seen(healthy)
    assert CALLS <= live <= CALLS + stats.failovers
    health = {h.endpoint: h for h in stats.endpoints}
    assert health[dead].status is EndpointStatus.EJECTED


def test_a_replica_back_on_the_dead_port_returns_through_a_connect_check(
    dead_socket: socket.socket, stormguard_server_factory: ServerFactory
) -> None:
    dead_port = dead_socket.getsockname()[1]
    healthy = stormguard_server_factory()
    dead = f"127.0.0.1:{dead_port}"
    events: list[EjectionTransition] = []
    returned = threading.Event()

    def listen(event: EjectionTransition) -> None:
        events.append(event)
        if event.endpoint == dead and event.to_status is not EndpointStatus.EJECTED:
            returned.set()

    with stormguard.Client(
        base_url=[f"http://{dead}/v1", healthy.base_url],
        model=MODEL,
        timeout=10,
        ejection_listeners=[listen],
    ) as client:
        while not any(e.endpoint == dead for e in events):  # until a call meets the refusal
            client.chat.completions.create(messages=MESSAGES, max_tokens=4)
        # Bring a server up on the dead port: the next connect check finds it.
        dead_socket.close()
        revived = stormguard_server_factory(port=dead_port)
        before = attempts_seen(revived)
        end = time.monotonic() + 60
        while not returned.is_set():
            assert time.monotonic() < end, f"never returned: {events}"
            client.chat.completions.create(messages=MESSAGES, max_tokens=4)
            returned.wait(0.05)
        # The check was a TCP connect, not a call: the server saw nothing until then.
        assert attempts_seen(revived) == before
        back = [e for e in events if e.endpoint == dead and e.reason == "reachable"]
        assert back and back[0].to_status is EndpointStatus.PROBATION
        # Calls flow to it again (power of two choices over both).
        for _ in range(40):
            client.chat.completions.create(messages=MESSAGES, max_tokens=4)
        assert attempts_seen(revived) > before
        health = {h.endpoint: h.status for h in client.stats().endpoints}
    assert health[dead] is EndpointStatus.ACTIVE
