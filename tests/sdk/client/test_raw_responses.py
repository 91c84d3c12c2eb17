"""``.with_raw_response`` and ``.with_streaming_response`` on every resource (respx,
sync and async): openai-python's names, the final attempt's response after retries,
``parse()`` of results and streams, stormguard's extras, errors raised as
stormguard's, and a streaming response's body read only when asked and closed at the
end of its block."""

from __future__ import annotations

import base64
import contextlib
import datetime
import json
import struct
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import anyio
import httpx
import pytest
import respx

import stormguard
from tests.sdk.client.test_endpoints_responses import response_json
from tests.sdk.helpers import BASE, MESSAGES, Api, chat_json, chunk, event_stream, sse
from tests.sdk.telemetry.test_telemetry import Otel, otel  # noqa: F401  (the fixture)

EMBEDDING = {
    "object": "list",
    "data": [{"object": "embedding", "index": 0, "embedding": [0.5, 0.25]}],
    "model": "e",
    "usage": {"prompt_tokens": 1, "total_tokens": 1},
}
MODEL = {"id": "org/m", "object": "model", "created": 1, "owned_by": "me"}
COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "created": 1,
    "model": "m",
    "choices": [{"index": 0, "text": "yes", "finish_reason": "stop"}],
}

#: resource call, method, path, JSON answer, result type, a field of the result.
CALLS: list[tuple[str, Callable[[Any, str], Any], str, str, dict[str, Any], type, Any]] = [
    (
        "chat",
        lambda c, way: getattr(c.chat.completions, way).create(messages=MESSAGES),
        "POST",
        "/chat/completions",
        chat_json("hi"),
        stormguard.ChatCompletion,
        lambda r: r.choices[0].message.content == "hi",
    ),
    (
        "completions",
        lambda c, way: getattr(c.completions, way).create(prompt="q"),
        "POST",
        "/completions",
        COMPLETION,
        stormguard.Completion,
        lambda r: r.choices[0].text == "yes",
    ),
    (
        "models.list",
        lambda c, way: getattr(c.models, way).list(),
        "GET",
        "/models",
        {"object": "list", "data": [MODEL]},
        stormguard.ModelList,
        lambda r: r.data[0].id == "org/m",
    ),
    (
        "models.retrieve",
        lambda c, way: getattr(c.models, way).retrieve("org/m"),
        "GET",
        "/models/org%2Fm",
        MODEL,
        stormguard.Model,
        lambda r: r.owned_by == "me",
    ),
    (
        "embeddings",
        lambda c, way: getattr(c.embeddings, way).create(input="a", encoding_format="float"),
        "POST",
        "/embeddings",
        EMBEDDING,
        stormguard.CreateEmbeddingResponse,
        lambda r: r.data[0].embedding == [0.5, 0.25],
    ),
    (
        "responses",
        lambda c, way: getattr(c.responses, way).create(input="hi"),
        "POST",
        "/responses",
        response_json("hey"),
        stormguard.Response,
        lambda r: r.output_text == "hey!",
    ),
]


def failing() -> httpx.Response:
    return httpx.Response(500, json={"error": {"message": "oops"}}, headers={"x-request-id": "r1"})


FINAL_HEADERS = {"x-request-id": "r2", "x-queue-depth": "3", "x-ratelimit-remaining-requests": "9"}


def final_answer(answer: dict[str, Any]) -> httpx.Response:
    return httpx.Response(200, json=answer, headers=FINAL_HEADERS)


