"""Turning HTTP responses and transport failures into results and stormguard errors.

One place for it, like httpx's ``map_httpcore_exceptions``: an attempt and its
result (``_call/attempt_flow.py``, ``_call/call_result.py``), a stream and a body
handed over unread all go through these functions, whichever client or transport
made the call.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar

from .._core.exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    ClientClosedError,
    EventLoopMismatchError,
    error_object,
    status_error_class,
)
from .._core.http import httpx, request_errors, timeout_errors
from .._core.record_shapes import shape_problem
from .._core.redact import Redactor
from .._core.results import APIResult, CallInfo
from ..protocol import HEADER_REQUEST_ID, ServerLoad

__all__ = [
    "error_from_payload",
    "error_from_response",
    "parse_json_object",
    "request_id_of",
    "result_from_response",
    "send_failure",
    "translate_transport_error",
]

R = TypeVar("R", bound=APIResult)

# Server text quoted in an error message is cut here: a 10 MB HTML error page
# must not end up in a log line. Every quote is scrubbed of secrets before the cut.
_MAX_QUOTED = 500


def request_id_of(response: httpx.Response, *, redactor: Redactor) -> str | None:
    """The response's ``x-request-id``, scrubbed, at most 200 characters."""
    values = response.headers.get_list(HEADER_REQUEST_ID)  # no KeyError when it is absent
    return redactor.quote(", ".join(values), 200) if values else None


def translate_transport_error(
    exc: Exception, *, response_started: bool = False, server_load: ServerLoad | None = None
) -> APIError:
    """The stormguard error for an httpx failure (or an anyio/asyncio timeout), with
    the request httpx names (the call's attempt record adds the attempt's when it
    names none: ``_call/attempt_record.py``)."""
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    request = _request_of(exc)
    if isinstance(exc, (*timeout_errors(), TimeoutError)):
        return APITimeoutError(
            f"Request timed out ({detail})",
            request,
            response_started=response_started,
            server_load=server_load,
        )
    if response_started:
        return APIConnectionError(
            f"Connection lost while reading the response ({detail})",
            request,
            server_load=server_load,
        )
    return APIConnectionError(f"Connection error ({detail})", request, server_load=server_load)


def send_failure(
    exc: Exception,
    http: object,
    *,
    response_started: bool = False,
    server_load: ServerLoad | None = None,
) -> APIError | None:
    """The error an attempt fails with when its send (or, ``response_started``, its
    body read) on the pool ``http`` raised ``exc``: ``ClientClosedError`` once the
    pool is closed, whatever broke (a ``close()`` that ended the read, or httpx's
    ``RuntimeError`` for a send on a closed client); ``EventLoopMismatchError`` for
    asyncio's ``RuntimeError`` about a connection of another event loop; else the
    translation of an httpx failure. None for any other ``RuntimeError``: a bug, to
    be raised as it is."""
    if getattr(http, "is_closed", False):
        if isinstance(exc, RuntimeError):  # httpx's refusal to send on a closed client
            return ClientClosedError()
        return ClientClosedError(
            "The client was closed while this call was in flight",
            _request_of(exc),
            server_load=server_load,
        )
    if isinstance(exc, RuntimeError):
        if "loop" not in str(exc):  # asyncio's: "Event loop is closed", "... different loop"
            return None
        return EventLoopMismatchError(
            f"The http_client holds a connection opened on another event loop ({str(exc)[:200]}):"
            " an httpx.AsyncClient serves the loop its connections were opened on; make one"
            " per event loop, or pass none (the client's own pool keeps one per loop)",
        )
    return translate_transport_error(
        exc, response_started=response_started, server_load=server_load
    )


def _request_of(exc: Exception) -> httpx.Request | None:
    if not isinstance(exc, request_errors()):
        return None
    try:
        return exc.request
    except RuntimeError:  # httpx raises it for an error made without a request
        return None


#: The standard decoder's ``raw_decode``: what ``json.loads`` ends in, without its
#: checks around it.
_raw_decode = json.JSONDecoder().raw_decode


