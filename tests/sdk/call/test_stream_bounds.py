"""A stream is held to max_response_bytes of decoded bytes and to its call's deadline,
checked between decoded pieces, in both clients and through the openai transport."""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
import respx

import stormguard
from stormguard.testing import FakeClock
from tests.sdk.helpers import BASE, MESSAGES, Api, chunk, event_stream, sse

#: About 200 KiB of events: four 64 KiB pieces.
BIG = sse(*[chunk("x" * 100) for _ in range(1300)])


async def test_a_stream_past_the_cap_fails_after_what_came_within_it(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(return_value=event_stream(BIG))
    client = api.client(max_response_bytes=100 * 1024)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.APIResponseValidationError, match="max_response_bytes=102400"):
        await api.collect(stream)
    assert 0 < stream.chunks_received < 1300  # the first 64 KiB piece's worth
    assert stream.response.is_closed


async def test_a_gzip_encoded_stream_is_decoded(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(
        return_value=event_stream(gzip.compress(BIG), **{"content-encoding": "gzip"})
    )
    stream = await api.run(api.client().chat.completions.create(messages=MESSAGES, stream=True))
    assert len(await api.collect(stream)) == 1300
    assert route.calls.last.request.headers["accept-encoding"] == "gzip, deflate"


class TickingStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """One event per chunk; every chunk costs a second on the fake clock."""

    def __init__(self, clock: FakeClock, events: int) -> None:
        self._clock = clock
        self._events = events

    def _chunks(self) -> Iterator[bytes]:
        for i in range(self._events):
            self._clock.advance(1.0)
            yield sse(chunk(str(i)), done=False)

    def __iter__(self) -> Iterator[bytes]:
        return self._chunks()

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._chunks():
            yield piece


async def test_the_deadline_is_checked_between_pieces(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").mock(
        side_effect=lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=TickingStream(api.clock, 50)
        )
    )
    client = api.client(timeout=5.5)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    with pytest.raises(stormguard.APITimeoutError, match="deadline passed during the stream"):
        await api.collect(stream)
    assert stream.chunks_received == 5  # chunks 1-5 came in time; the 6th came at 6 s


async def test_a_piece_of_many_events_is_read_one_chunk_at_a_time(
    api: Api, mock: respx.MockRouter
) -> None:
    """A buffering proxy sends hundreds of events in one piece: they are decoded into
    chunks as the caller takes them, so a stream never holds hundreds of decoded
    chunks (dicts and lists the garbage collector walks) ahead of its caller."""
    body = sse(*[chunk(f"t{i}") for i in range(300)])
    mock.post("/chat/completions").mock(return_value=event_stream(body))
    stream = await api.run(api.client().chat.completions.create(messages=MESSAGES, stream=True))
    state = stream._state
    texts = []
    for _ in range(299):
        assert len(state.pending) <= 1
        texts.append((await api.run(_next(api, stream))).choices[0].delta.content)
    assert len(await api.collect(stream)) == 1
    assert texts == [f"t{i}" for i in range(299)]


async def test_a_chunk_that_came_in_time_is_the_callers_however_slowly_it_reads(
    api: Api, mock: respx.MockRouter
) -> None:
    """The deadline judges when the bytes came, not how long the caller takes over
    them: a piece read in time is handed out whole, and the next read fails."""
    pieces = [sse(*[chunk(f"a{i}") for i in range(50)], done=False), sse(chunk("late"))]
    mock.post("/chat/completions").mock(
        side_effect=lambda request: httpx.Response(
            200, headers={"content-type": "text/event-stream"}, stream=Pieces(pieces)
        )
    )
    client = api.client(timeout=5.0)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    got = []
    with pytest.raises(stormguard.APITimeoutError, match="deadline passed during the stream"):
        while True:
            got.append(await api.run(_next(api, stream)))
            api.clock.advance(1.0)  # a slow caller: the deadline passes mid-piece
    assert [c.choices[0].delta.content for c in got] == [f"a{i}" for i in range(50)]


class Pieces(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body sent as the given pieces, one read each."""

    def __init__(self, pieces: list[bytes]) -> None:
        self._pieces = pieces

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._pieces)

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self._pieces:
            yield piece


def _next(api: Api, stream: Any) -> Any:
    return next(stream) if api.mode == "sync" else stream.__anext__()


@pytest.mark.parametrize("library", ["httpx2", "httpx"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_the_transport_ends_a_stream_past_the_cap_with_a_decoding_error(
    mode: str, library: str
) -> None:
    """openai 3.x gets an httpx2 client (its own library) by default, and takes an httpx
    one through its legacy path: either way the cap ends the stream with the call's own
    error, stormguard's ``APIResponseValidationError`` as the class that is also openai's
    (openai-python hands an ``OpenAIError`` on as it is)."""
    options: dict[str, Any] = {
        "base_url": BASE,
        "max_response_bytes": 100 * 1024,
        "clock": FakeClock(),
        "library": library,
    }
    received = 0
    with respx.mock() as router:
        router.post(f"{BASE}/chat/completions").mock(return_value=event_stream(BIG))
        with pytest.raises(openai.APIResponseValidationError) as info:
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
    assert isinstance(info.value, stormguard.APIResponseValidationError)
    assert "max_response_bytes=102400" in str(info.value)
    assert 0 < received < 1300
