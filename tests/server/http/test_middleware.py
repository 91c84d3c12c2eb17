"""The pure-ASGI middlewares alone, driven by hand-made ASGI messages."""

from __future__ import annotations

import pytest
from starlette.types import Message, Receive, Scope, Send

from stormguard_server.http.middleware import LoadHeadersMiddleware, ResponseCountMiddleware

ROUTES = frozenset({"/v1/completions"})


def http_scope(path: str) -> Scope:
    return {"type": "http", "method": "POST", "path": path, "headers": []}


async def no_body() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def answer(status: int, send: Send) -> None:
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def test_counts_each_answer_by_route_and_status() -> None:
    counted: list[tuple[str, int]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await answer(503 if scope["path"] == "/v1/completions" else 404, send)

    middleware = ResponseCountMiddleware(app, lambda *c: counted.append(c), ROUTES)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await middleware(http_scope("/v1/completions"), no_body, send)
    await middleware(http_scope("/nowhere"), no_body, send)
    assert counted == [("/v1/completions", 503), ("other", 404)]
    assert [m["type"] for m in sent].count("http.response.start") == 2


async def test_an_error_that_escapes_before_the_answer_counts_as_a_500() -> None:
    counted: list[tuple[str, int]] = []

    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        raise RuntimeError("a bug no handler caught")

    middleware = ResponseCountMiddleware(broken, lambda *c: counted.append(c), ROUTES)

    async def send(message: Message) -> None:
        raise AssertionError("nothing is sent by the counter itself")

    with pytest.raises(RuntimeError):  # Starlette's ServerErrorMiddleware answers it
        await middleware(http_scope("/v1/completions"), no_body, send)
    assert counted == [("/v1/completions", 500)]


async def test_an_error_after_the_answer_started_is_not_counted_twice() -> None:
    counted: list[tuple[str, int]] = []

    async def cut(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("the stream broke")

    middleware = ResponseCountMiddleware(cut, lambda *c: counted.append(c), ROUTES)

    async def send(message: Message) -> None:
        pass

    with pytest.raises(RuntimeError):
        await middleware(http_scope("/v1/completions"), no_body, send)
    assert counted == [("/v1/completions", 200)]


async def test_a_failing_load_reading_costs_the_headers_not_the_answer() -> None:
    def broken_load() -> dict[str, str]:
        raise RuntimeError("engine load unreadable")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await answer(200, send)

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await LoadHeadersMiddleware(app, broken_load)(http_scope("/health"), no_body, send)
    assert sent[0]["status"] == 200 and sent[0]["headers"] == []
