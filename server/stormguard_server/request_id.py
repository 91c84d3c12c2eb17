"""``x-request-id`` on every response, as OpenAI sends one on every response.

A generation names itself (its completion's id, set by ``generation.serve_generation``
and kept here); any other answer — an unknown route's 404, a model that is not served,
a validation 400, a 413, a 503 of the request limits, ``/v1/models`` — gets a fresh
``req-<hex>`` id, so a caller can quote one for every request, failed ones included
(openai-python's ``APIStatusError.request_id``).
"""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stormguard.protocol import HEADER_REQUEST_ID

__all__ = ["RequestIdMiddleware"]

_HEADER = HEADER_REQUEST_ID.encode("latin-1")


class RequestIdMiddleware:
    """Adds ``x-request-id: req-<hex>`` to a response that has none."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                raw = list(message.get("headers", []))
                if all(name.lower() != _HEADER for name, _ in raw):
                    raw.append((_HEADER, f"req-{uuid.uuid4().hex}".encode("latin-1")))
                    message["headers"] = raw
            await send(message)

        await self.app(scope, receive, send_with_id)
