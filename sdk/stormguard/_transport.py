"""The whole pipeline as an httpx transport, for code that uses openai-python.

    client = openai.OpenAI(
        base_url="http://127.0.0.1:8000/v1",
        http_client=stormguard.httpx_client(base_url="http://127.0.0.1:8000/v1"),
        max_retries=0,  # stormguard retries, within its budget; two retry loops multiply
    )

Each request openai-python sends becomes one logical stormguard call (chat,
completions, embeddings and responses are known by their path: their spans,
pre-check and stream ends; any other request is protected all the same): token
pre-check, breaker, endpoint choice, budgeted retries with backoff and
Retry-After, fallback models. What comes back is plain httpx:

* a success is the server's response (a stream is replayed from its first
  bytes, which stormguard read to know the stream had started);
* a final error status is the last error response as the server sent it, so
  openai-python raises its own ``RateLimitError``/``InternalServerError``;
* a refusal before any I/O is a synthesized response that says so in
  openai's error format, with ``x-should-retry: false`` (an open breaker: 503
  ``x-load-shed: circuit_open``; a context-window refusal: 400; the token rate
  limit: 429; a full local queue or adaptive throttling: 503);
* no concurrency slot before the deadline is a timeout (``QueueTimeoutError``
  becomes ``httpx.ReadTimeout``: openai-python's ``APITimeoutError``);
* a final transport failure is raised as the httpx exception it was, which
  openai-python turns into ``APIConnectionError``/``APITimeoutError``.

The call's deadline bounds what the caller reads of a stream too: the replayed
stream raises ``httpx.ReadTimeout`` when the deadline passes (sync: at the
socket read that would cross it; async: a cancel scope around each read), and
``httpx.DecodingError`` past ``max_response_bytes`` of decoded bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio

from ._api_specs import EMBEDDINGS, RESPONSES
from ._async_client import AsyncClient
from ._base_client import ClientCore, ClientOptions, GenerationEndpoint
from ._body import read_response
from ._client import Client
from ._compat import Unpack
from ._exceptions import (
    APIConnectionError,
    APIStatusError,
    APITimeoutError,
    CircuitOpenError,
    ContextWindowExceededError,
    LocalQueueFullError,
    StormguardError,
    ThrottledError,
    TokenRateLimitedError,
)
from ._http import http_errors, httpx, response_types, transport_errors
from ._models import ModelList
from ._pipeline import CallSpec
from ._streaming import AsyncStream, Stream
from .protocol import HEADER_LOAD_SHED, HEADER_SHOULD_RETRY

__all__ = [
    "AsyncStormguardTransport",
    "StormguardTransport",
    "async_httpx_client",
    "httpx_client",
]

# Headers of the incoming request that describe its bytes or its connection, not
# the call: httpx sets them again for each attempt, and the encodings are the
# ones the pipeline decodes (in bounded steps) before it hands the body on.
_HOP_HEADERS = frozenset(
    {"host", "content-length", "transfer-encoding", "connection", "accept-encoding"}
)


def spec_from_request(core: ClientCore, request: httpx.Request) -> CallSpec:
    """One logical call for a request built by another client (openai-python)."""
    content = request.read()
    body: dict[str, Any] | None = None
    if content and "json" in request.headers.get("content-type", "json"):
        try:
            parsed = json.loads(content)
        except ValueError:
            parsed = None
        body = parsed if isinstance(parsed, dict) else None
    url = request.url
    # A request under the client's base path, to one of its endpoints, may go to any
    # endpoint (path relative to the base); anything else is sent where it points.
    base_path = httpx.URL(core.base_url).path.rstrip("/")
    relative: str | None = None
    # The path as sent: a %2F in it (a model id with a slash) is not a separator.
    raw_path = url.raw_path.decode("ascii").split("?", 1)[0]
    if url.netloc.decode("ascii") in core.netlocs() and raw_path.startswith(base_path + "/"):
        relative = raw_path[len(base_path) + 1 :]
        if url.query:
            relative += "?" + url.query.decode("ascii", "replace")
    endpoint = _endpoint_for(request.method, url.path)
    timeout = core.timeout
    requested = (request.extensions.get("timeout") or {}).get("read")
    if isinstance(requested, (int, float)) and requested > 0:
        timeout = requested if timeout is None else min(timeout, requested)
    model = body.get("model") if body is not None else None
    headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS}
    return CallSpec(
        method=request.method,
        path=relative if relative is not None else url.path,
        result_type=endpoint.result_type if endpoint is not None else ModelList,
        operation=endpoint.operation if endpoint is not None else "http",
        body=body,
        stream=bool(body and body.get("stream")),
        chunk_type=endpoint.chunk_type if endpoint is not None else None,
        model=model if isinstance(model, str) else None,
        timeout=timeout,
        headers=headers,
        raw=True,
        absolute_url=None if relative is not None else str(url),
        content=content or None,
    )


def _endpoint_for(method: str, path: str) -> GenerationEndpoint | None:
    """The API a request of openai-python's calls: its span operation, its result,
    and how its stream ends (chat's ``[DONE]``, the Responses API's last event)."""
    if method != "POST":
        return None
    if path.endswith("/chat/completions"):
        return GenerationEndpoint.CHAT
    if path.endswith("/completions"):
        return GenerationEndpoint.COMPLETION
    if path.endswith("/responses"):
        return RESPONSES
    if path.endswith("/embeddings"):
        return EMBEDDINGS
    return None


def _refusal(request: httpx.Request, status: int, message: str, code: str) -> httpx.Response:
    headers = {HEADER_SHOULD_RETRY: "false", "content-type": "application/json"}
    if code == "circuit_open":
        headers[HEADER_LOAD_SHED] = "circuit_open"
    body = {"error": {"message": message, "type": "stormguard_refusal", "code": code}}
    return httpx.Response(
        status, headers=headers, content=json.dumps(body).encode(), request=request
    )


def response_for_error(error: StormguardError, request: httpx.Request) -> httpx.Response:
    """What the transport's caller gets for a call that failed (see the module doc)."""
    if isinstance(error, APIStatusError) and error.response is not None:
        return read_response(error.response, error.raw_body or b"")
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
    raise httpx_error_for(error, request)


