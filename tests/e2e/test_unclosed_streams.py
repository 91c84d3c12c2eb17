"""Streams the caller left without closing them, against a real server on 127.0.0.1.

``async for chunk in stream: break``, then nothing: ordinary code. Each such stream
held its concurrency slot for good, so that after as many as the limit every later
call of the client (and of any client sharing its limiter) waited for a slot until
its deadline. Now a stream left unclosed gives back, when it is collected, its slot
and its connection (the server sees the disconnect), its call ends as cancelled,
and a ``ResourceWarning`` names it; three times the limit of them later, the
client still serves calls.
"""

from __future__ import annotations

import contextlib
import gc
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

import stormguard
from stormguard._events import CallEnded
from stormguard._unclosed import reaped, settled
from tests.e2e.flaky_server import FlakyServer, running, wait_for
from tests.sdk.helpers import own_pools

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "tell me a long story"}]
LIMIT = 4
LEFT = 3 * LIMIT


@pytest.fixture(scope="module")
def server() -> Iterator[FlakyServer]:
    yield from running()


@pytest.fixture(autouse=True)
def _endless_streams(server: FlakyServer) -> None:
    # Streams that outlast the test: only the client can end them.
    server.reset(stream_chunks=1_000_000, stream_interval=0.005)


class Ends:
    """An observer that keeps the end of each call."""

    def __init__(self) -> None:
        self.ended: list[CallEnded] = []

    def start_call(self, event: Any) -> Any:
        ended = self.ended

        class Call:
            def on_event(self, event: Any) -> None:
                if isinstance(event, CallEnded):
                    ended.append(event)

            def attempt_started(self, event: Any) -> dict[str, str]:
                return {}

            def active(self) -> Any:
                return contextlib.nullcontext()

            def sending(self) -> Any:
                return contextlib.nullcontext()

        return Call()

    def breaker_changed(self, transition: Any) -> None:
        pass

    @property
    def cancelled(self) -> int:
        return sum(1 for event in self.ended if event.cancelled and event.error is None)


def options(server: FlakyServer, ends: Ends) -> dict[str, Any]:
    return {
        "base_url": server.base_url,
        "model": "e2e",
        "api_key": "x",
        "timeout": 5,
        "concurrency": stormguard.ConcurrencyLimiter(
            initial_limit=LIMIT, min_limit=1, max_limit=LIMIT
        ),
        "telemetry": ends,
    }


def held_requests(client: stormguard.Client | stormguard.AsyncClient) -> int:
    """Requests the client's pool still holds: 0 once nothing was left in it."""
    shards = getattr(client._http._transport, "shards", ())
    held = sum(len(pool._pool._requests) for pool in own_pools(client))
    return int(held + sum(shard.in_flight for shard in shards))


def in_flight(client: stormguard.Client | stormguard.AsyncClient) -> int:
    return sum(limit.in_flight for limit in client.stats().concurrency)


def unclosed(caught: list[warnings.WarningMessage], name: str) -> int:
    return sum(
        1
        for w in caught
        if issubclass(w.category, ResourceWarning)
        and str(w.message).startswith(f"Unclosed <{name}")
    )


async def test_async_streams_left_unclosed_give_back_their_slots(server: FlakyServer) -> None:
    ends = Ends()
    async with stormguard.AsyncClient(**options(server, ends)) as client:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            for _ in range(LEFT):
                stream = await client.chat.completions.create(messages=MESSAGES, stream=True)
                async for _chunk in stream:
                    break
                del stream
            answer = await client.chat.completions.create(messages=MESSAGES)
            await settled()
        assert answer.choices[0].message.content == "pong"
        assert in_flight(client) == 0
        assert held_requests(client) == 0
        assert wait_for(lambda: server.seen.streams_disconnected == LEFT)
        assert ends.cancelled == LEFT
        assert unclosed(caught, "AsyncStream") == LEFT


def test_sync_streams_left_unclosed_give_back_their_slots(server: FlakyServer) -> None:
    ends = Ends()
    with stormguard.Client(**options(server, ends)) as client:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            for _ in range(LEFT):
                stream = client.chat.completions.create(messages=MESSAGES, stream=True)
                for _chunk in stream:
                    break
                del stream
            answer = client.chat.completions.create(messages=MESSAGES)
            assert reaped()
        assert answer.choices[0].message.content == "pong"
        assert in_flight(client) == 0
        assert held_requests(client) == 0
        assert wait_for(lambda: server.seen.streams_disconnected == LEFT)
        assert ends.cancelled == LEFT
        assert unclosed(caught, "Stream") == LEFT


async def test_streams_in_a_reference_cycle_are_closed_by_the_collector(
    server: FlakyServer,
) -> None:
    """A stream kept in a reference cycle is collected by the cyclic collector, which
    may run at any allocation, in any thread: its clean-up still runs on its loop."""
    ends = Ends()
    async with stormguard.AsyncClient(**options(server, ends)) as client:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            gc.disable()
            try:
                for _ in range(LIMIT):
                    holder: dict[str, Any] = {}
                    holder["self"] = holder
                    holder["stream"] = await client.chat.completions.create(
                        messages=MESSAGES, stream=True
                    )
                    await holder["stream"].__anext__()
                    del holder
                assert in_flight(client) == LIMIT  # held until the cycle is collected
                gc.collect()
            finally:
                gc.enable()
            await settled()
        assert in_flight(client) == 0 and held_requests(client) == 0
        assert ends.cancelled == LIMIT and unclosed(caught, "AsyncStream") == LIMIT
        answer = await client.chat.completions.create(messages=MESSAGES)
        assert answer.choices[0].message.content == "pong"
