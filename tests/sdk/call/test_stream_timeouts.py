"""StreamTimeouts: a stream's first chunk, its idle gaps and its cap, beside the total.

The byte streams here move the injected clock as their pieces "arrive", so each
bound is crossed exactly where a test says, with no real waiting; the real-time
reads (the sync connection's clipping, the async cancel scopes) are in
tests/e2e/test_stream_timeouts.py.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import httpx
import openai
import pytest
import respx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import stormguard
from stormguard import RetryPolicy, StreamTimeouts
from stormguard.telemetry import Telemetry
from stormguard.testing import FakeClock
from tests.sdk.helpers import BASE, MESSAGES, Api, chunk, sse

OTHER = "http://llm2.test/v1"
DONE = b"data: [DONE]\n\n"


def event(text: str) -> bytes:
    return sse(chunk(text), done=False)


class Paced(httpx.SyncByteStream, httpx.AsyncByteStream):
    """Pieces that each arrive some seconds (on the fake clock) after the one before."""

    def __init__(self, clock: FakeClock, pieces: Sequence[tuple[float, bytes]]) -> None:
        self._clock = clock
        self._pieces = pieces

    def _each(self) -> Iterator[bytes]:
        for wait, piece in self._pieces:
            self._clock.advance(wait)
            yield piece

    def __iter__(self) -> Iterator[bytes]:
        return self._each()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._each():
            yield piece


def streaming(clock: FakeClock, pieces: Sequence[tuple[float, bytes]]) -> httpx.Response:
    return httpx.Response(
        200, headers={"content-type": "text/event-stream"}, stream=Paced(clock, pieces)
    )


def ticking(clock: FakeClock, count: int, every: float = 1.0) -> list[tuple[float, bytes]]:
    """``count`` chunks, one every ``every`` seconds, then [DONE]."""
    return [(every, event(str(i))) for i in range(count)] + [(0.0, DONE)]


@pytest.fixture
def router() -> Iterator[respx.MockRouter]:
    with respx.mock(assert_all_called=False) as mock:
        yield mock


# -- the option ---------------------------------------------------------------------------


def test_stream_timeouts_are_keyword_only_positive_seconds() -> None:
    assert StreamTimeouts(first_chunk=5, idle=30.0) == StreamTimeouts(first_chunk=5.0, idle=30)
    assert StreamTimeouts(max_duration=float("inf")).max_duration is None
    assert StreamTimeouts().is_empty and not StreamTimeouts(first_chunk=1).outlives_timeout
    assert (
        StreamTimeouts(idle=1).outlives_timeout and StreamTimeouts(max_duration=9).outlives_timeout
    )
    with pytest.raises(TypeError):
        StreamTimeouts(5)  # type: ignore[misc]
    for bad in (0, -1, float("nan")):
        with pytest.raises(ValueError, match=r"StreamTimeouts\.idle must be positive"):
            StreamTimeouts(idle=bad)
    with pytest.raises(TypeError, match="first_chunk must be a number"):
        StreamTimeouts(first_chunk=True)
    with pytest.raises(TypeError, match=r"stream_timeouts must be a stormguard\.StreamTimeouts"):
        stormguard.Client(base_url=BASE, stream_timeouts=5)  # type: ignore[typeddict-item]


# -- the first chunk ----------------------------------------------------------------------


async def test_a_first_chunk_that_does_not_come_in_time_is_retried_on_another_endpoint(
    api: Api, router: respx.MockRouter
) -> None:
    """Whichever endpoint the first attempt goes to is slow to its first event (10 s);
    the retry goes to the other one at once (a failover: no wait, no budget)."""
    sent: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request.url.host)
        slow = len(sent) == 1
        pieces = [(10.0 if slow else 0.5, event("first")), (0.1, event("second")), (0.0, DONE)]
        return streaming(api.clock, pieces)

    for base in (BASE, OTHER):
        router.post(f"{base}/chat/completions").mock(side_effect=answer)
    client = api.client(base_url=[BASE, OTHER], stream_timeouts=StreamTimeouts(first_chunk=5))
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    chunks = await api.collect(stream)
    assert [c.choices[0].delta.content for c in chunks] == ["first", "second"]
    assert len(sent) == 2 and sent[0] != sent[1]
    first, second = stream.attempt_history
    assert first.error_type == "APITimeoutError" and first.outcome == "failover"
    assert second.outcome == "ok" and first.endpoint != second.endpoint


async def test_a_first_chunk_timeout_says_so_and_is_retried_within_the_attempts(
    api: Api, router: respx.MockRouter
) -> None:
    route = router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: streaming(api.clock, [(4.0, event("late")), (0.0, DONE)])
    )
    client = api.client(
        stream_timeouts=StreamTimeouts(first_chunk=3), retry_policy=RetryPolicy(max_attempts=2)
    )
    with pytest.raises(stormguard.APITimeoutError) as info:
        await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    error = info.value
    assert "first-chunk timeout passed (no first chunk within 3 s)" in str(error)
    assert error.response_started is False  # no event came: a retry is safe
    assert error.attempts == 2 and error.retry_stopped_by == "max_attempts"
    assert route.call_count == 2


async def test_the_total_still_bounds_the_retries_of_late_first_chunks(
    api: Api, router: respx.MockRouter
) -> None:
    """Each attempt is 4 s late to its first chunk (bound: 3 s) under a 9 s total: two
    are abandoned at their first-chunk bound, the third at the total, which comes
    before its own first-chunk bound (and is not retried: the call is out of time)."""
    router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: streaming(api.clock, [(4.0, event("late")), (0.0, DONE)])
    )
    client = api.client(
        timeout=9,
        stream_timeouts=StreamTimeouts(first_chunk=3),
        retry_policy=RetryPolicy(max_attempts=9, base_delay=0.01, max_delay=0.01),
    )
    with pytest.raises(stormguard.APITimeoutError, match="The call's deadline passed") as info:
        await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    assert info.value.attempts == 3
    assert [a.error_type for a in info.value.attempt_history] == ["APITimeoutError"] * 3


async def test_a_first_chunk_in_time_hands_the_stream_to_the_total(
    api: Api, router: respx.MockRouter
) -> None:
    """first_chunk alone: once started, the stream is still bounded by ``timeout``."""
    router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: streaming(api.clock, ticking(api.clock, 50))
    )
    client = api.client(timeout=5.5, stream_timeouts=StreamTimeouts(first_chunk=2))
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.APITimeoutError, match="The call's deadline passed"):
        await api.collect(stream)
    assert stream.chunks_received == 5 and stream.attempts == 1


# -- idle gaps, and outliving the total ---------------------------------------------------


async def test_an_idle_gap_ends_the_stream_without_a_retry(
    api: Api, router: respx.MockRouter
) -> None:
    pieces = [(1.0, event("a")), (1.0, event("b")), (1.0, event("c")), (20.0, event("d"))]
    route = router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: streaming(api.clock, [*pieces, (0.0, DONE)])
    )
    client = api.client(stream_timeouts=StreamTimeouts(idle=10))
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.APITimeoutError) as info:
        await api.collect(stream)
    assert "idle timeout passed (no chunk for 10 s), after 3 chunks" in str(info.value)
    assert info.value.response_started is True and info.value.attempts == 1
    assert stream.chunks_received == 3 and route.call_count == 1
    assert stream.response.is_closed


class CutByReadTimeout(Paced):
    """The pieces, then the transport's own read timeout (its timer, armed from its
    last bytes, fired before the reader's idle bound did)."""

    def _each(self) -> Iterator[bytes]:
        yield from super()._each()
        raise httpx.ReadTimeout("Timeout on reading data from socket")