def httpx_error_for(error: StormguardError, request: httpx.Request) -> httpx.HTTPError:
    """The httpx exception that tells the transport's caller about ``error``: the
    one it came from, else a timeout, a read error or a decoding error (an answer
    that is not what the API promises)."""
    cause = error.__cause__
    if isinstance(cause, http_errors()):
        return cause
    exc: httpx.HTTPError
    if isinstance(error, APITimeoutError):
        exc = httpx.ReadTimeout(str(error), request=request)
    elif isinstance(error, APIConnectionError):
        exc = httpx.ReadError(str(error), request=request)
    else:
        exc = httpx.DecodingError(str(error), request=request)
    exc.__cause__ = error
    return exc


class _ReplayStream(httpx.SyncByteStream):
    """The bytes read while deciding the stream had started, then the rest."""

    def __init__(self, stream: Stream[Any]) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        state = self._stream._state
        if state.done:  # the whole stream came while it was starting
            state.passed_through()
        yield from state.raw_prefix  # decoded already, while the stream was starting
        try:
            # Each read ends by the call's deadline: the connection keeps it.
            for chunk in self._stream._bytes:
                state.passing_through(chunk)
                yield chunk
        except transport_errors() as exc:
            state.passed_through(cut=exc)
            raise
        except StormguardError as error:  # past the cap or the deadline
            raise httpx_error_for(error, state.response.request) from error
        state.passed_through()

    def close(self) -> None:
        self._stream.close()


class _AsyncReplayStream(httpx.AsyncByteStream):
    def __init__(self, stream: AsyncStream[Any]) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        state = self._stream._state
        if state.done:  # the whole stream came while it was starting
            state.passed_through()
        for chunk in state.raw_prefix:  # decoded already, while the stream was starting
            yield chunk
        pieces, deadline = self._stream._bytes, state.call.deadline
        try:
            while True:
                left = deadline.remaining()
                try:
                    with anyio.fail_after(left if math.isfinite(left) else None):
                        chunk = await pieces.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise httpx.ReadTimeout(
                        "The call's deadline passed during the stream",
                        request=state.response.request,
                    ) from None
                state.passing_through(chunk)
                yield chunk
        except transport_errors() as exc:
            state.passed_through(cut=exc)
            raise
        except StormguardError as error:  # past the cap or the deadline
            raise httpx_error_for(error, state.response.request) from error
        state.passed_through()

    async def aclose(self) -> None:
        await self._stream.aclose()


def _stream_response(
    stream: Stream[Any] | AsyncStream[Any],
    byte_stream: httpx.SyncByteStream | httpx.AsyncByteStream,
) -> httpx.Response:
    upstream = stream.response
    headers = [
        (k, v)
        for k, v in upstream.headers.multi_items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    return httpx.Response(
        upstream.status_code, headers=headers, stream=byte_stream, request=upstream.request
    )


class StormguardTransport(httpx.BaseTransport):
    """An httpx transport whose every request runs stormguard's call pipeline."""

    def __init__(self, client: Client) -> None:
        self._client = client

    @property
    def client(self) -> Client:
        """The stormguard client behind the transport (``stats()``, budget)."""
        return self._client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        try:
            result = self._client._request(spec_from_request(self._client._core, request))
        except StormguardError as error:
            return response_for_error(error, request)
        if isinstance(result, Stream):
            return _stream_response(result, _ReplayStream(result))
        assert isinstance(result, response_types())
        return result

    def close(self) -> None:
        self._client.close()


class AsyncStormguardTransport(httpx.AsyncBaseTransport):
    """The async twin of :class:`StormguardTransport`."""

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @property
    def client(self) -> AsyncClient:
        return self._client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            result = await self._client._request(spec_from_request(self._client._core, request))
        except StormguardError as error:
            return response_for_error(error, request)
        if isinstance(result, AsyncStream):
            return _stream_response(result, _AsyncReplayStream(result))
        assert isinstance(result, response_types())
        return result

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._client.close()


def httpx_client(**options: Unpack[ClientOptions]) -> httpx.Client:
    """An ``httpx.Client`` whose transport runs the whole stormguard pipeline; give it
    to ``openai.OpenAI(http_client=..., max_retries=0)``. Options as for ``Client``."""
    # No httpx timeout of its own: the pipeline gives every attempt its share of the
    # call's deadline.
    return httpx.Client(transport=StormguardTransport(Client(**options)), timeout=None)


def async_httpx_client(**options: Unpack[ClientOptions]) -> httpx.AsyncClient:
    """The ``httpx.AsyncClient`` twin of :func:`httpx_client`, for ``openai.AsyncOpenAI``."""
    transport = AsyncStormguardTransport(AsyncClient(**options))
    return httpx.AsyncClient(transport=transport, timeout=None)
