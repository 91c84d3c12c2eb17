"""Refusal responses: the status, body and headers of every "no" the server says.

Kept apart from the generation flow so that any front end of the admission
layer (the reference app, a middleware in front of real vLLM) answers a shed,
a too-long request or an engine failure in exactly the same way.
"""

from __future__ import annotations

from fastapi.responses import Response

from stormguard.protocol import (
    HEADER_LOAD_SHED,
    HEADER_SHOULD_RETRY,
    ShedReason,
    format_retry_after,
)
from stormguard_server.admission.tickets import Shed
from stormguard_server.engine.base import (
    DeadlineExceeded,
    EngineCrashed,
    EngineError,
    EngineUnavailable,
)
from stormguard_server.http.errors import error_response


def too_long_refusal(message: str, *, param: str = "messages", admission: bool = True) -> Response:
    """400: the request can never fit; retrying cannot help. ``param`` names the field
    that holds the prompt (``messages``, ``prompt``, ``input``)."""
    headers = refusal_headers(ShedReason.TOO_LONG, None, False) if admission else {}
    return error_response(
        400, message, code="context_length_exceeded", param=param, headers=headers
    )


def body_too_large_response(max_bytes: int) -> Response:
    """413: a request body over ``max_bytes``, refused before anything reads it."""
    return error_response(
        413, f"request body is larger than {max_bytes} bytes", code="body_too_large"
    )


def shed_error_response(shed: Shed) -> Response:
    """A refusal from admission, with its reason, Retry-After and x-should-retry."""
    headers = refusal_headers(shed.reason, shed.retry_after_s, shed.should_retry)
    code = "context_length_exceeded" if shed.reason is ShedReason.TOO_LONG else shed.reason.value
    return error_response(shed.status_code, shed.message, code=code, headers=headers)


def engine_error_status(error: EngineError) -> int:
    """The status of an engine failure, as an HTTP answer or inside a stream: 503 while
    it restarts or warms up, 504 when the caller's deadline passed while it ran, 500
    for an injected error."""
    if isinstance(error, EngineUnavailable | EngineCrashed):
        return 503
    if isinstance(error, DeadlineExceeded):
        return 504
    return 500


def engine_error_code(error: EngineError) -> str:
    """The error ``code`` of an engine failure, as an HTTP answer or inside a stream."""
    return {503: "engine_unavailable", 504: "deadline_exceeded"}.get(
        engine_error_status(error), "engine_error"
    )


def refusal_headers(
    reason: ShedReason, retry_after_s: float | None, should_retry: bool
) -> dict[str, str]:
    headers = {HEADER_LOAD_SHED: reason.value, HEADER_SHOULD_RETRY: str(should_retry).lower()}
    if retry_after_s is not None:
        headers.update(format_retry_after(retry_after_s))
    return headers
