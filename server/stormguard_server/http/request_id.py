"""``x-request-id`` on every response, as OpenAI sends one on every response.

A generation names itself (its completion's id, set by ``generation.serve_generation``
and kept here); any other answer — an unknown route's 404, a model that is not served,
a validation 400, a 413, a 503 of the request limits, ``/v1/models`` — gets a fresh
``req-<hex>`` id, so a caller can quote one for every request, failed ones included
(openai-python's ``APIStatusError.request_id``).
"""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp

from stormguard.protocol import HEADER_REQUEST_ID
from stormguard_server.http.middleware import LoadHeadersMiddleware

__all__ = ["RequestIdMiddleware"]


def fresh_request_id() -> dict[str, str]:
    """A new ``x-request-id``, for an answer that has none of its own."""
    return {HEADER_REQUEST_ID: f"req-{uuid.uuid4().hex}"}


class RequestIdMiddleware(LoadHeadersMiddleware):
    """Adds ``x-request-id: req-<hex>`` to a response that has none: the load headers'
    stamping, which never overrides a header the route set (a generation's id)."""

    def __init__(self, app: ASGIApp) -> None:
        super().__init__(app, fresh_request_id)