async def test_the_transports_read_timeout_in_an_idle_gap_is_the_idle_bound(
    api: Api, router: respx.MockRouter
) -> None:
    # The transport reads for max(read, idle): its read timeout during the stream is
    # the idle gap, whichever of the two timers fires first.
    pieces = [(1.0, event("a")), (1.0, event("b")), (1.0, event("c"))]
    router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: httpx.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=CutByReadTimeout(api.clock, pieces),
        )
    )
    client = api.client(stream_timeouts=StreamTimeouts(idle=10))
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.APITimeoutError) as info:
        await api.collect(stream)
    assert "idle timeout passed (no chunk for 10 s), after 3 chunks" in str(info.value)
    assert info.value.response_started is True


async def test_a_stream_that_keeps_sending_outlives_the_total_with_idle_set(
    api: Api, router: respx.MockRouter
) -> None:
    """50 chunks a second apart under a 5.5 s timeout: without an idle bound the
    deadline ends it after 5 (tests/sdk/call/test_stream_bounds.py); with one, it runs."""
    route = router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: streaming(api.clock, ticking(api.clock, 50))
    )
    client = api.client(timeout=5.5, stream_timeouts=StreamTimeouts(idle=3))
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    assert len(await api.collect(stream)) == 50
    # The server is not told to abort it at the total either: no deadline header.
    assert "x-request-deadline-ms" not in route.calls.last.request.headers


