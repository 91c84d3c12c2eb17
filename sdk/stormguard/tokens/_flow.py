"""I/O-free flows and their two drivers: the only place where the pre-check's sync
and async differ.

A flow is a generator in the style of httpx's ``Auth.auth_flow``: it yields the
``httpx.Request`` it needs, is sent back the ``httpx.Response`` (or None when the
lookup failed: refused, timed out, reset, a body over the size cap), and finally
returns its result. The logic is written once; the drivers only do the I/O.
A lookup that the *call's* deadline cut short (the caller's patience ran out, not
the lookup's own timeout) also comes back as None, marked :func:`abandoned`: it
says nothing about the server, so the flow falls back without marking it down.

Every lookup is held to a deadline, the call's own when a client runs the
pre-check: a request's ``timeout`` extension (``lookup_timeout``) bounds the
whole exchange, not each socket operation, and is cut to what is left of the
call. The body is read streamed and decoded in bounded steps (``_io/body.py``)
within the same size cap as a call's response, so a server that never answers,
drips its headers or sends a gzip bomb costs the call at most its deadline and
the cap, and the pre-check falls back as when the server cannot tell.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import TypeVar

import anyio

from .._core.clock import Clock
from .._core.deadline import Deadline
from .._core.http import http_errors, httpx
from .._io.body import (
    ACCEPT_ENCODING,
    DEFAULT_MAX_RESPONSE_BYTES,
    BodyLimit,
    BodyTooLargeError,
    aiter_body,
    iter_body,
    read_response,
)

__all__ = [
    "MAX_LOOKUP_ENDPOINTS",
    "Flow",
    "abandoned",
    "drive_precheck_async",
    "drive_precheck_sync",
    "models_url",
    "run_precheck_async",
    "run_precheck_sync",
    "tokenize_url",
]

T = TypeVar("T")

Flow = Generator[httpx.Request, "httpx.Response | None", T]

_ABANDONED = "stormguard.abandoned"
#: Endpoints whose lookup results a policy remembers (a tokenize endpoint's outage,
#: a model list): past it the oldest goes, so clients of ever new addresses sharing
#: one ``TokenPolicy`` do not grow it without end.
MAX_LOOKUP_ENDPOINTS = 1024


def _gave_up_errors() -> tuple[type[Exception], ...]:
    """What ends a lookup without an answer: the HTTP library, a body too large,
    the time allowed."""
    return http_errors(BodyTooLargeError, TimeoutError)


def abandoned(request: httpx.Request) -> bool:
    """Whether the lookup of ``request`` came back None because the call's own
    deadline ran out first: no verdict on the server that was asked."""
    return bool(request.extensions.get(_ABANDONED))


def _judge(
    request: httpx.Request, response: httpx.Response | None, bound: Deadline | None, call: Deadline
) -> httpx.Response | None:
    """Mark a lookup that failed because the call's deadline ended it as abandoned."""
    if response is None and (bound is None or (bound is call and call.expired)):
        request.extensions[_ABANDONED] = True
    return response


