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

import asyncio
import contextlib
import gc
import inspect
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stormguard
from stormguard._call.unclosed import reaped, settled
from stormguard.telemetry._events import CallEnded
from tests.e2e.flaky_server import FlakyServer, running, wait_for
from tests.e2e.server_process import RunningServer, run_server
from tests.sdk.helpers import local, own_pools

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


def limiter() -> stormguard.ConcurrencyLimiter:
    return stormguard.ConcurrencyLimiter(initial_limit=LIMIT, min_limit=1, max_limit=LIMIT)


def options(server: FlakyServer, ends: Ends) -> dict[str, Any]:
    return {
        "base_url": server.base_url,
        "model": "e2e",
        "api_key": "x",
        "timeout": 5,
        "concurrency": limiter(),
        "telemetry": ends,
    }


def held_requests(client: stormguard.Client | stormguard.AsyncClient) -> int:
    """Requests the client's pool still holds: 0 once nothing was left in it (on the
    aiohttp backend, the connections its connector has handed out)."""
    session = getattr(local(client._http._transport), "_session", None)
    if session is not None:
        return len(session.connector._acquired)
    shards = getattr(client._http._transport, "shards", ())
    held = sum(len(pool._pool._requests) for pool in own_pools(client))
    return int(held + sum(shard.in_flight for shard in shards))


def in_flight(client: stormguard.Client | stormguard.AsyncClient) -> int:
    return sum(limit.in_flight for limit in client.stats().concurrency)


def unclosed(caught: list[warnings.WarningMessage], name: str, server: FlakyServer) -> int:
    """The warnings of ``name``s of calls to ``server`` (another test's object may be
    collected meanwhile)."""
    return sum(
        1
        for w in caught
        if issubclass(w.category, ResourceWarning)
        and str(w.message).startswith(f"Unclosed <{name} POST {server.base_url}/")
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
        assert unclosed(caught, "AsyncStream", server) == LEFT


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
            reaped()
        assert answer.choices[0].message.content == "pong"
        assert in_flight(client) == 0
        assert held_requests(client) == 0
        assert wait_for(lambda: server.seen.streams_disconnected == LEFT)
        assert ends.cancelled == LEFT
        assert unclosed(caught, "Stream", server) == LEFT


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
        assert ends.cancelled == LIMIT and unclosed(caught, "AsyncStream", server) == LIMIT
        answer = await client.chat.completions.create(messages=MESSAGES)
        assert answer.choices[0].message.content == "pong"


# -- The property, over many ways to leave things unclosed (the reference server) ------

RESOURCES = ("chat", "completions", "responses")
#: How the caller got what it left: a stream; ``with_raw_response`` of a stream (parsed
#: or not); ``with_streaming_response`` of a stream (parsed and read from, or read line
#: by line), or of an answer whose body it never read.
KINDS = ("stream", "raw", "streamed", "lines", "unread")
LEFT_NAMES = ("Unclosed <Stream", "Unclosed <AsyncStream", "Unclosed <APIResponse")
LEFT_NAMES += ("Unclosed <AsyncAPIResponse",)


@dataclass(frozen=True)
class Left:
    kind: str
    resource: str
    read: int  # chunks or lines read before it was left
    in_cycle: bool  # left in a reference cycle: only the cyclic collector frees it


left_objects = st.lists(
    st.builds(
        Left,
        st.sampled_from(KINDS),
        st.sampled_from(RESOURCES),
        st.integers(0, 2),
        st.booleans(),
    ),
    min_size=1,
    max_size=3 * LIMIT,
)


@pytest.fixture(scope="module")
def reference() -> Iterator[RunningServer]:
    with run_server() as running:
        yield running


def arguments(left: Left) -> dict[str, Any]:
    stream = left.kind != "unread"
    size = 300 if stream else 2  # streams that outlast the example
    if left.resource == "chat":
        return {"messages": MESSAGES, "max_tokens": size, "stream": stream}
    if left.resource == "completions":
        return {"prompt": "tell me a long story", "max_tokens": size, "stream": stream}
    return {"input": "tell me a long story", "max_output_tokens": size, "stream": stream}


async def leave(client: Any, left: Left) -> list[Any]:
    """Make the call ``left`` describes and read from it; what the caller then holds."""

    async def run(value: Any) -> Any:
        return await value if inspect.isawaitable(value) else value

    async def take(items: Any) -> None:
        for _ in range(left.read):
            await run(next(items) if hasattr(items, "__next__") else items.__anext__())

    resource = getattr(client, left.resource)
    resource = resource.completions if left.resource == "chat" else resource
    kwargs = arguments(left)
    if left.kind == "stream":
        stream = await run(resource.create(**kwargs))
        await take(stream)
        return [stream]
    if left.kind == "raw":
        raw = await run(resource.with_raw_response.create(**kwargs))
        if not left.read:
            return [raw]
        stream = raw.parse()
        await take(stream)
        return [raw, stream]
    manager = resource.with_streaming_response.create(**kwargs)
    sync = hasattr(manager, "__enter__")
    response = manager.__enter__() if sync else await manager.__aenter__()
    if left.kind == "streamed" and left.read:
        stream = await run(response.parse())
        await take(stream)
        return [manager, response, stream]
    if left.kind == "lines" and left.read:
        lines = response.iter_lines()
        await take(lines)
        return [manager, response, lines]
    return [manager, response]


async def leave_all(client: Any, lefts: list[Left]) -> None:
    for left in lefts:
        held = await leave(client, left)
        if left.in_cycle:
            held.append(held)  # the list holds itself: only the cyclic collector frees it
        del held
        if left.in_cycle:
            gc.collect()  # before the next call: until it runs, the slot is still held


async def check_nothing_leaks(client: Any, lefts: list[Left], ends: Ends) -> list[str]:
    """Leave ``lefts``, collect them; then nothing they held is held. Their warnings."""
    shown: list[str] = []
    with warnings.catch_warnings():
        warnings.simplefilter("always", ResourceWarning)
        # Only the text: a recorded warning would keep the object it names alive.
        warnings.showwarning = lambda message, *args, **kw: shown.append(str(message))
        await leave_all(client, lefts)
        await collected()
    assert in_flight(client) == 0
    assert held_requests(client) == 0
    assert len(ends.ended) == len(lefts) and ends.cancelled == len(lefts)
    base = str(client.base_url)  # another test's object may be collected meanwhile
    return [message for message in shown if message.startswith(LEFT_NAMES) and base in message]


async def collected() -> None:
    """Run the clean-ups handed over, and the collector, until nothing more is freed."""
    await settled()
    while gc.collect():
        await settled()


def served(answer: Any) -> bool:
    return bool(answer.choices[0].message.content)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lefts=left_objects)