@pytest.mark.parametrize(
    ("call", "method", "path", "answer", "result_type", "check"),
    [pytest.param(*row[1:], id=row[0]) for row in CALLS],
)
async def test_raw_response_is_the_final_attempt_after_a_retry(
    api: Api,
    mock: respx.MockRouter,
    call: Callable[[Any, str], Any],
    method: str,
    path: str,
    answer: dict[str, Any],
    result_type: type,
    check: Callable[[Any], bool],
) -> None:
    route = mock.route(method=method, url=BASE + path).mock(
        side_effect=[failing(), final_answer(answer)]
    )
    raw = await api.run(call(api.client(), "with_raw_response"))
    assert isinstance(raw, stormguard.LegacyAPIResponse)
    assert route.call_count == 2
    assert raw.status_code == 200
    assert raw.headers["x-request-id"] == raw.request_id == "r2"
    assert raw.http_request.headers["x-stormguard-attempt"] == "2"
    assert raw.http_request.url == route.calls[1].request.url
    assert raw.method == method and raw.url == httpx.URL(BASE + path)
    assert raw.http_response.status_code == 200 and raw.http_version == "HTTP/1.1"
    assert raw.retries_taken == 1
    assert json.loads(raw.content) == answer and json.loads(raw.text) == answer
    assert raw.is_closed
    assert isinstance(raw.elapsed, datetime.timedelta)
    # stormguard's extras, on the raw response and on the parsed result.
    assert raw.server_load.queue_depth == 3 and raw.rate_limit.remaining_requests == 9
    assert [a.status_code for a in raw.attempt_history] == [500, 200]
    result = raw.parse()
    assert isinstance(result, result_type) and check(result)
    assert result is raw.parse()
    assert result.attempt_history == raw.attempt_history == raw.call_info.attempt_history
    assert result.server_load.queue_depth == 3 and result.rate_limit.remaining_requests == 9
    assert "200" in repr(raw)


async def test_raw_response_of_a_stream_parses_to_the_stream(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").mock(
        side_effect=[
            failing(),
            event_stream(sse(chunk("a"), chunk("b")), **{"x-request-id": "s2"}),
        ]
    )
    raw = await api.run(
        api.client().chat.completions.with_raw_response.create(messages=MESSAGES, stream=True)
    )
    assert raw.status_code == 200 and raw.request_id == "s2" and raw.retries_taken == 1
    assert raw.headers["content-type"] == "text/event-stream"
    stream = raw.parse()
    expected = stormguard.Stream if api.mode == "sync" else stormguard.AsyncStream
    assert isinstance(stream, expected)
    chunks = await api.collect(stream)
    assert [c.choices[0].delta.content for c in chunks] == ["a", "b"]
    assert stream.attempt_history == raw.attempt_history and len(raw.attempt_history) == 2


async def test_raw_response_of_a_responses_stream(api: Api, mock: respx.MockRouter) -> None:
    events = [
        json.dumps({"type": "response.created", "response": response_json(status="in_progress")}),
        json.dumps({"type": "response.output_text.delta", "delta": "hey"}),
        json.dumps({"type": "response.completed", "response": response_json("hey")}),
    ]
    mock.post("/responses").respond(
        200, headers={"content-type": "text/event-stream"}, content=sse(*events, done=False)
    )
    raw = await api.run(api.client().responses.with_raw_response.create(input="hi", stream=True))
    got = await api.collect(raw.parse())
    assert [e.type for e in got] == [
        "response.created",
        "response.output_text.delta",
        "response.completed",
    ]


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (400, {"error": {"message": "bad", "code": "invalid"}}, stormguard.BadRequestError),
        (404, {"error": {"message": "no such model"}}, stormguard.NotFoundError),
        (500, {"error": {"message": "oops"}}, stormguard.InternalServerError),
    ],
)
async def test_an_error_status_is_raised_as_stormguards_error_not_handed_over(
    api: Api,
    mock: respx.MockRouter,
    status: int,
    body: dict[str, Any],
    error: type[stormguard.APIStatusError],
) -> None:
    route = mock.get("/models/m").respond(status, json=body)
    client = api.client(retry_policy=stormguard.RetryPolicy(max_attempts=2))
    with pytest.raises(error) as caught:
        await api.run(client.models.with_raw_response.retrieve("m"))
    assert caught.value.status_code == status
    assert caught.value.response is not None and caught.value.request is not None
    assert caught.value.attempts == route.call_count == (2 if status == 500 else 1)