def parse_json_object(body: bytes | str) -> Mapping[str, Any] | None:
    """The JSON object in ``body`` (bytes, or text already decoded: a stream
    event's data), or None when it is not one."""
    if type(body) is str:
        # Text that is one JSON value from its first character to its last (every
        # stream event a server sends): ``raw_decode`` alone, which skips the
        # wrapper ``json.loads`` puts around it (its type and BOM checks and two
        # whitespace matches): about 0.9 us of a chat chunk's 2.2 us. Anything else
        # (whitespace around the value, no JSON) goes to ``json.loads`` below.
        try:
            value, end = _raw_decode(body)
        except (ValueError, RecursionError):
            end = -1
        if end == len(body):
            return value if isinstance(value, dict) else None
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _error_message(payload: object, fallback: str) -> str:
    """The human part of an error body: OpenAI's ``{"error": {"message"}}``,
    FastAPI's ``{"detail"}``, or a plain ``{"message"}``."""
    if isinstance(payload, Mapping):
        error = payload.get("error", payload)
        if isinstance(error, Mapping):
            message = error.get("message")
            if isinstance(message, str) and message:
                return message
        elif isinstance(error, str) and error:
            return error
        detail = payload.get("detail")
        if detail:
            return detail if isinstance(detail, str) else json.dumps(detail)
    return fallback


def error_from_payload(
    status_code: int,
    payload: object,
    *,
    server_load: ServerLoad,
    request_id: str | None,
    response: httpx.Response | None,
    redactor: Redactor,
    fallback: str = "",
    raw_body: bytes | None = None,
) -> APIStatusError:
    """An ``APIStatusError`` of the class for ``status_code``, from a decoded body:
    its ``body`` is the body's ``error`` object, as openai-python's (scrubbed of
    secrets; ``raw_body`` stays as it came)."""
    message = _error_message(payload, fallback) or httpx.codes.get_reason_phrase(status_code)
    message = redactor.quote(message, _MAX_QUOTED)  # scrubbed first: a key cut in half leaks half
    cls = status_error_class(status_code)
    return cls(
        f"Error code: {status_code} - {message}",
        status_code=status_code,
        body=redactor.scrub_json(error_object(payload)),
        raw_body=raw_body,
        response=response,
        server_load=server_load,
        request_id=request_id,
    )


def error_from_response(
    response: httpx.Response, body: bytes, *, server_load: ServerLoad, redactor: Redactor
) -> APIStatusError:
    """The error for a non-2xx response whose body has been read."""
    payload: object = parse_json_object(body)
    fallback = ""
    if payload is None:
        fallback = redactor.quote_bytes(body, _MAX_QUOTED).strip()
        payload = fallback or None
    return error_from_payload(
        response.status_code,
        payload,
        server_load=server_load,
        request_id=request_id_of(response, redactor=redactor),
        response=response,
        redactor=redactor,
        fallback=fallback,
        raw_body=body,
    )


def result_from_response(
    response: httpx.Response,
    body: bytes,
    result_type: type[R],
    *,
    info: CallInfo,
    redactor: Redactor,
) -> R:
    """The typed result of a 2xx JSON response, or a validation error: a body that
    is not a JSON object, or one whose fields the result type cannot serve
    (``_core/record_shapes.py``)."""
    content_type = response.headers.get("content-type", "")
    if content_type and "json" not in content_type.lower():
        raise APIResponseValidationError(
            f"Expected a JSON response, got content-type {redactor.quote(content_type, 100)!r}",
            status_code=response.status_code,
            response=response,
            server_load=info.server_load,
            request_id=info.request_id,
        )
    data = parse_json_object(body)
    if data is None:
        snippet = redactor.quote_bytes(body, 80)
        raise APIResponseValidationError(
            f"The response body is not a JSON object (starts with {snippet!r})",
            status_code=response.status_code,
            response=response,
            server_load=info.server_load,
            request_id=info.request_id,
        )
    problem = shape_problem(result_type, data)
    if problem is not None:
        raise APIResponseValidationError(
            f"The response does not fit {result_type.__name__}: {problem}",
            status_code=response.status_code,
            response=response,
            server_load=info.server_load,
            request_id=info.request_id,
        )
    return result_type(data, info)
