"""Objects a caller forgot to close give back what they held when they are collected.

A stream, a ``with_raw_response`` stream, a ``with_streaming_response`` response, a
client: each, collected unclosed, gives back its concurrency slot and its connection,
ends its call as cancelled, and warns (``ResourceWarning``, naming it). The
finalizer hands its work over and returns (``_call/unclosed.py``): it runs in whatever
thread drops the last reference, perhaps one that holds the very lock the clean-up
needs, or after the event loop has closed; it must neither block nor raise there.
The same against a real server and its pool: tests/e2e/test_left_unclosed.py.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
import warnings
import weakref
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import respx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import stormguard
from stormguard._call.unclosed import aclose_later, reaped, settled
from stormguard._policies.breaker.config import BreakerConfig
from stormguard._policies.breaker.states import CircuitState
from stormguard.telemetry import Telemetry
from tests.sdk.helpers import MESSAGES, Api, chat_json, chunk, event_stream, sse

SECRET = "sk-test-secret-key"
#: This module's server: a warning of another test's object, collected here, names another.
BASE = "http://left.test/v1"


@pytest.fixture(autouse=True)
def _frozen_heap() -> Iterator[None]:
    """What the suite made before this test is frozen (``gc.freeze``): the test's
    collections look at its own objects only, not at the whole suite's heap (seconds
    a collection), and no other test's garbage warns while it counts warnings."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture
def mock() -> Iterator[respx.MockRouter]:
    with respx.mock(base_url=BASE, assert_all_called=False) as router:
        yield router


def make(api: Api, **options: Any) -> Any:
    return api.client(base_url=BASE, **options)


def open_stream() -> httpx.Response:
    """A stream whose body ends before [DONE]: never read to its end here."""
    return event_stream(sse(chunk("a"), chunk("b"), chunk("c"), done=False))


def one_slot() -> stormguard.ConcurrencyLimiter:
    return stormguard.ConcurrencyLimiter(initial_limit=1, min_limit=1, max_limit=1)


def in_flight(client: Any) -> int:
    return sum(limit.in_flight for limit in client.stats().concurrency)


@pytest.fixture
def caught() -> Iterator[list[str]]:
    """The ResourceWarnings' messages: only their text, for a recorded warning keeps its
    source (the object collected) alive, and with it what it held."""
    messages: list[str] = []

    def show(message: Warning | str, category: type[Warning], *args: Any, **kw: Any) -> None:
        if issubclass(category, ResourceWarning):
            messages.append(str(message))

    with warnings.catch_warnings():
        warnings.simplefilter("always", ResourceWarning)
        warnings.showwarning = show
        yield messages


def unclosed(caught: list[str]) -> list[str]:
    """The warnings of this module's objects."""
    return [message for message in caught if BASE in message]


async def collected() -> None:
    """Collect, and run the clean-ups handed over, until nothing more is freed."""
    await settled()
    while gc.collect():
        await settled()


async def first_chunk(api: Api, stream: Any) -> Any:
    return next(stream) if api.mode == "sync" else await stream.__anext__()


async def test_a_stream_left_unclosed_gives_back_its_slot_and_warns(
    api: Api, mock: respx.MockRouter, caught: list[str]
) -> None:
    mock.post("/chat/completions").mock(side_effect=lambda request: open_stream())
    client = make(api, concurrency=one_slot())
    for _ in range(3):  # each takes the only slot: the one before gave it back
        stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
        response = stream.response
        await first_chunk(api, stream)
        del stream
        await settled()
        assert in_flight(client) == 0 and response.is_closed
    name = "Stream" if api.mode == "sync" else "AsyncStream"
    assert (
        unclosed(caught)
        == [
            f"Unclosed <{name} POST {BASE}/chat/completions, 1 chunks>: its connection is"
            " closed and its concurrency slot given back now, and its call ends as cancelled."
            f" Close it ({'stream.close()' if api.mode == 'sync' else 'await stream.aclose()'},"
            " or a with block) or read it to its end"
        ]
        * 3
    )


async def test_the_warning_shows_no_credential(
    api: Api, mock: respx.MockRouter, caught: list[str]
) -> None:
    mock.post("/chat/completions").mock(side_effect=lambda request: open_stream())
    client = make(api, default_query={"api-key": SECRET})
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    assert SECRET in str(stream.response.request.url)
    del stream
    await settled()
    [message] = unclosed(caught)
    assert SECRET not in message and "api-key=REDACTED" in message


async def test_a_stream_closed_or_read_to_its_end_does_not_warn(
    api: Api, mock: respx.MockRouter, caught: list[str]
) -> None:
    mock.post("/chat/completions").mock(
        side_effect=lambda request: event_stream(sse(chunk("a"), chunk("b")))
    )
    client = make(api)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    assert len(await api.collect(stream)) == 2
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    await api.run(stream.close() if api.mode == "sync" else stream.aclose())
    del stream
    gc.collect()
    await settled()
    assert unclosed(caught) == []