def test_async_nothing_left_unclosed_leaks(reference: RunningServer, lefts: list[Left]) -> None:
    async def example() -> None:
        ends = Ends()
        options: dict[str, Any] = {"base_url": reference.base_url, "model": "stormguard-sim"}
        options.update(api_key="x", timeout=20, telemetry=ends, concurrency=limiter())
        async with stormguard.AsyncClient(**options) as client:
            shown = await check_nothing_leaks(client, lefts, ends)
            assert len(shown) == len(lefts), shown
            answer = await client.chat.completions.create(messages=MESSAGES, max_tokens=2)
            assert served(answer)

    asyncio.run(example())


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lefts=left_objects)
def test_sync_nothing_left_unclosed_leaks(reference: RunningServer, lefts: list[Left]) -> None:
    async def example() -> None:
        ends = Ends()
        options: dict[str, Any] = {"base_url": reference.base_url, "model": "stormguard-sim"}
        options.update(api_key="x", timeout=20, telemetry=ends, concurrency=limiter())
        with stormguard.Client(**options) as client:
            shown = await check_nothing_leaks(client, lefts, ends)
            assert len(shown) == len(lefts), shown
            answer = client.chat.completions.create(messages=MESSAGES, max_tokens=2)
            assert served(answer)

    asyncio.run(example())


@pytest.mark.slow
async def test_openai_streams_left_unclosed_over_the_transport(server: FlakyServer) -> None:
    """openai-python's ``AsyncOpenAI`` over ``stormguard.async_httpx_client()``: its
    streams left unclosed give back their slots too (stormguard's stream is under them),
    once collected. openai's ``AsyncStream`` holds itself (its iterator is a generator
    of its own method): only the cyclic collector frees it, not its reference count."""
    ends = Ends()
    http = stormguard.async_httpx_client(**options(server, ends))
    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key="x", http_client=http, max_retries=0
    ) as client:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            for _ in range(LEFT):
                stream = await client.chat.completions.create(
                    model="e2e", messages=MESSAGES, stream=True
                )
                async for _chunk in stream:
                    break
                del stream
                gc.collect()
            answer = await client.chat.completions.create(model="e2e", messages=MESSAGES)
            # Collected, its async generators are closed by tasks of asyncio's, which
            # hold it again until they end: the collector frees it the next time.
            await collected()
        assert answer.choices[0].message.content == "pong"
        stormguard_client = http._transport.client
        assert in_flight(stormguard_client) == 0 and held_requests(stormguard_client) == 0
        assert wait_for(lambda: server.seen.streams_disconnected == LEFT)
        assert ends.cancelled == LEFT