async def test_the_total_still_bounds_the_wait_for_the_stream_to_start(
    api: Api, router: respx.MockRouter
) -> None:
    router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: streaming(api.clock, [(8.0, event("late")), (0.0, DONE)])
    )
    client = api.client(timeout=5, stream_timeouts=StreamTimeouts(idle=30))
    with pytest.raises(stormguard.APITimeoutError, match="deadline passed during the stream"):
        await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))


async def test_max_duration_caps_a_stream_that_keeps_sending(
    api: Api, router: respx.MockRouter
) -> None:
    route = router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: streaming(api.clock, ticking(api.clock, 50))
    )
    timeouts = StreamTimeouts(idle=3, max_duration=20.5)
    client = api.client(timeout=5.5, stream_timeouts=timeouts)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.APITimeoutError) as info:
        await api.collect(stream)
    assert "max_duration passed (20.5 s since the call began), after 20 chunks" in str(info.value)
    assert stream.chunks_received == 20
    # The server hears the cap: it may run the stream that long, no longer.
    assert route.calls.last.request.headers["x-request-deadline-ms"] == "20500"


async def test_without_stream_timeouts_nothing_changes_for_the_server(
    api: Api, router: respx.MockRouter
) -> None:
    route = router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: streaming(api.clock, ticking(api.clock, 2))
    )
    for timeouts in (None, StreamTimeouts(first_chunk=2)):
        client = api.client(timeout=7, stream_timeouts=timeouts)
        stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
        await api.collect(stream)
        assert route.calls.last.request.headers["x-request-deadline-ms"] == "7000"


# -- where the option is given ------------------------------------------------------------


async def test_per_call_stream_timeouts_replace_the_clients(
    api: Api, router: respx.MockRouter
) -> None:
    route = router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: streaming(api.clock, ticking(api.clock, 10))
    )
    plain = api.client(timeout=5.5)
    stream = await api.run(
        plain.chat.completions.create(
            messages=MESSAGES, stream=True, stream_timeouts=StreamTimeouts(idle=3)
        )
    )
    assert len(await api.collect(stream)) == 10
    assert b"stream_timeouts" not in route.calls.last.request.content  # not sent as a field

    patient = api.client(timeout=5.5, stream_timeouts=StreamTimeouts(idle=3))
    stream = await api.run(
        patient.chat.completions.create(messages=MESSAGES, stream=True, stream_timeouts=None)
    )
    with pytest.raises(stormguard.APITimeoutError, match="The call's deadline passed"):
        await api.collect(stream)  # None for the call: the client's are off, the total holds

    derived = plain.with_options(stream_timeouts=StreamTimeouts(idle=3))
    stream = await api.run(derived.chat.completions.create(messages=MESSAGES, stream=True))
    assert len(await api.collect(stream)) == 10


async def test_completions_and_responses_streams_take_them_too(
    api: Api, router: respx.MockRouter
) -> None:
    completion = sse(
        '{"id": "c", "object": "text_completion", "choices": [{"text": "x"}]}', done=False
    )
    router.post(f"{BASE}/completions").mock(
        side_effect=lambda request: streaming(
            api.clock, [(1.0, completion), (1.0, completion), (20.0, DONE)]
        )
    )
    done = (
        b"event: response.completed\ndata: "
        + json.dumps({"type": "response.completed", "response": {"status": "completed"}}).encode()
        + b"\n\n"
    )
    delta = (
        b"event: response.output_text.delta\ndata: "
        + json.dumps({"type": "response.output_text.delta", "delta": "x"}).encode()
        + b"\n\n"
    )
    router.post(f"{BASE}/responses").mock(
        side_effect=lambda request: streaming(api.clock, [(1.0, delta)] * 10 + [(1.0, done)])
    )
    client = api.client(timeout=5.5, stream_timeouts=StreamTimeouts(idle=3))
    stream = await api.run(client.completions.create(prompt="p", stream=True))
    with pytest.raises(stormguard.APITimeoutError, match="no chunk for 3 s"):
        await api.collect(stream)
    events = await api.run(client.responses.create(input="p", stream=True))
    assert len(await api.collect(events)) == 11  # outlived the 5.5 s total


