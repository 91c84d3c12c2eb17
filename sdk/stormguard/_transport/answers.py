"""What the transport's caller gets for a call: a response of its own HTTP library
(the server's, a synthesized refusal, or a replayed stream) or one of its
exceptions, each response with the call's ``CallInfo`` on
``response.extensions["stormguard"]`` (``_transport/transport.py`` says which is which)."""

from __future__ import annotations

import json
import sys
from typing import Any, cast

from .._call.streaming import AsyncStream, Stream
from .._client.call_info_lookup import error_info
from .._core.exceptions import (
    APIConnectionError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    CircuitOpenError,
    ContextWindowExceededError,
    LocalQueueFullError,
    StormguardError,
    ThrottledError,
    TokenRateLimitedError,
)
from .._core.http import httpx, library_of, request_errors
from .._core.results import CALL_INFO_EXTENSION
from .._io.body import decoded_headers, read_response
from ..protocol import (
    HEADER_LOAD_SHED,
    HEADER_REQUEST_ID,
    HEADER_SHOULD_RETRY,
    HEADER_STAINLESS_RETRY_COUNT,
)

__all__ = [
    "ERROR_EXTENSION",
    "for_openai",
    "from_openai",
    "httpx_error_for",
    "in_library_of",
    "plain_response",
    "raised_for",
    "response_for_error",
    "stream_response",
]


#: The key of the error a failed call raised, on the response the transport answers
#: it with: ``stormguard.OpenAI`` raises that very error (``_transport/openai_client.py``), as
#: ``stormguard.Client(openai_errors=True)`` would have.
ERROR_EXTENSION = "stormguard.error"


def from_openai(request: httpx.Request) -> bool:
    """Whether openai-python built ``request``: it numbers every request it sends in
    ``x-stainless-retry-count`` (0 for the first), and it is imported."""
    return HEADER_STAINLESS_RETRY_COUNT in request.headers and "openai" in sys.modules


def raised_for(error: StormguardError, request: httpx.Request) -> Exception:
    """What the transport raises for a call that failed with no response to hand on.

    To openai-python: ``error`` itself, as the class that is also openai's
    (``stormguard.openai_errors``). openai-python hands an ``OpenAIError`` raised
    under it on as it is, without a retry of its own (its ``openai/_base_client.py``,
    2.x and 3.x): stormguard has retried already, within its budget, and the caller
    gets the very error ``stormguard.Client(openai_errors=True)`` raises. To any
    other caller: an error of its HTTP library (:func:`httpx_error_for`)."""
    if from_openai(request):
        return for_openai(error, request)
    return httpx_error_for(error, request)


def for_openai(error: StormguardError, request: httpx.Request) -> StormguardError:
    """``error`` as the class that is also openai's, with a ``request``: openai's errors
    always have one, and code that builds its own from them reads its headers
    (LangChain's ``OpenAIConnectionError(request=e.request)``). Where no request went
    out for the error itself (a wait for a slot, a refusal, a cut found at the end of
    a body), it is the caller's request the call answered."""
    from ..openai_errors import as_openai_error

    if getattr(error, "request", None) is None:
        error.request = request  # type: ignore[attr-defined]
    return as_openai_error(error)


def _refusal(
    request: httpx.Request,
    status: int,
    message: str,
    code: str,
    kind: str = "stormguard_refusal",
    request_id: str | None = None,
) -> httpx.Response:
    headers = {HEADER_SHOULD_RETRY: "false", "content-type": "application/json"}
    if code == "circuit_open":
        headers[HEADER_LOAD_SHED] = "circuit_open"
    if request_id is not None:
        headers[HEADER_REQUEST_ID] = request_id
    body = {"error": {"message": message, "type": kind, "code": code}}
    response_type: type[httpx.Response] = library_of(request).Response
    return response_type(
        status, headers=headers, content=json.dumps(body).encode(), request=request
    )


def _invalid_answer(request: httpx.Request, error: APIResponseValidationError) -> httpx.Response:
    """A 2xx answer that breaks the API, found before any of it went to the caller (a
    stream that is not an event stream, a first event that is not JSON, a stream
    past ``max_response_bytes``): a 502 Bad Gateway, what a proxy answers for an
    upstream's invalid response (RFC 9110, 15.6.3; Envoy does so), with the reason
    (scrubbed of credentials) in openai's error format. openai-python raises its
    ``InternalServerError`` with it and, told ``x-should-retry: false``, does not
    retry: stormguard judged the answer already. On its own, openai-python reads a
    JSON or HTML 200 to a stream as an empty stream; an httpx error here would
    reach it as ``APIConnectionError: Connection error.``, the reason lost."""
    return _refusal(
        request,
        502,
        str(error),
        "invalid_response",
        kind="stormguard_invalid_response",
        request_id=error.request_id,
    )


