"""The whole pipeline as an HTTP transport, for code that uses openai-python.

    client = openai.OpenAI(
        base_url="http://127.0.0.1:8000/v1",
        http_client=stormguard.httpx_client(base_url="http://127.0.0.1:8000/v1"),
        max_retries=0,  # stormguard retries, within its budget; two retry loops multiply
    )

``httpx_client()`` returns a client of the library the installed openai-python runs
on: an ``httpx2.Client`` from openai 3.x on (its own, typed and taken natively), an
``httpx.Client`` before; ``library="httpx"`` or ``"httpx2"`` asks by name. What the
caller gets back (responses, streams, errors) is of its client's library, whichever
one carries the pipeline's own requests (``_http.py``).

Each request openai-python sends becomes one logical stormguard call (chat,
completions, embeddings and responses are known by their path: their spans,
pre-check and stream ends; any other request is protected all the same): token
pre-check, breaker, endpoint choice, budgeted retries with backoff and
Retry-After, fallback models. What comes back is plain httpx (or httpx2):

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
* a final transport failure is raised as the httpx exception it was (as the
  caller's library's class of that name, when the other library carried it),
  which openai-python turns into ``APIConnectionError``/``APITimeoutError``.

The call's deadline bounds what the caller reads of a stream too: the replayed
stream raises ``httpx.ReadTimeout`` when the deadline passes (sync: at the
socket read that would cross it; async: a cancel scope around each read), and
``httpx.DecodingError`` past ``max_response_bytes`` of decoded bytes.
"""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Literal, cast, overload

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
from ._http import httpx, library_of, request_errors, response_types, transport_errors
from ._models import ModelList
from ._pipeline import CallSpec
from ._streaming import AsyncStream, Stream
from .protocol import HEADER_LOAD_SHED, HEADER_SHOULD_RETRY

if TYPE_CHECKING:
    import httpx2

