"""StreamTimeouts against a real socket: a server that drips SSE chunks, sync and async.

What the unit tests (tests/sdk/call/test_stream_timeouts.py) cannot show with a fake
clock: the sync connection cutting a blocked read at the stream's bound (the
deadline it holds moves), and the async cancel scopes doing the same. Each
server here writes its chunks and then holds the connection open without a
word, so a bound that did not fire would hang the test, not pass it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

import stormguard
from stormguard import StreamTimeouts
from tests.e2e.hostile_server import HEAD_SSE, Behaviour, HostileServer, RawRequest

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "ping"}]
#: How late a bound may fire on a busy 2-core machine.
SLACK = 1.5
DONE = b"data: [DONE]\n\n"


def event(text: str) -> bytes:
    payload = {"id": "c1", "model": "m", "choices": [{"index": 0, "delta": {"content": text}}]}
    return f"data: {json.dumps(payload)}\n\n".encode()


def chunks(count: int, *, every: float = 0.0, then_hold: bool = False) -> Behaviour:
    """``count`` chunks ``every`` seconds apart, then [DONE], or silence (``then_hold``)
    with the connection open until the server stops."""

    async def behaviour(_: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(HEAD_SSE)
        for i in range(count):
            if i:
                await asyncio.sleep(every)
            writer.write(event(str(i)))
            await writer.drain()
        if then_hold:
            await asyncio.Event().wait()
        writer.write(DONE)
        await writer.drain()

    return behaviour


def silent(*, head: bool) -> Behaviour:
    """Nothing at all (``head=False``: not even the headers), until the server stops."""

    async def behaviour(_: RawRequest, writer: asyncio.StreamWriter) -> None:
        if head:
            writer.write(HEAD_SSE)
            await writer.drain()
        await asyncio.Event().wait()

    return behaviour


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def server() -> Iterator[HostileServer]:
    with HostileServer() as running:
        yield running


class Reader:
    """Makes one streamed call and reads it to its end, as the SDK's own ``Stream``,
    through ``with_streaming_response``, or as openai-python over the transport."""

    def __init__(self, mode: str, how: str) -> None:
        self.mode, self.how = mode, how
        self.received: list[float] = []  # when each chunk (or SSE line) came
        self._closers: list[Any] = []

    def _client(self, **options: Any) -> Any:
        options.setdefault("model", "m")
        if self.how == "openai":
            sync = self.mode == "sync"
            http = (stormguard.httpx_client if sync else stormguard.async_httpx_client)(**options)
            cls = openai.OpenAI if sync else openai.AsyncOpenAI
            client = cls(base_url=options["base_url"], api_key="k", http_client=http, max_retries=0)
        else:
            cls = stormguard.Client if self.mode == "sync" else stormguard.AsyncClient
            client = cls(**options)
        self._closers.append(client)
        return client

    def _note(self) -> None:
        self.received.append(time.monotonic())

    async def read(self, **options: Any) -> None:
        client = self._client(**options)
        kwargs: dict[str, Any] = {"model": "m", "messages": MESSAGES, "stream": True}
        if self.how == "streaming_response":
            create = client.chat.completions.with_streaming_response.create
            if self.mode == "sync":
                with create(**kwargs) as response:
                    for line in response.iter_lines():
                        if line.startswith("data: {"):
                            self._note()
            else:
                async with create(**kwargs) as response:
                    async for line in response.iter_lines():
                        if line.startswith("data: {"):
                            self._note()
            return
        if self.mode == "sync":
            for _ in client.chat.completions.create(**kwargs):
                self._note()
        else:
            async for _ in await client.chat.completions.create(**kwargs):
                self._note()

    async def close(self) -> None:
        for client in self._closers:
            closed = client.close()
            if asyncio.iscoroutine(closed):
                await closed


READERS = ["stream", "streaming_response", "openai"]


@pytest.mark.parametrize("how", READERS)
async def test_an_idle_gap_ends_a_stream_that_outlived_its_timeout(
    server: HostileServer, mode: str, how: str
) -> None:
    """Chunks 0.05 s apart for 0.5 s under a 0.25 s timeout, then silence: the stream
    outlives the timeout while it sends, and ends 0.5 s (its idle bound, ten chunk
    gaps) into the silence, as a timeout of the kind of client that reads it."""
    server.behaviours["/v1/chat/completions"] = chunks(11, every=0.05, then_hold=True)
    reader = Reader(mode, how)
    expected = openai.APITimeoutError if how == "openai" else stormguard.APITimeoutError
    started = time.monotonic()
    try:
        with pytest.raises(expected) as info:
            await reader.read(
                base_url=server.base_url, timeout=0.25, stream_timeouts=StreamTimeouts(idle=0.5)
            )
    finally:
        await reader.close()
    ended = time.monotonic()
    assert len(reader.received) == 11 and reader.received[-1] - started > 0.25
    gap = ended - reader.received[-1]
    assert 0.45 <= gap < 0.5 + SLACK, gap
    # openai-python is handed the call's own error, as openai's class too
    assert isinstance(info.value, stormguard.APITimeoutError)
    assert "no chunk for 0.5 s" in str(info.value)
    request = server.requests_to("/v1/chat/completions")[-1]
    assert "x-request-deadline-ms" not in request.headers  # no server-side abort at 0.5 s


@pytest.mark.parametrize("how", READERS)
async def test_a_stream_that_keeps_sending_runs_to_its_end_past_the_timeout(
    server: HostileServer, mode: str, how: str
) -> None:
    server.behaviours["/v1/chat/completions"] = chunks(12, every=0.05)
    reader = Reader(mode, how)
    started = time.monotonic()
    try:
        await reader.read(
            base_url=server.base_url, timeout=0.25, stream_timeouts=StreamTimeouts(idle=0.5)
        )
    finally:
        await reader.close()
    assert len(reader.received) == 12 and time.monotonic() - started > 0.25


async def test_max_duration_ends_a_stream_that_keeps_sending(
    server: HostileServer, mode: str
) -> None:
    server.behaviours["/v1/chat/completions"] = chunks(1000, every=0.05)
    reader = Reader(mode, "stream")
    timeouts = StreamTimeouts(idle=0.5, max_duration=0.5)
    started = time.monotonic()
    try:
        with pytest.raises(stormguard.APITimeoutError, match="max_duration passed"):
            await reader.read(base_url=server.base_url, timeout=0.25, stream_timeouts=timeouts)
    finally:
        await reader.close()
    assert 0.45 <= time.monotonic() - started < 0.5 + SLACK
    request = server.requests_to("/v1/chat/completions")[-1]
    assert 450 <= int(request.headers["x-request-deadline-ms"]) <= 500


@pytest.mark.parametrize("head", [True, False], ids=["headers_then_silence", "silence"])
async def test_a_first_chunk_that_does_not_come_is_retried_on_the_other_endpoint(
    mode: str, head: bool
) -> None:
    """The first request, to whichever server, gets no event (with its headers sent,
    or nothing at all); the call moves to the other server at the first-chunk
    bound and streams from it."""
    counter = itertools.count()

    async def first_silent(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        behaviour = silent(head=head) if next(counter) == 0 else chunks(3)
        await behaviour(request, writer)

    with HostileServer() as one, HostileServer() as two:
        for running in (one, two):
            running.behaviours["/v1/chat/completions"] = first_silent
        reader = Reader(mode, "stream")
        timeouts = StreamTimeouts(first_chunk=0.5)
        started = time.monotonic()
        try:
            await reader.read(
                base_url=[one.base_url, two.base_url], timeout=10, stream_timeouts=timeouts
            )
        finally:
            await reader.close()
        elapsed = time.monotonic() - started
        assert len(reader.received) == 3
        assert 0.45 <= elapsed < 0.5 + SLACK, elapsed
        sent = [len(one.requests_to("/v1/chat/completions")), len(two.requests)]
        assert sorted(sent) == [1, 1]


async def test_a_first_chunk_timeout_says_so(server: HostileServer, mode: str) -> None:
    server.behaviours["/v1/chat/completions"] = silent(head=False)
    reader = Reader(mode, "stream")
    try:
        with pytest.raises(stormguard.APITimeoutError) as info:
            await reader.read(
                base_url=server.base_url,
                timeout=10,
                max_retries=0,
                stream_timeouts=StreamTimeouts(first_chunk=0.5),
            )
    finally:
        await reader.close()
    assert "first-chunk timeout passed (no first chunk within 0.5 s)" in str(info.value)
    assert info.value.response_started is False