async def test_a_finalizer_takes_no_lock_and_does_not_block(
    api: Api, mock: respx.MockRouter, caught: list[str]
) -> None:
    """The cyclic collector runs a finalizer at any allocation, perhaps in a thread
    that holds the limiter's lock: one that took it there would wait for itself."""
    mock.post("/chat/completions").mock(side_effect=lambda request: open_stream())
    client = make(api, concurrency=one_slot())
    box = [await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))]
    [limit] = client.concurrency._endpoints.values()
    dropper = threading.Thread(target=box.clear)
    with limit._lock:  # held while the stream is collected
        dropper.start()
        dropper.join(timeout=10)
        assert not dropper.is_alive(), "the finalizer waited for the limiter's lock"
    await settled()
    assert in_flight(client) == 0 and len(unclosed(caught)) == 1


async def test_an_async_stream_dropped_in_another_thread_closes_on_its_loop(
    mock: respx.MockRouter, caught: list[str]
) -> None:
    mock.post("/chat/completions").mock(side_effect=lambda request: open_stream())
    api = Api("async")
    client = make(api, concurrency=one_slot())
    box = [await client.chat.completions.create(messages=MESSAGES, stream=True)]
    response = box[0].response
    dropper = threading.Thread(target=box.clear)
    dropper.start()
    dropper.join(timeout=10)
    assert not dropper.is_alive()
    await settled()
    assert response.is_closed  # an async close: only its loop can have run it
    assert in_flight(client) == 0 and len(unclosed(caught)) == 1
    await api.close_all()


def test_an_async_stream_collected_after_its_loop_closed(
    mock: respx.MockRouter, caught: list[str]
) -> None:
    """Off its loop the connection cannot be closed; the slot is still given back and
    the call ended, and nothing is raised."""
    mock.post("/chat/completions").mock(side_effect=lambda request: open_stream())
    limiter = one_slot()
    unraised: list[Any] = []
    hook, sys.unraisablehook = sys.unraisablehook, unraised.append
    try:

        async def leave() -> Any:
            client = stormguard.AsyncClient(base_url=BASE, model="m", concurrency=limiter)
            return await client.chat.completions.create(messages=MESSAGES, stream=True)

        stream = asyncio.run(leave())  # its loop is closed now
        assert sum(limit.in_flight for limit in limiter.state()) == 1
        del stream
        gc.collect()
        reaped()
    finally:
        sys.unraisablehook = hook
    assert sum(limit.in_flight for limit in limiter.state()) == 0
    assert unraised == []
    assert any(m.startswith("Unclosed <AsyncStream") for m in unclosed(caught))


