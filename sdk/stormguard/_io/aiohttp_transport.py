"""The async client's own pool on aiohttp: an httpx transport over one
``aiohttp.ClientSession`` (``AsyncClient(http_backend="aiohttp")``).

At a thousand calls in flight, httpx over httpcore's asyncio pool spends several
times the CPU per call that aiohttp does (docs/deploy.md, "The aiohttp backend").
This keeps everything above the transport as it is: the own pool
(``own_pool.own_pool``) makes one of these per environment proxy, per event loop and
per forked process (``pool_life.LoopTransport``), and the call sees httpx requests,
responses and errors. openai-python's ``DefaultAioHttpClient`` (the vendored
httpx_aiohttp) is the same idea; this one differs where stormguard needs it:

- the body is handed over as it came (``auto_decompress=False``): httpx's decoders
  run above, so ``max_response_bytes`` and the decompression-bomb guards count the
  decoded bytes exactly as on the httpx path; the request goes out with the headers
  the pipeline built and no others (no User-Agent, Accept or Accept-Encoding of
  aiohttp's own, no cookie jar: httpx's client keeps the cookies);
- each aiohttp failure is raised as the httpx error httpcore raises for the same
  event on the wire (``_mapped``), with its request, so the retry, breaker and
  limiter rules read it as today; aiohttp's timeouts, which are ``TimeoutError`` s,
  never reach the driver as the call's own deadline;
- a body closed before its end, or a send cancelled, closes its connection
  (``ClientResponse.close()``): the server sees the client leave and can abort the
  generation (vLLM aborts a request whose client disconnected); a body read to its
  end gives its connection back to the pool;
- no sharding: ``pool_shards`` exists because httpcore's pool scans all its
  connections on every request; aiohttp's connector takes an idle connection from a
  deque and wakes one waiter, whatever the pool's size.

aiohttp runs on asyncio only: off asyncio (trio) the transport hands every request
to httpx's own transport instead, made at its first request (``_off_asyncio``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from .._core.http import httpx
from .pool_life import keeping, running_loop
from .pool_shards import pool_transport

__all__ = ["AiohttpTransport", "aiohttp_pool"]

#: Headers aiohttp adds to a request that lacks them: a request carries those the
#: pipeline and httpx's client gave it, and no more (``Host`` it always has).
_NOT_ADDED = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
_HTTP_10 = (1, 0)


def _mapped(
    exc: BaseException, request: httpx.Request, response: aiohttp.ClientResponse | None = None
) -> httpx.TransportError:
    """The httpx error httpcore raises for the wire event aiohttp reported as ``exc``
    (while reading ``response``'s body, if given)."""
    error: type[httpx.TransportError]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        error = httpx.ConnectTimeout  # the pool wait or the connect (aiohttp's ``connect``)
    elif isinstance(exc, TimeoutError):  # SocketTimeoutError: no byte within ``sock_read``
        error = httpx.ReadTimeout
    elif isinstance(exc, aiohttp.ClientHttpProxyError):
        error = httpx.ProxyError  # the proxy refused the CONNECT
    elif isinstance(exc, aiohttp.ClientConnectorError):
        error = httpx.ConnectError  # refused, unresolvable, TLS handshake failed
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        error = httpx.RemoteProtocolError  # "Server disconnected without sending a response."
    elif isinstance(exc, aiohttp.ClientPayloadError):
        # The body ended early: a reset is httpcore's ReadError, a close before the
        # framing said the body ends (or a broken chunk) its RemoteProtocolError.
        error = httpx.ReadError if _reset(response) else httpx.RemoteProtocolError
    elif isinstance(exc, aiohttp.ClientConnectionResetError):
        error = httpx.WriteError  # the request written to a closing connection
    elif isinstance(exc, (aiohttp.ClientOSError, aiohttp.ClientConnectionError)):
        error = httpx.ReadError
    elif isinstance(exc, aiohttp.InvalidURL):
        error = httpx.UnsupportedProtocol
    else:  # ClientResponseError: a status line or header block aiohttp could not parse
        error = httpx.RemoteProtocolError
    return error(str(exc) or type(exc).__name__, request=request)


def _reset(response: aiohttp.ClientResponse | None) -> bool:
    """Whether ``response``'s connection was lost to a socket error (a reset), not
    closed by the server: aiohttp names the socket's error only in the message of the
    body's error, and keeps it on the connection's protocol."""
    connection = None if response is None else response.connection
    protocol = None if connection is None else connection.protocol
    lost = None if protocol is None else protocol.exception()
    return isinstance(lost, OSError) and not isinstance(lost, TimeoutError)


def _has_all(headers: CIMultiDict[str]) -> bool:
    """Whether ``headers`` has every header aiohttp would add (``_NOT_ADDED``)."""
    return (
        "Accept" in headers
        and "Accept-Encoding" in headers
        and "User-Agent" in headers
        and "Content-Type" in headers
    )


def _decoded(headers: httpx.Headers) -> list[tuple[str, str]]:
    """``headers`` as ``str`` s, in order, for aiohttp."""
    encoding = headers.encoding
    return [(key.decode(encoding), value.decode(encoding)) for key, _, value in headers._list]


def _headers(raw: tuple[tuple[bytes, bytes], ...]) -> httpx.Headers:
    """aiohttp's raw response headers as the ``httpx.Headers`` httpx builds from them
    (each name as sent, its lower case, the value), without httpx's check of each
    name and value for a ``str`` to encode: aiohttp's are ``bytes``."""
    headers = httpx.Headers()
    headers._list = [(name, name.lower(), value) for name, value in raw]
    return headers


class _Body(httpx.AsyncByteStream):
    """An aiohttp response's body as httpx reads it: each piece as it arrives, its
    failures as httpx's, and its close ending the connection unless it was read to
    its end (module doc)."""

    __slots__ = ("_request", "_response")

    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        try:
            piece = await self._response.content.readany()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _mapped(exc, self._request, self._response) from exc
        if not piece:
            raise StopAsyncIteration
        return piece

    async def aclose(self) -> None:
        response = self._response
        if response.content.is_eof():
            response.release()  # every byte arrived: the connection goes back to the pool
        else:
            response.close()  # the caller left early: the server must see it


class AiohttpTransport(httpx.AsyncBaseTransport):
    """httpx's ``AsyncHTTPTransport`` (``limits``, ``verify``, ``proxy``) on an
    ``aiohttp.ClientSession``, made on the event loop of its first request: the own
    pool makes one for each loop (module doc)."""

    def __init__(
        self,
        *,
        limits: httpx.Limits,
        verify: Any,
        proxy: str | None = None,
        fallback: Callable[[], httpx.AsyncBaseTransport] | None = None,
    ) -> None:
        self._limits = limits
        self._verify = verify
        self._proxy = URL(proxy) if proxy is not None else None
        self._session: aiohttp.ClientSession | None = None
        self._fallback_make = fallback
        #: httpx's transport, serving the requests of a loop that is not asyncio's.
        self.fallback: httpx.AsyncBaseTransport | None = None

    def _open(self) -> aiohttp.ClientSession:
        limits = self._limits
        connector = aiohttp.TCPConnector(
            limit=limits.max_connections or 0,  # 0: no limit, as httpx's None
            limit_per_host=0,
            keepalive_timeout=limits.keepalive_expiry,
            ssl=self._verify,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,  # the own pool reads the environment's proxies, once
            timeout=aiohttp.ClientTimeout(total=None),  # each request brings its own
        )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session
        if session is None:
            if self.fallback is not None or running_loop() is None:
                return await self._off_asyncio(request)
            session = self._open()
        try:
            body = request.content
        except httpx.RequestNotRead:  # a streamed body: not one the pipeline builds
            body = await request.aread()
        try:
            response = await self._sent(session, request, body)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _mapped(exc, request) from exc
        extensions: dict[str, Any] = {
            "http_version": b"HTTP/1.0" if response.version == _HTTP_10 else b"HTTP/1.1"
        }
        if response.reason:
            extensions["reason_phrase"] = response.reason.encode("latin-1", "replace")
        return httpx.Response(
            response.status,
            headers=_headers(response.raw_headers),
            stream=_Body(response, request),
            extensions=extensions,
        )

    def _sent(
        self, session: aiohttp.ClientSession, request: httpx.Request, body: bytes
    ) -> Awaitable[aiohttp.ClientResponse]:
        """aiohttp's request for ``request``. Its headers are built here, not in
        ``handle_async_request``, so that no copy of them stays alive while the call
        waits: aiohttp takes its own."""
        headers = CIMultiDict(_decoded(request.headers))
        timeout = request.extensions.get("timeout") or {}
        return session.request(
            request.method,
            # yarl caches what it parsed: a cache here keyed by the request's URL object
            # never hit, since each httpx.Request holds a URL of its own.
            URL(str(request.url), encoded=True),
            data=body or None,
            headers=headers,
            # aiohttp adds a header of these only when it is missing: the request has
            # all four as a rule, and then no per-request set of names to skip is built.
            skip_auto_headers=None if _has_all(headers) else _NOT_ADDED,
            allow_redirects=False,
            proxy=self._proxy,
            timeout=aiohttp.ClientTimeout(
                total=None,
                # aiohttp's ``connect`` spans the wait for a pooled connection and
                # the connect, httpx's ``pool`` and ``connect`` one each.
                connect=timeout.get("pool"),
                sock_connect=timeout.get("connect"),
                sock_read=timeout.get("read"),
            ),
            server_hostname=request.extensions.get("sni_hostname"),
        )

    async def _off_asyncio(self, request: httpx.Request) -> httpx.Response:
        """``request`` sent by httpx's transport: this loop is not asyncio's."""
        if self.fallback is None:
            if self._fallback_make is None:
                raise RuntimeError(
                    "the aiohttp backend runs on asyncio only; this task runs elsewhere (trio?)"
                )
            self.fallback = self._fallback_make()
        return await self.fallback.handle_async_request(request)

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()
        if self.fallback is not None:
            await self.fallback.aclose()

    def sockets(self) -> list[Any]:
        """The sockets of the session's connections, idle and in use."""
        session = self._session
        connector = None if session is None else session.connector
        if connector is None:
            return []
        # aiohttp has no public list of its connections: its pool's own attributes.
        protocols = [proto for held in connector._conns.values() for proto, _ in held]
        protocols += list(connector._acquired)
        found = []
        for proto in protocols:
            transport = getattr(proto, "transport", None)
            sock = None if transport is None else transport.get_extra_info("socket")
            if sock is not None:
                found.append(sock)
        return found

    def forget(self) -> None:
        """Drop the session without any I/O: its sockets were let go of
        (``pool_life._let_go``), and its loop is closed or another process's. Nothing
        is sent or unregistered (a forked child shares its parent's epoll set), and
        aiohttp is told it is closed, so it warns of no unclosed session."""
        session, self._session = self._session, None
        if session is not None:
            connector = session.connector
            session.detach()
            if connector is not None:
                connector._closed = True


def aiohttp_pool(*, proxy: str | None, limits: httpx.Limits, verify: Any) -> AiohttpTransport:
    """The transport ``own_pool`` makes for the aiohttp backend (``shard=False``), and
    httpx's own, sharded (``pool_shards.py``), for a loop that is not asyncio's."""
    return AiohttpTransport(
        limits=limits,
        verify=verify,
        proxy=proxy,
        fallback=lambda: keeping(
            pool_transport(
                lambda each: httpx.AsyncHTTPTransport(proxy=proxy, limits=each, verify=verify),
                limits,
            )
        ),
    )
