"""Fault injection: hostile servers against the SDK, sync and async.

One deadline bounds everything a call does: the token pre-check's lookups,
connecting, sending, the response headers, the body, a stream's reads and its
parsing. Each case below is a server that once held a call far past its
deadline (a lookup that never answers, headers or a body dripped a byte at a
time, a gzip bomb), kept as a regression test. A call ended by its deadline
returns within ``deadline + SLACK`` and not before ``0.9 * deadline``, and its
error says it was the deadline; a bomb ends at the size cap, and the memory the
call used stays far below what the bomb inflates to.

The last section is a server that echoes the caller's API key in every place it
can put text: no error, span or log line of the call shows it, or any 8
characters of its start or end, whether the client, or openai-python on
stormguard's transport, made the call.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import httpx
import httpx2
import openai
import pytest

import stormguard
from stormguard.tokens import TokenPolicy
from tests.e2e.hostile_server import (
    HEAD_JSON,
    HEAD_SSE,
    HostileServer,
    answer,
    deflate_bomb,
    drip,
    gzip_bomb,
    never_answer,
)
from tests.e2e.key_echo import (
    ECHOES,
    KEY,
    echo_url,
    error_texts,
    leaks,
    log_texts,
    recording,
    serve_echoes,
)

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "ping"}]
#: The deadline of most calls here: short, so the file stays fast.
DEADLINE = 1.0
#: How late a call may return past its deadline on a busy 2-core machine.
SLACK = 1.5
CHAT_JSON = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "pong"}}],
}
FIRST_EVENT = b'data: {"id": "c1", "choices": [{"index": 0, "delta": {"content": "a"}}]}\n\n'


@pytest.fixture(params=["sync", "async"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


class Calls:
    """Builds a sync or async client against ``server`` and runs calls uniformly."""

    def __init__(self, mode: str, server: HostileServer) -> None:
        self.mode = mode
        self.server = server
        self._clients: list[Any] = []

    def client(self, **options: Any) -> Any:
        options.setdefault("base_url", self.server.base_url)
        options.setdefault("model", "m")
        options.setdefault("timeout", DEADLINE)
        cls = stormguard.Client if self.mode == "sync" else stormguard.AsyncClient
        client = cls(**options)
        self._clients.append(client)
        return client

    async def run(self, value: Any) -> Any:
        return await value if self.mode == "async" else value

    async def create(self, client: Any, **kwargs: Any) -> Any:
        return await self.run(client.chat.completions.create(messages=MESSAGES, **kwargs))

    async def drain(self, stream: Any) -> int:
        """Read a stream to its end (or its error); the chunks read."""
        count = 0
        if self.mode == "sync":
            for _ in stream:
                count += 1
        else:
            async for _ in stream:
                count += 1
        return count

    async def close(self) -> None:
        for client in self._clients:
            await self.run(client.close())


@pytest.fixture
def hostile() -> Iterator[HostileServer]:
    with HostileServer() as server:
        yield server


@pytest.fixture
async def calls(mode: str, hostile: HostileServer) -> AsyncIterator[Calls]:
    helper = Calls(mode, hostile)
    yield helper
    await helper.close()


Case = Callable[..., Awaitable[None]]


def in_both_modes(case: Case) -> Case:
    """A test that runs ``case(calls, hostile, **params)`` sync and async *at once*,
    each against a hostile server of its own: these cases wait for a deadline, so the
    two modes take the time of one (the suite stays short). The sync run has a thread
    and an event loop of its own, since its calls block. A failure names its mode.
    (Cases that measure memory with tracemalloc, which is process-wide, use the
    ``calls`` fixture and run one mode at a time.)"""
    params = [p for name, p in inspect.signature(case).parameters.items() if name not in _GIVEN]

    async def run(mode: str, params: dict[str, Any]) -> None:
        with HostileServer() as server:
            helper = Calls(mode, server)
            try:
                await case(helper, server, **params)
            except BaseException as exc:
                exc.add_note(f"(in {mode} mode)")
                raise
            finally:
                await helper.close()

    async def test(**params: Any) -> None:
        outcomes = await asyncio.gather(
            asyncio.to_thread(asyncio.run, run("sync", params)),
            run("async", params),
            return_exceptions=True,
        )
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    test.__name__, test.__qualname__, test.__doc__ = case.__name__, case.__qualname__, case.__doc__
    test.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    return test


_GIVEN = ("calls", "hostile")


class Clock:
    """Seconds since the call began."""

    def __init__(self) -> None:
        self.start = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start


def assert_ended_by_deadline(elapsed: float, error: BaseException, deadline: float) -> None:
    """The call ran to its deadline, no further (with slack), and says why it stopped."""
    assert deadline * 0.9 <= elapsed < deadline + SLACK, elapsed
    assert isinstance(error, stormguard.APITimeoutError), repr(error)
    assert "deadline" in str(error), str(error)


# -- the token pre-check's lookups ----------------------------------------------------


@pytest.mark.parametrize(
    "lookup",
    [never_answer(), drip(HEAD_JSON, interval=0.1)],
    ids=["never_answers", "drips_headers"],
)
@in_both_modes
async def test_precheck_lookups_end_by_the_calls_deadline(
    calls: Calls, hostile: HostileServer, lookup: Any
) -> None:
    hostile.behaviours.update(
        {"/tokenize": lookup, "/v1/models": lookup, "/v1/chat/completions": answer(200, CHAT_JSON)}
    )
    # lookup_timeout (2 s) is longer than the call: the call's deadline cuts it.
    client = calls.client(token_policy=TokenPolicy(lookup_timeout=2.0))
    clock = Clock()
    with pytest.raises(stormguard.APITimeoutError) as info:
        await calls.create(client, max_tokens=5)
    assert_ended_by_deadline(clock.elapsed, info.value, DEADLINE)
    assert len(hostile.requests_to("/tokenize")) == 1
    assert hostile.requests_to("/v1/chat/completions") == []  # no time was left to send it


@in_both_modes
async def test_a_lookup_is_held_to_its_own_timeout_within_a_longer_call(
    calls: Calls, hostile: HostileServer
) -> None:
    hostile.behaviours.update(
        {
            "/tokenize": drip(HEAD_JSON, interval=0.1),
            "/v1/models": drip(HEAD_JSON, interval=0.1),
            "/v1/chat/completions": answer(200, CHAT_JSON),
        }
    )
    client = calls.client(timeout=10, token_policy=TokenPolicy(lookup_timeout=0.5))
    clock = Clock()
    resp = await calls.create(client, max_tokens=5)
    # Two lookups of at most 0.5 s each, then the call: the estimate counted.
    assert clock.elapsed < 1.0 + SLACK
    assert resp.precheck.counter == "estimate:utf8-bytes"
    assert resp.choices[0].message.content == "pong"


async def test_gzip_bombed_lookups_fail_at_the_cap_and_the_call_goes_on(
    calls: Calls, hostile: HostileServer
) -> None:
    bomb = gzip_bomb(256 << 20)  # 256 MiB of newlines, 260 KB on the wire
    hostile.behaviours.update(
        {"/tokenize": bomb, "/v1/models": bomb, "/v1/chat/completions": answer(200, CHAT_JSON)}
    )
    cap = 1 << 20
    client = calls.client(timeout=20, max_response_bytes=cap, token_policy=TokenPolicy())
    tracemalloc.start()
    try:
        resp = await calls.create(client, max_tokens=5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert resp.precheck.counter == "estimate:utf8-bytes"  # both lookups failed
    assert len(hostile.requests_to("/tokenize")) == len(hostile.requests_to("/v1/models")) == 1
    assert peak < 8 * cap, peak  # the bomb inflates to 256 MiB


# -- the call itself --------------------------------------------------------------------


@in_both_modes
async def test_dripped_response_headers_end_at_the_deadline(
    calls: Calls, hostile: HostileServer
) -> None:
    hostile.behaviours["/v1/chat/completions"] = drip(HEAD_JSON, interval=0.1)
    client = calls.client()
    clock = Clock()
    with pytest.raises(stormguard.APITimeoutError) as info:
        await calls.create(client, max_tokens=5)
    assert_ended_by_deadline(clock.elapsed, info.value, DEADLINE)
    assert info.value.retry_stopped_by == "deadline"


@pytest.mark.parametrize("own", ["own_http_client", "own_httpx2_client", "host_name"])
@in_both_modes
async def test_dripped_headers_end_at_the_deadline_on_your_client_and_by_host_name(
    calls: Calls, hostile: HostileServer, own: str
) -> None:
    """Your own ``httpx.Client``/``AsyncClient`` (or httpx2's) as it comes, or a base URL
    that names ``localhost`` (resolved for the connection; ::1 may refuse before
    127.0.0.1)."""
    hostile.behaviours["/v1/chat/completions"] = drip(HEAD_JSON, interval=0.1)
    if own.startswith("own_"):
        library: Any = httpx2 if own == "own_httpx2_client" else httpx
        http = library.Client() if calls.mode == "sync" else library.AsyncClient()
        client = calls.client(http_client=http)
    else:
        client = calls.client(base_url=f"http://localhost:{hostile.port}/v1")
    clock = Clock()
    with pytest.raises(stormguard.APITimeoutError) as info:
        await calls.create(client, max_tokens=5)
    assert_ended_by_deadline(clock.elapsed, info.value, DEADLINE)
    assert len(hostile.requests_to("/v1/chat/completions")) == 1
    if own.startswith("own_"):
        await calls.run(http.close() if calls.mode == "sync" else http.aclose())


# A byte just inside each read's timeout: httpx's per-read timeouts never fire, and
# a deadline checked only between reads ends the call one read late (at 2 x 0.95 =
# 1.9 deadlines, past the slack).
LONG_DEADLINE = 2.0
SLOW_BYTE = 0.95 * LONG_DEADLINE


@in_both_modes
async def test_a_dripped_body_ends_at_the_deadline(calls: Calls, hostile: HostileServer) -> None:
    hostile.behaviours["/v1/chat/completions"] = drip(
        HEAD_JSON + b"{", step=len(HEAD_JSON) + 1, interval=SLOW_BYTE
    )
    client = calls.client(timeout=LONG_DEADLINE)
    clock = Clock()
    with pytest.raises(stormguard.APITimeoutError) as info:
        await calls.create(client, max_tokens=5)
    assert_ended_by_deadline(clock.elapsed, info.value, LONG_DEADLINE)
    assert info.value.response_started


@in_both_modes
async def test_a_dripped_stream_ends_at_the_deadline_in_the_callers_loop(
    calls: Calls, hostile: HostileServer
) -> None:
    prefix = HEAD_SSE + FIRST_EVENT
    hostile.behaviours["/v1/chat/completions"] = drip(
        prefix, step=len(prefix), interval=SLOW_BYTE, then=b":"
    )
    client = calls.client(timeout=LONG_DEADLINE)
    clock = Clock()
    stream = await calls.create(client, max_tokens=5, stream=True)
    assert clock.elapsed < LONG_DEADLINE * 0.5  # the first chunk came at once
    with pytest.raises(stormguard.APITimeoutError) as info:
        await calls.drain(stream)
    assert_ended_by_deadline(clock.elapsed, info.value, LONG_DEADLINE)
    assert stream.chunks_received == 1


async def test_a_gzip_bombed_stream_of_blank_lines_ends_at_the_cap(
    calls: Calls, hostile: HostileServer
) -> None:
    # 128 MiB of newlines: no event ever, against the 64 MiB cap on a stream.
    hostile.behaviours["/v1/chat/completions"] = gzip_bomb(
        128 << 20, content_type="text/event-stream"
    )
    client = calls.client(timeout=30)
    clock = Clock()
    tracemalloc.start()
    try:
        with pytest.raises(stormguard.APIResponseValidationError, match="max_response_bytes"):
            await calls.create(client, max_tokens=5, stream=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert clock.elapsed < 30
    assert peak < 16 << 20, peak  # a 64 KiB piece at a time, never the body


@in_both_modes
async def test_a_gzip_bombed_stream_of_tiny_events_ends_at_the_deadline(
    calls: Calls, hostile: HostileServer
) -> None:
    # Seven million events: more than any caller reads before the deadline.
    hostile.behaviours["/v1/chat/completions"] = gzip_bomb(
        64 << 20, content_type="text/event-stream", unit=b"data: {}\n\n"
    )
    client = calls.client()
    clock = Clock()
    stream = await calls.create(client, max_tokens=5, stream=True)
    with pytest.raises(stormguard.APITimeoutError) as info:
        await calls.drain(stream)
    assert_ended_by_deadline(clock.elapsed, info.value, DEADLINE)
    assert stream.chunks_received > 1000


async def test_a_deflate_bombed_body_ends_at_the_cap(calls: Calls, hostile: HostileServer) -> None:
    hostile.behaviours["/v1/chat/completions"] = deflate_bomb(256 << 20)
    cap = 1 << 20
    client = calls.client(timeout=20, max_response_bytes=cap)
    tracemalloc.start()
    try:
        with pytest.raises(stormguard.APIResponseValidationError, match="max_response_bytes"):
            await calls.create(client, max_tokens=5)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * cap, peak


# -- openai-python on stormguard's transport ----------------------------------------------


@in_both_modes
async def test_openai_on_the_transport_ends_a_header_drip_at_the_deadline(
    calls: Calls, hostile: HostileServer
) -> None:
    mode = calls.mode
    hostile.behaviours["/v1/chat/completions"] = drip(HEAD_JSON, interval=0.1)
    options: dict[str, Any] = {"base_url": hostile.base_url, "model": "m", "timeout": DEADLINE}
    clock = Clock()
    with pytest.raises(openai.APITimeoutError):
        if mode == "sync":
            with openai.OpenAI(
                base_url=hostile.base_url,
                api_key="k",
                http_client=stormguard.httpx_client(**options),
                max_retries=0,
            ) as oai:
                oai.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        else:
            async with openai.AsyncOpenAI(
                base_url=hostile.base_url,
                api_key="k",
                http_client=stormguard.async_httpx_client(**options),
                max_retries=0,
            ) as aoai:
                await aoai.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    assert DEADLINE * 0.9 <= clock.elapsed < DEADLINE + SLACK


@in_both_modes
async def test_openai_on_the_transport_ends_a_dripped_stream_at_the_deadline(
    calls: Calls, hostile: HostileServer
) -> None:
    mode = calls.mode
    prefix = HEAD_SSE + FIRST_EVENT
    hostile.behaviours["/v1/chat/completions"] = drip(
        prefix, step=len(prefix), interval=SLOW_BYTE, then=b":"
    )
    options: dict[str, Any] = {
        "base_url": hostile.base_url,
        "model": "m",
        "timeout": LONG_DEADLINE,
    }
    clock = Clock()
    chunks = 0
    with pytest.raises(openai.APITimeoutError):  # the transport's httpx.ReadTimeout
        if mode == "sync":
            with openai.OpenAI(
                base_url=hostile.base_url,
                api_key="k",
                http_client=stormguard.httpx_client(**options),
                max_retries=0,
            ) as oai:
                for _ in oai.chat.completions.create(
                    model="m",
                    messages=MESSAGES,  # type: ignore[arg-type]
                    stream=True,
                ):
                    chunks += 1
        else:
            async with openai.AsyncOpenAI(
                base_url=hostile.base_url,
                api_key="k",
                http_client=stormguard.async_httpx_client(**options),
                max_retries=0,
            ) as aoai:
                async for _ in await aoai.chat.completions.create(
                    model="m",
                    messages=MESSAGES,  # type: ignore[arg-type]
                    stream=True,
                ):
                    chunks += 1
    assert chunks == 1
    assert LONG_DEADLINE * 0.9 <= clock.elapsed < LONG_DEADLINE + SLACK


# -- an API key echoed back wherever a server can put text ------------------------------
# (tests/e2e/key_echo.py has the echoes; the scrubber's own tests are in
# tests/sdk/core/test_redaction.py.)

#: One attempt, no breaker or limiter: each echo is answered once and shown once.
ECHO_OPTIONS: dict[str, Any] = {
    "model": "m",
    "timeout": 10.0,
    "retry_policy": stormguard.RetryPolicy(max_attempts=1),
    "breaker": None,
    "concurrency": None,
}
#: The echoes whose key the client would show, and shows as [redacted]: in a message,
#: a request id, a span attribute (whole calls, then streamed calls).
ECHOES_SHOWN = {
    False: {
        "text_body_200", "json_list_body_200", "content_type", "request_id", "load_headers",
        "json_error_at_the_cut", "text_error_at_the_cut", "text_error_at_the_status_cut",
        "detail_list", "location", "malformed_header_line", "id_model_and_content",
    },
    True: {
        "content_type", "request_id", "load_headers", "json_error_at_the_cut",
        "text_error_at_the_cut", "text_error_at_the_status_cut", "detail_list", "location",
        "malformed_header_line", "sse_chunk_id_model_content", "sse_non_json_data",
        "sse_error_event", "sse_error_after_a_chunk",
    },
}  # fmt: skip


@pytest.fixture(scope="module")
def echoes() -> Iterator[HostileServer]:
    with serve_echoes() as server:
        yield server


async def _call_echo(client: Any, flavour: str, streamed: bool) -> None:
    """One chat call, its stream read to the end (a stormguard or an openai client)."""
    if flavour == "sync":
        result = client.chat.completions.create(model="m", messages=MESSAGES, stream=streamed)
        if streamed:
            list(result)
        return
    result = await client.chat.completions.create(model="m", messages=MESSAGES, stream=streamed)
    if streamed:
        async for _ in result:
            pass


def _assert_nothing_shown_leaks(shown: list[str], echo: str, streamed: bool) -> None:
    for text in shown:
        assert not leaks(text), f"{echo}: {text[-300:]}"
    marked = any("[redacted]" in text for text in shown)
    assert marked == (echo in ECHOES_SHOWN[streamed]), (echo, [t[:200] for t in shown])


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("echo", list(ECHOES))
async def test_an_echoed_key_is_in_no_error_span_or_log(
    echoes: HostileServer,
    echo: str,
    flavour: str,
    streamed: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    cls = stormguard.Client if flavour == "sync" else stormguard.AsyncClient
    with recording() as recorded:
        client = cls(
            base_url=echo_url(echoes, echo), api_key=KEY, telemetry=recorded.telemetry,
            **ECHO_OPTIONS,
        )  # fmt: skip
        error: stormguard.APIError | None = None
        try:
            await _call_echo(client, flavour, streamed)
        except stormguard.APIError as exc:
            error = exc
        finally:
            closed = client.close()
            if flavour == "async":
                await closed
        shown = [repr(client), repr(client.stats()), *recorded.span_texts()]
    shown += log_texts(caplog.records)
    if error is not None:
        shown += error_texts(error)
    _assert_nothing_shown_leaks(shown, echo, streamed)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("flavour", ["sync", "async"])
@pytest.mark.parametrize("echo", list(ECHOES))
async def test_an_echoed_key_is_in_no_span_or_log_of_the_transport(
    echoes: HostileServer,
    echo: str,
    flavour: str,
    streamed: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """openai-python sends the key itself: stormguard learns it from the request's
    ``authorization``. openai-python's own errors quote the server's body, which the
    transport hands on as it came, so only stormguard's spans and logs are checked."""
    caplog.set_level(logging.DEBUG)
    base_url = echo_url(echoes, echo)
    with recording() as recorded:
        if flavour == "sync":
            http: Any = stormguard.httpx_client(
                base_url=base_url, telemetry=recorded.telemetry, **ECHO_OPTIONS
            )
            oai: Any = openai.OpenAI(
                base_url=base_url, api_key=KEY, http_client=http, max_retries=0
            )
        else:
            http = stormguard.async_httpx_client(
                base_url=base_url, telemetry=recorded.telemetry, **ECHO_OPTIONS
            )
            oai = openai.AsyncOpenAI(
                base_url=base_url, api_key=KEY, http_client=http, max_retries=0
            )
        try:
            await _call_echo(oai, flavour, streamed)
        except (openai.OpenAIError, httpx.HTTPError, ValueError):
            pass  # openai-python's errors (a JSONDecodeError, httpx's) are not stormguard's
        finally:
            closed = oai.close()
            if flavour == "async":
                await closed
        stats = http._transport.client.stats()
        shown = [*recorded.span_texts(), repr(stats)]
    assert stats.logical_calls >= 1 and recorded.span_texts()
    shown += log_texts(caplog.records)
    for text in shown:
        assert not leaks(text), f"{echo}: {text[-300:]}"