async def test_raw_response_keeps_the_call_options(api: Api, mock: respx.MockRouter) -> None:
    vector = base64.b64encode(struct.pack("<2f", 0.5, 0.25)).decode()
    answer = {**EMBEDDING, "data": [{"object": "embedding", "index": 0, "embedding": vector}]}
    route = mock.post("/embeddings").respond(200, json=answer)
    raw = await api.run(
        api.client().embeddings.with_raw_response.create(
            input=["a"],
            model="e",
            extra_headers={"x-trace": "1"},
            extra_query={"q": "2"},
            timeout=5,
        )
    )
    request = route.calls[0].request
    assert request.headers["x-trace"] == "1" and request.url.params["q"] == "2"
    assert json.loads(request.content)["encoding_format"] == "base64"
    assert raw.parse().data[0].embedding == [0.5, 0.25]


async def test_plain_calls_are_unchanged_beside_raw_ones(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/chat/completions").respond(200, json=chat_json("x"))
    client = api.client()
    raw = await api.run(client.chat.completions.with_raw_response.create(messages=MESSAGES))
    plain = await api.run(client.chat.completions.create(messages=MESSAGES))
    assert isinstance(plain, stormguard.ChatCompletion)
    assert plain.choices[0].message.content == raw.parse().choices[0].message.content == "x"


def test_mypy_strict_accepts_raw_and_streaming_responses() -> None:
    from pathlib import Path

    from mypy import api as mypy_api

    sample = Path(__file__).with_name("openai_style_typing_raw.py")
    out, err, status = mypy_api.run(["--strict", "--no-error-summary", str(sample)])
    assert status == 0, out + err


class TrackedBody(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body that records whether it was read and whether it was closed
    (what the server sees: the connection closed with the body unread)."""

    def __init__(self, *pieces: bytes) -> None:
        self.pieces = pieces
        self.read = 0
        self.closed = False

    def __iter__(self) -> Iterator[bytes]:
        for piece in self.pieces:
            self.read += 1
            yield piece

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            self.read += 1
            yield piece

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


def tracked(body: TrackedBody, content_type: str = "application/json") -> httpx.Response:
    return httpx.Response(200, headers={"content-type": content_type}, stream=body)


async def enter(api: Api, stack: contextlib.AsyncExitStack, manager: Any) -> Any:
    if api.mode == "sync":
        return stack.enter_context(manager)
    return await stack.enter_async_context(manager)


@pytest.mark.parametrize(
    ("call", "method", "path", "answer", "result_type", "check"),
    [pytest.param(*row[1:], id=row[0]) for row in CALLS],
)
async def test_streaming_response_reads_the_body_only_when_asked(
    api: Api,
    mock: respx.MockRouter,
    call: Callable[[Any, str], Any],
    method: str,
    path: str,
    answer: dict[str, Any],
    result_type: type,
    check: Callable[[Any], bool],
) -> None:
    body = TrackedBody(json.dumps(answer).encode())
    headers = {"content-type": "application/json", **FINAL_HEADERS}
    final = httpx.Response(200, headers=headers, stream=body)
    route = mock.route(method=method, url=BASE + path).mock(side_effect=[failing(), final])
    async with contextlib.AsyncExitStack() as stack:
        response = await enter(api, stack, call(api.client(), "with_streaming_response"))
        expected = stormguard.APIResponse if api.mode == "sync" else stormguard.AsyncAPIResponse
        assert isinstance(response, expected)
        assert route.call_count == 2 and response.retries_taken == 1
        assert response.status_code == 200 and response.request_id == "r2"
        assert response.server_load.queue_depth == 3
        assert body.read == 0 and not body.closed  # not read before asked
        result = await api.run(response.parse())
        assert isinstance(result, result_type) and check(result)
        assert result is await api.run(response.parse())
        assert [a.status_code for a in result.attempt_history] == [500, 200]
        assert result.rate_limit.remaining_requests == 9
    assert body.closed


async def test_streaming_response_closed_unread_at_the_end_of_its_block(
    api: Api, mock: respx.MockRouter
) -> None:
    body = TrackedBody(json.dumps(chat_json()).encode())
    mock.post("/chat/completions").mock(return_value=tracked(body))
    client = api.client()
    async with contextlib.AsyncExitStack() as stack:
        manager = client.chat.completions.with_streaming_response.create(messages=MESSAGES)
        response = await enter(api, stack, manager)
        assert not response.is_closed
    assert body.read == 0 and body.closed and response.is_closed
    assert client.stats().logical_calls == 1


async def test_streaming_response_read_text_json_and_pieces(
    api: Api, mock: respx.MockRouter
) -> None:
    data = json.dumps(chat_json("héllo")).encode()
    mock.post("/chat/completions").mock(
        side_effect=[tracked(TrackedBody(data[:7], data[7:])) for _ in range(3)]
    )
    client = api.client()
    create = client.chat.completions.with_streaming_response.create
    async with contextlib.AsyncExitStack() as stack:
        response = await enter(api, stack, create(messages=MESSAGES))
        assert await api.run(response.read()) == data
        assert await api.run(response.text()) == data.decode()
        assert await api.run(response.json()) == chat_json("héllo")
        assert (await api.run(response.parse())).choices[0].message.content == "héllo"
    async with contextlib.AsyncExitStack() as stack:
        response = await enter(api, stack, create(messages=MESSAGES))
        pieces = await api.collect(response.iter_bytes(chunk_size=5))
        assert b"".join(pieces) == data and {len(p) for p in pieces[:-1]} == {5}
        with pytest.raises(stormguard.StreamAlreadyConsumed):
            await api.run(response.read())
    async with contextlib.AsyncExitStack() as stack:
        response = await enter(api, stack, create(messages=MESSAGES))
        assert "".join(await api.collect(response.iter_text())) == data.decode()


async def test_streaming_response_of_a_stream(api: Api, mock: respx.MockRouter) -> None:
    first, rest = sse(chunk("a"), done=False), sse(chunk("b"))
    mock.post("/chat/completions").mock(
        side_effect=[
            failing(),
            *(tracked(TrackedBody(first, rest), "text/event-stream") for _ in range(3)),
        ]
    )
    client = api.client()
    create = client.chat.completions.with_streaming_response.create
    # Lines from the first byte: what was read to know the stream had started, then the rest.
    body_lines = [f"data: {chunk('a')}", "", f"data: {chunk('b')}", "", "data: [DONE]", ""]
    async with contextlib.AsyncExitStack() as stack:
        response = await enter(api, stack, create(messages=MESSAGES, stream=True))
        assert response.retries_taken == 1
        assert await api.collect(response.iter_lines()) == body_lines
        with pytest.raises(stormguard.StreamAlreadyConsumed):
            await api.run(response.parse())
    # parse() hands over the Stream; the block's end closes it, read or not.
    async with contextlib.AsyncExitStack() as stack:
        response = await enter(api, stack, create(messages=MESSAGES, stream=True))
        stream = await api.run(response.parse())
        expected = stormguard.Stream if api.mode == "sync" else stormguard.AsyncStream
        assert isinstance(stream, expected)
        assert [c.choices[0].delta.content for c in await api.collect(stream)] == ["a", "b"]
    body = TrackedBody(first, rest)
    mock.post("/chat/completions").mock(return_value=tracked(body, "text/event-stream"))
    async with contextlib.AsyncExitStack() as stack:
        await enter(api, stack, create(messages=MESSAGES, stream=True))
        assert body.read == 1 and not body.closed  # its first event only
    assert body.closed and body.read == 1


async def test_streaming_response_errors_are_stormguards(api: Api, mock: respx.MockRouter) -> None:
    mock.get("/models/m").respond(404, json={"error": {"message": "no such model"}})
    client = api.client(max_response_bytes=64)
    async with contextlib.AsyncExitStack() as stack:
        with pytest.raises(stormguard.NotFoundError) as caught:
            await enter(api, stack, client.models.with_streaming_response.retrieve("m"))
    assert caught.value.attempts == 1
    big = TrackedBody(b'{"id": "m", "pad": "' + b"x" * 100 + b'"}')
    mock.get("/models/big").mock(return_value=tracked(big))
    async with contextlib.AsyncExitStack() as stack:
        response = await enter(api, stack, client.models.with_streaming_response.retrieve("big"))
        with pytest.raises(stormguard.APIResponseValidationError) as too_large:
            await api.run(response.parse())
    assert "max_response_bytes=64" in str(too_large.value)
    assert too_large.value.attempts == 1 and too_large.value.request is not None
    assert big.closed


class CutBody(TrackedBody):
    """A body whose connection breaks after its first piece."""

    def __iter__(self) -> Iterator[bytes]:
        yield from self.pieces[:1]
        raise httpx.ReadError("connection reset")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces[:1]:
            yield piece
        raise httpx.ReadError("connection reset")


class StalledBody(TrackedBody):
    """A body that sends its first piece, then nothing."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.pieces[0]
        await anyio.Event().wait()


async def test_a_body_cut_after_the_hand_over_is_the_calls_error_not_retried(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").mock(return_value=tracked(CutBody(b'{"id": ', b'"x"}')))
    client = api.client()
    async with contextlib.AsyncExitStack() as stack:
        manager = client.chat.completions.with_streaming_response.create(messages=MESSAGES)
        response = await enter(api, stack, manager)
        with pytest.raises(stormguard.APIConnectionError) as caught:
            await api.run(response.parse())
    assert "ReadError" in str(caught.value) and caught.value.request is not None
    assert route.call_count == 1 and caught.value.attempts == 1
    assert [a.outcome for a in caught.value.attempt_history] == ["ok"]


async def test_async_body_read_after_the_hand_over_ends_by_the_calls_deadline(
    mock: respx.MockRouter,
) -> None:
    api = Api("async")
    mock.post("/chat/completions").mock(return_value=tracked(StalledBody(b'{"id": ')))
    # The deadline is the fake clock's, read as seconds of real time by the reads'
    # cancel scope: half a second here, whatever the machine's load.
    client = api.client(timeout=0.5)
    try:
        manager = client.chat.completions.with_streaming_response.create(messages=MESSAGES)
        async with manager as response:
            with pytest.raises(stormguard.APITimeoutError) as caught:
                await response.read()
        assert "deadline" in str(caught.value) and caught.value.response_started
    finally:
        await api.close_all()


async def test_the_calls_span_ends_when_a_streaming_response_is_parsed_or_closed(
    api: Api,
    mock: respx.MockRouter,
    otel: Otel,  # noqa: F811
) -> None:
    mock.post("/chat/completions").mock(
        side_effect=[tracked(TrackedBody(json.dumps(chat_json()).encode())) for _ in range(2)]
    )
    client = api.client(telemetry=otel.telemetry)
    create = client.chat.completions.with_streaming_response.create
    async with contextlib.AsyncExitStack() as stack:
        response = await enter(api, stack, create(messages=MESSAGES))
        assert otel.spans() == [s for s in otel.spans() if s.parent is not None]  # still open
        await api.run(response.parse())
        attributes = otel.logical().attributes or {}
        assert (
            attributes["gen_ai.usage.input_tokens"],
            attributes["gen_ai.usage.output_tokens"],
        ) == (
            5,
            2,
        )
    otel.exporter.clear()
    async with contextlib.AsyncExitStack() as stack:
        await enter(api, stack, create(messages=MESSAGES))
    assert (otel.logical().attributes or {})["stormguard.cancelled"] is True


async def test_the_client_and_chat_lead_to_the_same_methods(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/chat/completions").respond(200, json=chat_json("x"))
    mock.get("/models").respond(200, json={"object": "list", "data": [MODEL]})
    client = api.client()
    raw = await api.run(client.with_raw_response.chat.completions.create(messages=MESSAGES))
    assert raw.parse().choices[0].message.content == "x"
    raw = await api.run(client.chat.with_raw_response.completions.create(messages=MESSAGES))
    assert raw.status_code == 200
    async with contextlib.AsyncExitStack() as stack:
        response = await enter(api, stack, client.with_streaming_response.models.list())
        assert (await api.run(response.parse())).data[0].id == "org/m"
    async with contextlib.AsyncExitStack() as stack:
        manager = client.chat.with_streaming_response.completions.create(messages=MESSAGES)
        response = await enter(api, stack, manager)
        assert (await api.run(response.json()))["id"] == "chatcmpl-1"