async def test_a_warning_made_an_error_still_gives_the_slot_back(
    api: Api, mock: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-W error::ResourceWarning``: Python reports the warning as unraisable, as it
    does for its own objects; the clean-up was handed over before it."""
    mock.post("/chat/completions").mock(side_effect=lambda request: open_stream())
    client = make(api, concurrency=one_slot())
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    unraised: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraised.append)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        del stream
    await settled()
    assert in_flight(client) == 0
    [report] = unraised
    assert isinstance(report.exc_value, ResourceWarning)


async def test_a_probe_stream_left_unclosed_settles_its_breaker_probe(
    api: Api, mock: respx.MockRouter, caught: list[str]
) -> None:
    """The probe of a half-open breaker is settled at the stream's first chunk: a probe
    left unclosed does not keep the breaker half-open with its one permit taken."""
    answers = [httpx.Response(500, json={})] * 3 + [open_stream()]
    mock.post("/chat/completions").mock(
        side_effect=[*answers, httpx.Response(200, json=chat_json())]
    )
    trip = BreakerConfig(consecutive_failures=3, open_time=5.0, jitter=0.0, half_open_calls=1)
    client = make(api, retry_policy=stormguard.RetryPolicy(max_attempts=1), breaker=trip)
    for _ in range(3):
        with pytest.raises(stormguard.InternalServerError):
            await api.run(client.chat.completions.create(messages=MESSAGES))
    api.clock.advance(5.1)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    del stream  # the probe, left
    await settled()
    [breaker] = client.stats().breakers
    assert breaker.state is CircuitState.CLOSED
    answer = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert answer.choices[0].message.content == "hello"


async def test_raw_and_streaming_responses_left_open(
    api: Api, mock: respx.MockRouter, caught: list[str]
) -> None:
    mock.post("/chat/completions").mock(
        side_effect=lambda request: (
            open_stream()
            if b'"stream":true' in request.content
            else httpx.Response(200, json=chat_json())
        )
    )
    client = make(api, concurrency=one_slot())
    chat = client.chat.completions
    sync = api.mode == "sync"
    prefix = "" if sync else "Async"

    # with_raw_response: a stream never parsed is its stream, left.
    raw = await api.run(chat.with_raw_response.create(messages=MESSAGES, stream=True))
    del raw
    await settled()
    assert in_flight(client) == 0
    assert unclosed(caught)[-1].startswith(f"Unclosed <{prefix}Stream POST")

    # with_streaming_response, its block never left: the body unread ...
    manager = chat.with_streaming_response.create(messages=MESSAGES)
    response = manager.__enter__() if sync else await manager.__aenter__()
    http_response = response.http_response
    del manager, response
    await settled()
    assert http_response.is_closed
    assert unclosed(caught)[-1].startswith(
        f"Unclosed <{prefix}APIResponse [200 OK]> of POST {BASE}/chat/completions: its"
    )

    # ... and a stream parsed and read from: one warning, the response's.
    before = len(unclosed(caught))
    manager = chat.with_streaming_response.create(messages=MESSAGES, stream=True)
    response = manager.__enter__() if sync else await manager.__aenter__()
    stream = response.parse() if sync else await response.parse()
    await first_chunk(api, stream)
    del manager, response, stream
    await settled()
    assert in_flight(client) == 0
    assert len(unclosed(caught)) == before + 1
    assert unclosed(caught)[-1].startswith(
        f"Unclosed <{prefix}APIResponse [200 OK]> of POST {BASE}/chat/completions: its"
    )


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_client_left_unclosed_closes_its_pool_once_nothing_uses_it(
    mode: str, mock: respx.MockRouter, caught: list[str]
) -> None:
    """The client, its ``with_options`` copies and their streams share one pool: it
    closes, with a warning, when the last of them is collected unclosed."""
    base = f"http://pool-{mode}.test/v1"  # other tests' clients may be collected here too
    mock.post(f"{base}/chat/completions").mock(side_effect=lambda request: open_stream())
    kind = stormguard.Client if mode == "sync" else stormguard.AsyncClient
    client: Any = kind(base_url=base, model="m", api_key=SECRET)
    http = client._http

    def warned() -> list[str]:
        return [message for message in caught if base in message]

    copy = client.with_options(timeout=30)
    del copy
    gc.collect()
    await settled()
    assert warned() == [] and not http.is_closed  # a copy leaves the pool open

    copy = client.with_options(timeout=30)
    del client
    gc.collect()
    await settled()
    assert warned() == [] and not http.is_closed  # its copy still uses it

    stream = copy.chat.completions.create(messages=MESSAGES, stream=True)
    stream = stream if mode == "sync" else await stream
    del copy
    gc.collect()
    await settled()
    assert warned() == [] and not http.is_closed  # its stream still uses it

    del stream
    await collected()  # its clean-up lets go of the client's state, which is in a cycle
    assert http.is_closed
    stream_left, pool_left = warned()
    assert stream_left.startswith(f"Unclosed <{'' if mode == 'sync' else 'Async'}Stream POST")
    assert pool_left.startswith(f"Unclosed {kind.__name__}(base_url='{base}', model='m'): close")
    assert all(SECRET not in message for message in warned())


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_closed_client_or_one_given_its_pool_does_not_warn(
    mode: str, caught: list[str]
) -> None:
    base = f"http://quiet-{mode}.test/v1"  # other tests' clients may be collected here too
    if mode == "sync":
        closed = stormguard.Client(base_url=base)
        closed.close()
        given_pool: Any = httpx.Client()
        given = stormguard.Client(base_url=base, http_client=given_pool)
    else:
        closed = stormguard.AsyncClient(base_url=base)
        await closed.close()
        given_pool = httpx.AsyncClient()
        given = stormguard.AsyncClient(base_url=base, http_client=given_pool)
    del closed, given
    gc.collect()
    await settled()
    assert [message for message in caught if base in message] == []
    assert not given_pool.is_closed  # the caller's pool is the caller's to close
    await api_close(given_pool)


async def api_close(pool: Any) -> None:
    result = pool.close() if isinstance(pool, httpx.Client) else pool.aclose()
    if result is not None:
        await result


async def test_a_stream_left_unclosed_ends_its_spans_as_cancelled(
    api: Api, mock: respx.MockRouter, caught: list[str]
) -> None:
    """Its call ends where its clean-up runs (the reaper thread, for a sync stream):
    the spans end there, as cancelled, as a closed stream's do."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    mock.post("/chat/completions").mock(side_effect=lambda request: open_stream())
    client = make(api, telemetry=Telemetry(tracer_provider=provider))
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    await first_chunk(api, stream)
    del stream
    await settled()
    spans = {span.name: span for span in exporter.get_finished_spans()}
    assert sorted(spans) == ["POST /v1/chat/completions", "chat m"]  # the call, its attempt
    for span in spans.values():
        assert span.attributes is not None and span.attributes["stormguard.cancelled"] is True
    provider.shutdown()


def test_a_loop_closed_before_it_ran_a_clean_up_is_not_kept_alive() -> None:
    """A clean-up handed to a loop that closed before it ran it is dropped with the loop
    (the table of clean-ups handed over stays bounded)."""

    async def never() -> None:
        raise AssertionError("a closed loop runs nothing")

    loop = asyncio.new_event_loop()
    aclose_later(loop, never, lambda: None)  # handed over, never run
    loop.close()
    gone = weakref.ref(loop)
    del loop
    off_loop: list[str] = []
    aclose_later(None, never, lambda: off_loop.append("ran"))
    reaped()
    gc.collect()
    assert gone() is None and off_loop == ["ran"]
