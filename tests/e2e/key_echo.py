"""A hostile server that echoes the caller's API key in every place a server can put
text, and the check that nothing the SDK shows carries it.

Each echo is a behaviour of ``hostile_server.HostileServer``: it takes the key from
the request (``authorization: Bearer ...`` or ``api-key``) and writes it back in a
body, a header, an SSE line, a URL. ``ECHOES`` names them; ``serve_echoes`` serves
each one under its own base URL (``{origin}/{name}/v1``), so one server holds all.

``leaks`` is the test: the key in any case, or any 8 or more of its first or last
characters (a key cut in half by a truncation leaks that half).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import string
from collections.abc import Callable, Iterator
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from stormguard.telemetry import Telemetry
from tests.e2e.hostile_server import HostileServer, RawRequest, head

__all__ = [
    "ECHOES",
    "KEY",
    "Recorded",
    "echo_url",
    "error_texts",
    "leaks",
    "log_texts",
    "recording",
    "serve_echoes",
]

#: A realistic key, new each run: mixed case, so a lower-cased echo is a different text.
KEY = "sk-proj-" + "".join(secrets.choice(string.ascii_letters + string.digits) for _ in range(40))

#: Loggers whose records are not checked: at DEBUG, httpcore's trace writes response
#: headers as they came off the wire, and openai-python the request id it got (the
#: README says so).
UNCHECKED_LOGGERS = ("httpcore", "openai")


def leaks(text: str, key: str = KEY) -> bool:
    """Whether ``text`` shows ``key`` in any case, or 8+ of its first or last characters."""
    lowered = text.lower()
    return any(part.lower() in lowered for part in (key, key[:8], key[-8:]))


def sent_key(request: RawRequest) -> str:
    auth = request.headers.get("authorization", "")
    return auth.removeprefix("Bearer ").strip() or request.headers.get("api-key", "")


def _chunk(key: str = "c1", model: str = "m", content: str = "a") -> str:
    return json.dumps(
        {
            "id": key,
            "object": "chat.completion.chunk",
            "model": model,
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
        }
    )


def _chat(key: str = "chatcmpl-1", model: str = "m", content: str = "pong") -> dict[str, Any]:
    return {
        "id": key,
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def _response(
    status: int, body: bytes | str | dict[str, Any] | list[Any], headers: list[tuple[str, str]]
) -> bytes:
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
    payload = body.encode() if isinstance(body, str) else body
    return head(status, [*headers, ("content-length", str(len(payload)))]) + payload


def _sse(*lines: str) -> bytes:
    body = "".join(lines).encode()
    return _response(200, body, [("content-type", "text/event-stream")])


_JSON = [("content-type", "application/json")]
#: In a header, replaced by the request's ``host``: a URL that leads back to this server.
HOST = "HOST.INVALID"

#: Where the key goes, by name: each builds the raw response for a key.
ECHOES: dict[str, Callable[[str], bytes]] = {
    "text_body_200": lambda k: _response(200, f"not JSON: {k}", _JSON),
    "json_list_body_200": lambda k: _response(200, [k, {"key": k}], _JSON),
    "content_type": lambda k: _response(200, _chat(), [("content-type", f"text/plain; key={k}")]),
    "request_id": lambda k: _response(
        500, {"error": {"message": "boom"}}, [*_JSON, ("x-request-id", k)]
    ),
    "load_headers": lambda k: _response(
        503,
        {"error": {"message": "shed"}},
        [
            *_JSON,
            ("x-load-shed", k),
            ("x-queue-depth", k),
            ("x-kv-cache-usage", k),
            ("x-should-retry", k),
            ("endpoint-load-metrics", f"TEXT named_metrics.{k}=1"),
        ],
    ),
    "retry_after": lambda k: _response(
        429,
        {"error": {"message": "slow down"}},
        [*_JSON, ("retry-after", k), ("retry-after-ms", k)],
    ),
    # The key straddles the 500-character cut of a quoted message.
    "json_error_at_the_cut": lambda k: _response(
        401, {"error": {"message": "x" * 480 + f"{k} is not a valid key"}}, _JSON
    ),
    "text_error_at_the_cut": lambda k: _response(
        500, "<html>" + "x" * 484 + k + "</html>", [("content-type", "text/html")]
    ),
    # ... and the 300-character cut of a span's status description.
    "text_error_at_the_status_cut": lambda k: _response(
        502, "y" * 270 + k, [("content-type", "text/plain")]
    ),
    "detail_list": lambda k: _response(422, {"detail": [{"loc": ["body"], "msg": k}]}, _JSON),
    # openai-python follows it: to this server (HOST), with the key as a password.
    "location": lambda k: _response(
        307,
        f"moved to http://user:{k}@llm.example/v1?api-key={k}",
        [("location", f"http://user:{k}@{HOST}/elsewhere?api-key={k}")],
    ),
    "malformed_header_line": lambda k: (
        f"HTTP/1.1 200 OK\r\nx-echo {k}\r\ncontent-length: 0\r\n\r\n".encode()
    ),
    "id_model_and_content": lambda k: _response(
        200, _chat(key=k, model=k, content=f"your key is {k}"), _JSON
    ),
    "sse_comment": lambda k: _sse(f": {k}\n\n", f"data: {_chunk()}\n\n", "data: [DONE]\n\n"),
    "sse_chunk_id_model_content": lambda k: _sse(
        f"data: {_chunk(key=k, model=k, content=k)}\n\n", "data: [DONE]\n\n"
    ),
    "sse_non_json_data": lambda k: _sse(f"data: not JSON {k}\n\n"),
    "sse_error_event": lambda k: _sse(
        "event: error\n", f"data: {json.dumps({'error': {'message': k, 'code': 503}})}\n\n"
    ),
    "sse_error_after_a_chunk": lambda k: _sse(
        f"data: {_chunk()}\n\n",
        f"data: {json.dumps({'error': {'message': 'x' * 490 + k, 'code': 500}})}\n\n",
    ),
}


def _behaviour(build: Callable[[str], bytes]) -> Any:
    async def behaviour(request: RawRequest, writer: asyncio.StreamWriter) -> None:
        raw = build(sent_key(request))
        raw_head, sep, body = raw.partition(b"\r\n\r\n")
        host = request.headers.get("host", "127.0.0.1").encode()
        writer.write(raw_head.replace(HOST.encode(), host) + sep + body)
        await writer.drain()

    return behaviour


@contextlib.contextmanager
def serve_echoes() -> Iterator[HostileServer]:
    """One server for every echo: ``echo_url(server, name)`` is the base URL of one."""
    behaviours = {f"/{name}/v1/chat/completions": _behaviour(b) for name, b in ECHOES.items()}
    with HostileServer(behaviours) as server:
        yield server


def echo_url(server: HostileServer, name: str) -> str:
    return f"{server.origin}/{name}/v1"


def error_texts(error: BaseException) -> list[str]:
    """Every text an error shows: str, repr, args, string attributes, its text or
    JSON body, the load it quotes and its attempt history."""
    texts = [str(error), repr(error), *map(str, error.args)]
    texts += [value for value in vars(error).values() if isinstance(value, str)]
    body = getattr(error, "body", None)
    if body is not None:
        texts.append(json.dumps(body))
    for name in ("server_load", "attempt_history"):
        texts.append(repr(getattr(error, name, None)))
    return texts


class Recorded:
    """The spans a call left behind (attributes, status, events)."""

    def __init__(self, exporter: InMemorySpanExporter, telemetry: Telemetry) -> None:
        self.exporter = exporter
        self.telemetry = telemetry

    def span_texts(self) -> list[str]:
        texts: list[str] = []
        spans: tuple[ReadableSpan, ...] = self.exporter.get_finished_spans()
        for span in spans:
            texts += [span.name, span.status.description or ""]
            texts += [str(value) for value in (span.attributes or {}).values()]
            for event in span.events:
                texts += [event.name, *(str(v) for v in (event.attributes or {}).values())]
        return texts


def log_texts(records: list[logging.LogRecord]) -> list[str]:
    """Every checked log record (``caplog.records``) as it would be printed."""
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    return [
        formatter.format(record)
        for record in records
        if not record.name.startswith(UNCHECKED_LOGGERS)
    ]


@contextlib.contextmanager
def recording() -> Iterator[Recorded]:
    """Spans of the calls made in the block, completion text included (capture_content)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        yield Recorded(exporter, Telemetry(tracer_provider=provider, capture_content=True))
    finally:
        provider.shutdown()
