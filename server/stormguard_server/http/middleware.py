"""Pure-ASGI middlewares (they stream: no response buffering).

``LoadHeadersMiddleware`` stamps the load headers on every response at the
moment its status line goes out: errors, 404s, validation failures and SSE
streams included. ``BodyLimitMiddleware`` refuses bodies over the size limit
with a 413 before any route reads them; ``ErrorBoundaryMiddleware`` turns a
bug into a logged, OpenAI-shaped 500 that still carries the load headers;
``ResponseCountMiddleware``, outermost, counts every status a client gets.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stormguard.protocol import parse_non_negative_int
from stormguard_server.http.errors import error_response
from stormguard_server.http.refusals import body_too_large_response


class LoadHeadersMiddleware:
    """Adds ``headers()`` to every HTTP response, never overriding the route's own."""

    def __init__(self, app: ASGIApp, headers: Callable[[], dict[str, str]]) -> None:
        self.app = app
        self.headers = headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_load(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = self._headers_or_none()
                if extra:
                    raw = list(message.get("headers", []))
                    present = {name.lower() for name, _ in raw}
                    for name, value in extra.items():
                        key = name.encode("latin-1")
                        if key not in present:
                            raw.append((key, value.encode("latin-1")))
                    message["headers"] = raw
            await send(message)

        await self.app(scope, receive, send_with_load)

    def _headers_or_none(self) -> dict[str, str]:
        """The load headers; none (and a logged error) if reading the load fails: they
        are advice, and a bug there must not cost the client its answer."""
        try:
            return self.headers()
        except Exception:
            logger.exception("load headers failed", extra={"event": "unhandled_error"})
            return {}


logger = logging.getLogger("stormguard_server.http")


class ErrorBoundaryMiddleware:
    """A bug must not take the load headers (or the OpenAI error shape) with it:
    an unhandled exception becomes a logged 500 with an OpenAI-style body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def send_tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_tracked)
        except Exception:
            logger.exception(
                "unhandled error", extra={"event": "unhandled_error", "path": scope.get("path")}
            )
            if not started:
                response = error_response(500, "internal server error", code="internal_error")
                await response(scope, receive, send)


class ResponseCountMiddleware:
    """Counts responses by route and status; unknown paths share one label.

    Meant to be the outermost middleware: an exception that escapes the app before
    a response started is counted as the 500 that Starlette's ServerErrorMiddleware
    (outside every user middleware) then sends."""

    def __init__(
        self, app: ASGIApp, count: Callable[[str, int], None], routes: frozenset[str]
    ) -> None:
        self.app = app
        self.count = count
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        route = path if path in self.routes else "other"
        started = False

        async def send_counted(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                self.count(route, int(message["status"]))
            await send(message)

        try:
            await self.app(scope, receive, send_counted)
        except Exception:
            if not started:
                self.count(route, 500)
            raise


class BodyLimitMiddleware:
    """Reads the body up to ``max_bytes``; over that, answers 413 without calling the app."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in {"POST", "PUT", "PATCH"}:
            await self.app(scope, receive, send)
            return
        declared = declared_content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                # The client left while sending: let the app see the disconnect.
                await self.app(scope, _replay([], message, receive), send)
                return
            body = message.get("body", b"")
            size += len(body)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
            chunks.append(body)
            if not message.get("more_body", False):
                break
        request: Message = {"type": "http.request", "body": b"".join(chunks), "more_body": False}
        await self.app(scope, _replay([request], None, receive), send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        await body_too_large_response(self.max_bytes)(scope, receive, send)


def declared_content_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` (None: absent, or not a plain number of ASCII
    digits: ``str.isdigit`` takes ``¹`` too, which ``int()`` does not)."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            return parse_non_negative_int(value.decode("latin-1"))
    return None


def _replay(messages: list[Message], then: Message | None, receive: Receive) -> Receive:
    """A receive that returns the buffered messages first, then the real ones."""
    pending = list(messages)
    if then is not None:
        pending.append(then)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