__all__ = [
    "AsyncStormguardTransport",
    "Library",
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
    response_type: type[httpx.Response] = library_of(request).Response
    return response_type(
        status, headers=headers, content=json.dumps(body).encode(), request=request
    )


def response_for_error(error: StormguardError, request: httpx.Request) -> httpx.Response:
    """What the transport's caller gets for a call that failed (see the module doc)."""
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
    raise httpx_error_for(error, request)


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


def replay(stream: Stream[Any], request: httpx.Request) -> Iterator[bytes]:
    """The bytes read while deciding the stream had started, then the rest; errors
    as the caller's library's (``request``'s)."""
    state = stream._state
    if state.done:  # the whole stream came while it was starting
        state.passed_through()
    yield from state.raw_prefix  # decoded already, while the stream was starting
    try:
        # Each read ends by the call's deadline: the connection keeps it.
        for chunk in stream._bytes:
            state.passing_through(chunk)
            yield chunk
    except transport_errors() as exc:
        state.passed_through(cut=exc)
        raise in_library_of(request, exc) from None
    except StormguardError as error:  # past the cap or the deadline
        raise httpx_error_for(error, request) from error
    state.passed_through()


async def areplay(stream: AsyncStream[Any], request: httpx.Request) -> AsyncIterator[bytes]:
    """The async twin of :func:`replay`; each read ends by the call's deadline."""
    state = stream._state
    if state.done:  # the whole stream came while it was starting
        state.passed_through()
    for chunk in state.raw_prefix:  # decoded already, while the stream was starting
        yield chunk
    pieces, deadline = stream._bytes, state.call.deadline
    lib = library_of(request)
    try:
        while True:
            left = deadline.remaining()
            try:
                with anyio.fail_after(left if math.isfinite(left) else None):
                    chunk = await pieces.__anext__()
            except StopAsyncIteration:
                break
            except TimeoutError:
                # What passed: the call's deadline, or a stream bound (max_duration).
                passed = deadline.passed
                raise lib.ReadTimeout(
                    f"{passed[0].upper()}{passed[1:]} during the stream", request=request
                ) from None
            state.passing_through(chunk)
            yield chunk
    except transport_errors() as exc:
        state.passed_through(cut=exc)
        raise in_library_of(request, exc) from None
    except StormguardError as error:  # past the cap or the deadline
        raise httpx_error_for(error, request) from error
    state.passed_through()


class _ReplayStream(httpx.SyncByteStream):
    """:func:`replay` as httpx's byte stream."""

    def __init__(self, stream: Stream[Any], request: httpx.Request) -> None:
        self._stream, self._request = stream, request

    def __iter__(self) -> Iterator[bytes]:
        return replay(self._stream, self._request)

    def close(self) -> None:
        self._stream.close()


class _AsyncReplayStream(httpx.AsyncByteStream):
    def __init__(self, stream: AsyncStream[Any], request: httpx.Request) -> None:
        self._stream, self._request = stream, request

    def __aiter__(self) -> AsyncIterator[bytes]:
        return areplay(self._stream, self._request)

    async def aclose(self) -> None:
        await self._stream.aclose()


def stream_response(
    stream: Stream[Any] | AsyncStream[Any], request: httpx.Request, byte_stream: object
) -> httpx.Response:
    """The caller's response for a started stream: the server's status and headers
    (less those of the encoded bytes), ``byte_stream`` as its body."""
    upstream = stream.response
    headers = [
        (k, v)
        for k, v in upstream.headers.multi_items()
        if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")
    ]
    response_type: type[httpx.Response] = library_of(request).Response
    return response_type(
        upstream.status_code,
        headers=headers,
        stream=byte_stream,  # type: ignore[arg-type]
        request=request,
    )


def plain_response(result: httpx.Response, request: httpx.Request) -> httpx.Response:
    """A read response handed on as is, or rebuilt by the caller's library."""
    if isinstance(result, library_of(request).Response):
        return cast("httpx.Response", result)
    return read_response(result, result.content, request)


def handle(
    client: Client, request: httpx.Request, byte_stream: Callable[[Stream[Any]], object]
) -> httpx.Response:
    """One request of the transport's caller, run as a logical call (module doc)."""
    try:
        result = client._request(spec_from_request(client._core, request))
    except StormguardError as error:
        return response_for_error(error, request)
    if isinstance(result, Stream):
        return stream_response(result, request, byte_stream(result))
    assert isinstance(result, response_types())
    return plain_response(result, request)


async def ahandle(
    client: AsyncClient,
    request: httpx.Request,
    byte_stream: Callable[[AsyncStream[Any]], object],
) -> httpx.Response:
    """The async twin of :func:`handle`."""
    try:
        result = await client._request(spec_from_request(client._core, request))
    except StormguardError as error:
        return response_for_error(error, request)
    if isinstance(result, AsyncStream):
        return stream_response(result, request, byte_stream(result))
    assert isinstance(result, response_types())
    return plain_response(result, request)


class StormguardTransport(httpx.BaseTransport):
    """An httpx transport whose every request runs stormguard's call pipeline."""

    #: The byte stream a started stream is replayed through (its library's class).
    replay_stream: type[_ReplayStream] = _ReplayStream

    def __init__(self, client: Client) -> None:
        self._client = client

    @property
    def client(self) -> Client:
        """The stormguard client behind the transport (``stats()``, budget)."""
        return self._client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return handle(self._client, request, lambda s: self.replay_stream(s, request))

    def close(self) -> None:
        self._client.close()


class AsyncStormguardTransport(httpx.AsyncBaseTransport):
    """The async twin of :class:`StormguardTransport`."""

    replay_stream: type[_AsyncReplayStream] = _AsyncReplayStream

    def __init__(self, client: AsyncClient) -> None:
        self._client = client

    @property
    def client(self) -> AsyncClient:
        return self._client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await ahandle(self._client, request, lambda s: self.replay_stream(s, request))

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._client.close()


#: Which HTTP library's client :func:`httpx_client` returns: ``"openai"``, the one
#: the installed openai-python runs on (httpx2 from openai 3.x on, httpx before it);
#: or ``"httpx"``/``"httpx2"`` by name.
Library = Literal["openai", "httpx", "httpx2"]


def openai_http_library() -> str:
    """``"httpx2"`` when the installed openai-python is 3.x or later (it runs on
    httpx2), else ``"httpx"``; stormguard's own library when openai is not installed."""
    openai = sys.modules.get("openai")
    version = getattr(openai, "__version__", None)
    if not isinstance(version, str):
        import importlib.metadata  # slow to import; only needed when openai is not loaded

        try:
            version = importlib.metadata.version("openai")
        except importlib.metadata.PackageNotFoundError:
            return httpx.__name__
    major = version.split(".", 1)[0]
    return "httpx2" if major.isdigit() and int(major) >= 3 else "httpx"


def _library(library: Library) -> str:
    name = openai_http_library() if library == "openai" else library
    if name not in ("httpx", "httpx2"):
        raise ValueError(f"library must be 'openai', 'httpx' or 'httpx2', got {library!r}")
    if importlib.util.find_spec(name) is None:
        raise ImportError(
            f"stormguard.httpx_client(library={library!r}) needs {name}: pip install {name}"
        )
    return name


def _check_transport_options(options: Mapping[str, object]) -> None:
    """Options that mean nothing under openai-python, refused rather than ignored."""
    if options.get("openai_errors"):
        raise TypeError(
            "openai_errors applies to stormguard's Client: under httpx_client, openai-python"
            " raises its own errors from the responses and httpx errors the transport hands it"
        )


@overload
def httpx_client(
    *, library: Literal["openai", "httpx2"] = ..., **options: Unpack[ClientOptions]
) -> httpx2.Client: ...
@overload
def httpx_client(
    *, library: Literal["httpx"], **options: Unpack[ClientOptions]
) -> httpx.Client: ...
def httpx_client(
    *, library: Library = "openai", **options: Unpack[ClientOptions]
) -> httpx.Client | httpx2.Client:
    """A client of the HTTP library openai-python runs on (``library="openai"``:
    httpx2 from openai 3.x on, httpx before it), whose transport runs the whole
    stormguard pipeline; give it to ``openai.OpenAI(http_client=..., max_retries=0)``.
    ``library="httpx"`` or ``"httpx2"`` asks for one by name. Options as for
    ``Client``."""
    _check_transport_options(options)
    client = Client(**options)
    if _library(library) == "httpx2":
        from ._httpx2_transport import httpx2_client

        return httpx2_client(client)
    # No timeout of its own: the pipeline gives every attempt its share of the
    # call's deadline.
    return httpx.Client(transport=StormguardTransport(client), timeout=None)


@overload
def async_httpx_client(
    *, library: Literal["openai", "httpx2"] = ..., **options: Unpack[ClientOptions]
) -> httpx2.AsyncClient: ...
@overload
def async_httpx_client(
    *, library: Literal["httpx"], **options: Unpack[ClientOptions]
) -> httpx.AsyncClient: ...
def async_httpx_client(
    *, library: Library = "openai", **options: Unpack[ClientOptions]
) -> httpx.AsyncClient | httpx2.AsyncClient:
    """The async twin of :func:`httpx_client`, for ``openai.AsyncOpenAI``."""
    _check_transport_options(options)
    client = AsyncClient(**options)
    if _library(library) == "httpx2":
        from ._httpx2_transport import async_httpx2_client

        return async_httpx2_client(client)
    return httpx.AsyncClient(transport=AsyncStormguardTransport(client), timeout=None)