def run_precheck_sync(
    flow: Flow[T],
    client: httpx.Client,
    *,
    timeout: float | None = None,
    max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> T:
    """Drive ``flow`` with a sync client. ``timeout``: the most all its lookups
    together may take (None: each its own timeout); ``max_bytes``: the cap on one
    lookup's body. A failed lookup is sent in as None."""
    return drive_precheck_sync(flow, client, Deadline(Clock(), timeout), max_bytes)


async def run_precheck_async(
    flow: Flow[T],
    client: httpx.AsyncClient,
    *,
    timeout: float | None = None,
    max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
) -> T:
    """Drive ``flow`` with an async client (see :func:`run_precheck_sync`)."""
    return await drive_precheck_async(flow, client, Deadline(Clock(), timeout), max_bytes)


def drive_precheck_sync(
    flow: Flow[T], client: httpx.Client, deadline: Deadline, max_bytes: int
) -> T:
    """:func:`run_precheck_sync` within a call's ``deadline``."""
    try:
        request = next(flow)
        while True:
            bound = _lookup_bound(request, deadline)
            response = None if bound is None else _lookup_sync(client, request, bound, max_bytes)
            request = flow.send(_judge(request, response, bound, deadline))
    except StopIteration as stop:
        result: T = stop.value
        return result


async def drive_precheck_async(
    flow: Flow[T], client: httpx.AsyncClient, deadline: Deadline, max_bytes: int
) -> T:
    """:func:`run_precheck_async` within a call's ``deadline``."""
    try:
        request = next(flow)
        while True:
            bound = _lookup_bound(request, deadline)
            response = (
                None if bound is None else await _lookup_async(client, request, bound, max_bytes)
            )
            request = flow.send(_judge(request, response, bound, deadline))
    except StopIteration as stop:
        result: T = stop.value
        return result


def _lookup_bound(request: httpx.Request, deadline: Deadline) -> Deadline | None:
    """The deadline of one lookup: its own timeout, cut to ``deadline``; None when
    there is no time left for it. Each socket operation gets what is left too."""
    own = (request.extensions.get("timeout") or {}).get("read")
    bound = deadline.within(own if isinstance(own, (int, float)) else None)
    if bound.expired:
        return None
    left = bound.remaining()
    request.extensions["timeout"] = httpx.Timeout(left if math.isfinite(left) else None).as_dict()
    return bound


def _lookup_sync(
    client: httpx.Client, request: httpx.Request, bound: Deadline, max_bytes: int
) -> httpx.Response | None:
    chunks: list[bytes] = []
    with bound.bound():  # every socket operation ends by it (``_io/deadline_transport.py``)
        try:
            response = client.send(_with_client_headers(request, client.headers), stream=True)
        except http_errors():
            return None
        try:
            limit = BodyLimit(max_bytes, response)
            for piece in iter_body(response):
                limit.add(len(piece))
                if bound.expired:
                    return None
                chunks.append(piece)
        except http_errors(BodyTooLargeError):
            return None
        finally:
            response.close()
    return read_response(response, b"".join(chunks))


async def _lookup_async(
    client: httpx.AsyncClient, request: httpx.Request, bound: Deadline, max_bytes: int
) -> httpx.Response | None:
    left = bound.remaining()
    chunks: list[bytes] = []
    try:
        with anyio.fail_after(left if math.isfinite(left) else None):
            response = await client.send(_with_client_headers(request, client.headers), stream=True)
            try:
                limit = BodyLimit(max_bytes, response)
                async for piece in aiter_body(response):
                    limit.add(len(piece))
                    if bound.expired:
                        return None
                    chunks.append(piece)
            finally:
                with anyio.CancelScope(shield=True):
                    await response.aclose()
    except _gave_up_errors():
        return None
    return read_response(response, b"".join(chunks))


def _with_client_headers(request: httpx.Request, defaults: httpx.Headers) -> httpx.Request:
    # client.send() applies the client's auth but not its default headers (an
    # api-key header, for instance), so the drivers add those the flow did not set;
    # the encodings are the ones decoded in bounded steps.
    request.headers.setdefault("accept-encoding", ACCEPT_ENCODING)
    for key, value in defaults.multi_items():
        if key not in request.headers:
            request.headers[key] = value
    return request


def models_url(base_url: str | httpx.URL) -> httpx.URL:
    """``{base}/models``: the OpenAI-compatible model list under the API base."""
    url = httpx.URL(str(base_url))
    return url.copy_with(path=url.path.rstrip("/") + "/models", query=None)


def tokenize_url(base_url: str | httpx.URL) -> httpx.URL:
    """``/tokenize`` at the server root: vLLM mounts it beside ``/v1``, not under it."""
    url = httpx.URL(str(base_url))
    path = url.path.rstrip("/")
    path = path.removesuffix("/v1")
    return url.copy_with(path=path + "/tokenize", query=None)