async def test_a_non_streamed_call_ignores_them(api: Api, router: respx.MockRouter) -> None:
    route = router.post(f"{BASE}/chat/completions").mock(
        return_value=httpx.Response(200, json={"choices": [], "id": "x"})
    )
    client = api.client(timeout=7, stream_timeouts=StreamTimeouts(first_chunk=1, idle=1))
    await api.run(
        client.chat.completions.create(messages=MESSAGES, stream_timeouts=StreamTimeouts(idle=2))
    )
    request = route.calls.last.request
    assert request.headers["x-request-deadline-ms"] == "7000"
    assert b"stream_timeouts" not in request.content


# -- the other readers of a stream --------------------------------------------------------


async def test_with_streaming_response_reads_within_the_same_bounds(
    api: Api, router: respx.MockRouter
) -> None:
    pieces = [*ticking(api.clock, 8)[:-1], (20.0, DONE)]
    router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: streaming(api.clock, pieces)
    )
    client = api.client(timeout=5.5, stream_timeouts=StreamTimeouts(idle=3))
    lines: list[str] = []
    with pytest.raises(stormguard.APITimeoutError, match="no chunk for 3 s"):
        if api.mode == "sync":
            with client.chat.completions.with_streaming_response.create(
                messages=MESSAGES, stream=True
            ) as response:
                lines.extend(line for line in response.iter_lines() if line)
        else:
            async with client.chat.completions.with_streaming_response.create(
                messages=MESSAGES, stream=True
            ) as response:
                async for line in response.iter_lines():
                    if line:
                        lines.append(line)
    assert len(lines) == 8  # past the 5.5 s total, up to the 20 s gap


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_openai_over_the_transport_gets_the_same_bounds(mode: str) -> None:
    clock = FakeClock()
    long_then_gap = [*ticking(clock, 8)[:-1], (20.0, DONE)]
    options: dict[str, Any] = {
        "base_url": BASE,
        "clock": clock,
        "timeout": 5.5,
        "stream_timeouts": StreamTimeouts(idle=3),
    }
    received = 0
    with respx.mock() as router:
        router.post(f"{BASE}/chat/completions").mock(
            side_effect=lambda request: streaming(clock, long_then_gap)
        )
        with pytest.raises(openai.APITimeoutError) as info:
            if mode == "sync":
                oai = openai.OpenAI(
                    base_url=BASE,
                    api_key="k",
                    http_client=stormguard.httpx_client(**options),  # type: ignore[arg-type]
                    max_retries=0,
                )
                for _ in oai.chat.completions.create(model="m", messages=MESSAGES, stream=True):  # type: ignore[arg-type]
                    received += 1
            else:
                aoai = openai.AsyncOpenAI(
                    base_url=BASE,
                    api_key="k",
                    http_client=stormguard.async_httpx_client(**options),  # type: ignore[arg-type]
                    max_retries=0,
                )
                stream = await aoai.chat.completions.create(
                    model="m",
                    messages=MESSAGES,  # type: ignore[arg-type]
                    stream=True,
                )
                async for _ in stream:
                    received += 1
    assert received == 8  # past the 5.5 s total; the 20 s gap ended it
    # the call's own error, as openai's class (openai-python hands it on as it is)
    assert isinstance(info.value, stormguard.APITimeoutError)
    assert "no chunk for 3 s" in str(info.value)


# -- telemetry ----------------------------------------------------------------------------


async def test_the_call_span_says_which_bound_ended_the_stream(
    api: Api, router: respx.MockRouter
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    router.post(f"{BASE}/chat/completions").mock(
        side_effect=lambda request: streaming(
            api.clock, [(1.0, event("a")), (20.0, event("b")), (0.0, DONE)]
        )
    )
    client = api.client(
        telemetry=Telemetry(tracer_provider=provider), stream_timeouts=StreamTimeouts(idle=10)
    )
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.APITimeoutError):
        await api.collect(stream)
    [call] = [s for s in exporter.get_finished_spans() if s.parent is None]
    assert call.status.status_code is StatusCode.ERROR
    assert "no chunk for 10 s" in (call.status.description or "")
    provider.shutdown()