def response_for_error(
    error: StormguardError, request: httpx.Request, model: str | None = None
) -> httpx.Response:
    """What the transport's caller gets for a call that failed (``_transport/transport.py``'s
    module doc), with the call's ``CallInfo`` (of ``model``) and the error in its
    extensions; an error that is not answered by a response is raised
    (:func:`raised_for`)."""
    response = _answer_for(error, request)
    # Final: stormguard retried it within its policy and budget, or judged it not
    # worth a retry. openai-python obeys this header over the status it would retry
    # (its ``_should_retry``), so its own retries do not stack on stormguard's.
    response.headers[HEADER_SHOULD_RETRY] = "false"
    response.extensions[CALL_INFO_EXTENSION] = error_info(error, model)
    response.extensions[ERROR_EXTENSION] = error
    return response


def _answer_for(error: StormguardError, request: httpx.Request) -> httpx.Response:
    if isinstance(error, APIStatusError) and error.response is not None:
        return read_response(error.response, error.raw_body or b"", request)
    if isinstance(error, CircuitOpenError):
        return _refusal(request, 503, str(error), "circuit_open")
    if isinstance(error, ContextWindowExceededError):
        return _refusal(request, 400, str(error), "context_length_exceeded")
    if isinstance(error, TokenRateLimitedError):
        return _refusal(request, 429, str(error), "client_token_rate_limit")
    if isinstance(error, LocalQueueFullError):
        return _refusal(request, 503, str(error), "local_queue_full")
    if isinstance(error, ThrottledError):
        return _refusal(request, 503, str(error), "throttled")
    if isinstance(error, APIResponseValidationError):
        return _invalid_answer(request, error)
    raise raised_for(error, request)


def httpx_error_for(error: StormguardError, request: httpx.Request) -> httpx.HTTPError:
    """The exception, of the caller's HTTP library (``request``'s), that tells the
    transport's caller about ``error``: the one it came from (as the caller's
    library's class of that name, when another library carried the call), else a
    timeout, a read error or a decoding error (an answer that is not what the API
    promises)."""
    lib = library_of(request)
    cause = error.__cause__
    if isinstance(cause, request_errors()):
        return in_library_of(request, cause)
    exc: httpx.HTTPError
    if isinstance(error, APITimeoutError):
        exc = lib.ReadTimeout(str(error), request=request)
    elif isinstance(error, APIConnectionError):
        exc = lib.ReadError(str(error), request=request)
    else:
        exc = lib.DecodingError(str(error), request=request)
    exc.__cause__ = error
    return exc


def in_library_of(request: httpx.Request, exc: httpx.RequestError) -> httpx.RequestError:
    """``exc`` as an error of ``request``'s library: itself, or that library's class
    of the same name (a transport error, when none), caused by it."""
    lib = library_of(request)
    if isinstance(exc, lib.RequestError):
        return cast("httpx.RequestError", exc)
    kind = getattr(lib, type(exc).__name__, None)
    if not (isinstance(kind, type) and issubclass(kind, lib.RequestError)):
        kind = lib.TransportError
    converted: httpx.RequestError = kind(str(exc), request=request)
    converted.__cause__ = exc
    return converted


def stream_response(
    stream: Stream[Any] | AsyncStream[Any], request: httpx.Request, byte_stream: object
) -> httpx.Response:
    """The caller's response for a started stream: the server's status and headers
    (less those of the encoded bytes), ``byte_stream`` as its body, the call's
    ``CallInfo`` (its attempts, complete at the first chunk) in its extensions."""
    upstream = stream.response
    headers = decoded_headers(upstream)
    response_type: type[httpx.Response] = library_of(request).Response
    return response_type(
        upstream.status_code,
        headers=headers,
        stream=byte_stream,  # type: ignore[arg-type]
        request=request,
        extensions={CALL_INFO_EXTENSION: stream.call_info},
    )


def plain_response(result: httpx.Response, request: httpx.Request) -> httpx.Response:
    """A read response handed on as is, or rebuilt by the caller's library (its
    ``CallInfo`` extension kept)."""
    if isinstance(result, library_of(request).Response):
        return cast("httpx.Response", result)
    response = read_response(result, result.content, request)
    if CALL_INFO_EXTENSION in result.extensions:
        response.extensions[CALL_INFO_EXTENSION] = result.extensions[CALL_INFO_EXTENSION]
    return response
