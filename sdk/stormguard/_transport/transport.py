"""The whole pipeline as an HTTP transport, for code that uses openai-python.

    client = openai.OpenAI(
        base_url="http://127.0.0.1:8000/v1",
        http_client=stormguard.httpx_client(base_url="http://127.0.0.1:8000/v1"),
    )  # openai's max_retries needs no change: its retries never stack on stormguard's

``httpx_client()`` returns a client of the library the installed openai-python runs
on (``_transport/clients.py``). What the caller gets back (responses, streams,
errors) is of its client's library, whichever one carries the pipeline's own
requests (``_core/http.py``).

Each request openai-python sends becomes one logical stormguard call (chat,
completions, embeddings and responses are known by their path: their spans,
pre-check and stream ends; any other request is protected all the same): token
pre-check, breaker, endpoint choice, budgeted retries with backoff and
Retry-After, fallback models. What comes back is plain httpx (or httpx2):

* a success is the server's response (a stream is replayed from its first
  bytes, which stormguard read to know the stream had started);
* a final error status is the last error response as the server sent it, so
  openai-python raises its own ``RateLimitError``/``InternalServerError``, with
  ``x-should-retry: false`` added: stormguard retried it within its policy and
  budget, or judged it not worth a retry, and openai-python obeys that header
  over the status it would retry, so its retries never stack on stormguard's;
* a refusal before any I/O is a synthesized response that says so in
  openai's error format, with ``x-should-retry: false`` (an open breaker: 503
  ``x-load-shed: circuit_open``; a context-window refusal: 400; the token rate
  limit: 429; a full local queue or adaptive throttling: 503);
* a 2xx that breaks the API before any of it was handed on (a stream that is
  not an event stream, a first event that is not JSON) is a 502 in the same
  format, with the reason, as a proxy answers for an upstream's invalid answer;
* a failure with no response to hand on (a refused connection, a timeout, no
  concurrency slot before the deadline, a stream cut before its first event) is
  raised. To openai-python (a request with ``x-stainless-retry-count``) it is
  the call's own error, in the class that is also openai's
  (``stormguard.openai_errors``: ``APITimeoutError``, ``APIConnectionError`` ...):
  openai-python 2.x and 3.x hand an ``OpenAIError`` raised under them on as it
  is, with no retry of their own. 1.x retries it; its retry, the same request
  with the next ``x-stainless-retry-count``, is answered with the same failure
  and sends nothing (``_transport/retries.py``). To any other caller it is the
  httpx exception it was (as the caller's library's class of that name, when
  the other library carried it), or a ``ReadTimeout``/``ReadError``.

The call's deadline bounds what the caller reads of a stream too: the replayed
stream raises ``httpx.ReadTimeout`` when the deadline passes (sync: at the
socket read that would cross it; async: a bound on each read that waits), and
``httpx.DecodingError`` past ``max_response_bytes`` of decoded bytes; to
openai-python, again, the call's own error.

Every response the caller gets carries the call's ``stormguard.CallInfo`` in
``response.extensions["stormguard"]``: its attempts and their outcomes, the
server's load, the request id, the pre-check and, for a failure, the stop
reason (openai-python: ``client.chat.completions.with_raw_response.create(...)
.http_response.extensions``, or the response of the error it raises).

The pieces: ``_transport/spec.py`` (a request as one call),
``_transport/answers.py`` (the call's outcome as the caller's response or
exception), ``_transport/replay.py`` (a started stream's bytes),
``_transport/retries.py`` (openai-python's own retry of a failure, answered),
``_transport/httpx2.py`` (the transports on httpx2's base classes),
``_transport/clients.py`` (the clients built on the transports, of either
library); this module holds the transports.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from .._call.streaming import AsyncStream, Stream
from .._client.async_client import AsyncClient
from .._client.client import Client
from .._core.exceptions import StormguardError
from .._core.http import httpx, response_types
from .answers import httpx_error_for, plain_response, response_for_error, stream_response
from .replay import _AsyncReplayStream, _ReplayStream
from .retries import FailedCalls
from .spec import spec_from_request

__all__ = ["AsyncStormguardTransport", "StormguardTransport", "pipeline_of"]


def handle(
    client: Client,
    request: httpx.Request,
    byte_stream: Callable[[Stream[Any]], object],
    failed: FailedCalls,
) -> httpx.Response:
    """One request of the transport's caller, run as a logical call (module doc);
    openai-python's retry of one that failed here is answered from ``failed``."""
    answered = failed.answer(request)
    if answered is not None:
        raise answered
    spec = spec_from_request(client._core, request)
    try:
        result = client._request(spec)
    except StormguardError as error:
        return _failed(failed, error, request, spec.model)
    if isinstance(result, Stream):
        return stream_response(result, request, byte_stream(result))
    assert isinstance(result, response_types())
    return plain_response(result, request)


async def ahandle(
    client: AsyncClient,
    request: httpx.Request,
    byte_stream: Callable[[AsyncStream[Any]], object],
    failed: FailedCalls,
) -> httpx.Response:
    """The async twin of :func:`handle`."""
    answered = failed.answer(request)
    if answered is not None:
        raise answered
    spec = spec_from_request(client._core, request)
    try:
        result = await client._request(spec)
    except StormguardError as error:
        return _failed(failed, error, request, spec.model)
    if isinstance(result, AsyncStream):
        return stream_response(result, request, byte_stream(result))
    assert isinstance(result, response_types())
    return plain_response(result, request)


def _failed(
    failed: FailedCalls, error: StormguardError, request: httpx.Request, model: str | None
) -> httpx.Response:
    """The answer to a call that failed (``response_for_error``); a failure raised to
    openai-python is remembered for its own retries (``_transport/retries.py``)."""
    try:
        return response_for_error(error, request, model)
    except StormguardError:
        failed.remember(request, httpx_error_for(error, request))
        raise


class StormguardTransport(httpx.BaseTransport):
    """An httpx transport whose every request runs stormguard's call pipeline."""

    #: The byte stream a started stream is replayed through (its library's class).
    replay_stream: type[_ReplayStream] = _ReplayStream

    def __init__(self, client: Client) -> None:
        self._client = client
        self._failed = FailedCalls(client._core.clock)

    @property
    def client(self) -> Client:
        """The stormguard client behind the transport (``stats()``, budget)."""
        return self._client

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return handle(self._client, request, lambda s: self.replay_stream(s, request), self._failed)

    def close(self) -> None:
        self._client.close()


class AsyncStormguardTransport(httpx.AsyncBaseTransport):
    """The async twin of :class:`StormguardTransport`."""

    replay_stream: type[_AsyncReplayStream] = _AsyncReplayStream

    def __init__(self, client: AsyncClient) -> None:
        self._client = client
        self._failed = FailedCalls(client._core.clock)

    @property
    def client(self) -> AsyncClient:
        return self._client

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await ahandle(
            self._client, request, lambda s: self.replay_stream(s, request), self._failed
        )

    async def aclose(self) -> None:
        with anyio.CancelScope(shield=True):
            await self._client.close()


def pipeline_of(http_client: object) -> Client | AsyncClient | None:
    """The stormguard client under an HTTP client this module made (None for any
    other): what ``stormguard.OpenAI`` shares with the copies openai's
    ``with_options`` makes over the same HTTP client."""
    transport = getattr(http_client, "_transport", None)
    if isinstance(transport, (StormguardTransport, AsyncStormguardTransport)):
        return transport.client
    return None
