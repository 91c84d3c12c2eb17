"""The pool a client builds for itself, and the short way its attempts take through it.

``httpx.Client.send`` does for every request what an attempt on the pool a client
built for itself never needs: the auth flow, the redirect loop, the event hooks,
the choice of a transport for the URL among the mounts, cookie extraction into an
empty jar, and a log line. On this project's benchmark machine that is about
65 µs of a 390 µs call to a zero-latency server (docs/benchmarks.md, "Per-call
overhead"). ``OwnClient`` and ``OwnAsyncClient`` are httpx's own clients (as
openai-python subclasses them for its default client) whose ``send`` hands a
request straight to the transport when none of that applies: the pool routes
every URL to one transport (no environment proxy mounted; ``NO_PROXY`` alone
mounts none), no auth or redirect setting is asked for (the pool's own are
httpx's defaults, and nothing changes them), the jar is empty, and the caller
reads the body as a stream.
The response is what ``send`` gives: its ``request``, its ``elapsed`` once closed,
an error that names its request, and the cookies it sets kept for the requests
after it (which then take httpx's own way). Anything else goes to httpx's ``send``.

Its transports are made for the process, and (async) the event loop, that use them
(``pool_life.py``): a forked child, or another event loop, gets a pool of its own.

A client given your own ``http_client`` never uses these: it is sent through as it is.
"""

from __future__ import annotations

import datetime
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any, TypeVar

from .._core import fork as _fork
from .._core.http import httpx
from .pool_life import LoopTransport, ProcessTransport
from .pool_shards import pool_transport

__all__ = ["OwnAsyncClient", "OwnClient", "attempt_request", "own_pool"]

_DEFAULT = httpx.USE_CLIENT_DEFAULT


class _Timed:
    """Sets its response's ``elapsed`` when the body is closed, as httpx's client does."""

    __slots__ = ("_response", "_start", "_stream")

    def __init__(self, stream: Any, response: httpx.Response, start: float) -> None:
        self._stream = stream
        self._response: httpx.Response | None = response
        self._start = start

    def _stop(self) -> None:
        # The response holds this stream: let go of it once closed, so the two are
        # freed by their reference counts, not by the cyclic GC.
        response, self._response = self._response, None
        if response is not None:
            response.elapsed = datetime.timedelta(seconds=time.perf_counter() - self._start)


class _TimedStream(_Timed, httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        return iter(self._stream)  # the body's own iterator: no generator per chunk

    def close(self) -> None:
        self._stop()
        self._stream.close()


class _TimedAsyncStream(_Timed, httpx.AsyncByteStream):
    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._stream.__aiter__()  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        self._stop()
        await self._stream.aclose()


def _direct(
    client: httpx.Client | httpx.AsyncClient,
    request: httpx.Request,
    transport: Any,
    stream: bool,
    auth: object,
    follow_redirects: object,
) -> Any:
    """The transport to hand this request to, or None: httpx's own ``send``."""
    if transport is None or not stream or client.is_closed or client.cookies:
        return None
    if auth is not _DEFAULT or follow_redirects is not _DEFAULT:
        return None
    # Credentials in the URL become httpx's basic auth in its own send.
    return None if request.url.userinfo else transport


def _straight(transport: Any, mounts: Mapping[str, Any]) -> Any:
    """The transport every URL goes to, or None when a mount sends some elsewhere (a
    ``None`` mount, the form ``NO_PROXY`` takes, means this very transport)."""
    return transport if all(mount is None for mount in mounts.values()) else None


def _received(
    client: httpx.Client | httpx.AsyncClient,
    request: httpx.Request,
    response: httpx.Response,
    timed: type[_TimedStream | _TimedAsyncStream],
    start: float,
) -> httpx.Response:
    """``response`` as httpx's client hands it over: its request, its body timed,
    the cookies it sets kept."""
    response.stream = timed(response.stream, response, start)
    response.request = request
    if response.headers.get_list("set-cookie"):  # no KeyError raised and caught per call
        client.cookies.extract_cookies(response)
    return response


class _AttemptRequests:
    """``attempt_request`` without parsing the same URL and normalising the same
    headers again for every attempt."""

    headers: httpx.Headers

    def _cache_init(self) -> None:
        #: Each URL parsed, with the ``Host`` header the library gives a request to it.
        self._urls: dict[str, tuple[httpx.URL, list[tuple[bytes, bytes, bytes]]]] = {}
        # Keyed by the id of a ``base`` the entry holds: that id names no other object;
        # with the names of the merged headers (lower case, encoded).
        self._merged: dict[int, tuple[Mapping[str, str], httpx.Headers, frozenset[bytes]]] = {}

    def _cached_request(
        self,
        method: str,
        url: str,
        content: bytes | None,
        base: Mapping[str, str],
        headers: Mapping[str, str],
        extensions: dict[str, Any],
    ) -> httpx.Request:
        known = self._urls.get(url)
        if known is None:
            if len(self._urls) >= _CACHED:
                self._urls.clear()
            parsed = httpx.URL(url)
            # The library's own Host header for the URL (none without a host).
            host = httpx.Request("GET", parsed).headers._list[:1]
            known = self._urls[url] = (parsed, host)
        parsed, host = known
        cached = self._merged.get(id(base))
        if cached is None:
            if len(self._merged) >= _CACHED:
                self._merged.clear()
            merged = httpx.Headers(self.headers)
            merged.update(base)
            names = frozenset(lower for _, lower, _ in merged._list)
            cached = self._merged[id(base)] = (base, merged, names)
        _, merged, names = cached
        merged = merged.copy()
        items = merged._list
        # What ``Headers.__setitem__`` does, without its scan of every header for a
        # name none of them has (the call's own: its attempt number, its deadline).
        encoding = merged._encoding or "utf-8"
        added: set[bytes] = set()
        for name, value in headers.items():
            raw = name.encode(encoding)
            lower = raw.lower()
            if lower in names or lower in added:
                merged[name] = value  # replaces the one there, in its place
            else:
                added.add(lower)
                items.append((raw, lower, value.encode(encoding)))
        # What ``httpx.Request(content=...)`` adds, added here: its constructor copies
        # the headers twice more and looks each of these names up (about a tenth of an
        # async call's CPU). Only where httpx and httpx2 agree: the two methods the
        # pipeline sends, none of the three headers set already; else their own way.
        if method not in _PLAIN or any(name in _AUTOMATIC for _, name, _ in items):
            return httpx.Request(
                method, parsed, content=content, headers=merged, extensions=extensions
            )
        if content:
            items.append((b"Content-Length", b"content-length", str(len(content)).encode()))
            items[:0] = host
        elif method == "POST":
            items[:0] = [*host, (b"Content-Length", b"content-length", b"0")]
        else:
            items[:0] = host
        request = httpx.Request(
            method, parsed, stream=httpx.ByteStream(content or b""), extensions=extensions
        )
        request.headers = merged
        request.read()  # as the constructor does for a body in bytes
        return request


def attempt_request(
    http: httpx.Client | httpx.AsyncClient,
    method: str,
    url: str,
    *,
    content: bytes | None,
    base: Mapping[str, str],
    headers: Mapping[str, str],
    extensions: dict[str, Any],
) -> httpx.Request:
    """The request ``http.build_request(method, url, content=..., headers={**base,
    **headers}, extensions=...)`` builds, ``extensions`` holding its ``timeout``. On
    the client's own pool, with no cookie or query parameter of its own to merge,
    it is built from a cached URL and ``base`` normalised once per client (so
    ``base`` must not change once given): the same headers, each of ``headers``
    replacing one of the same name in any case (one the pool's defaults have keeps
    its place among them)."""
    if isinstance(http, _AttemptRequests) and not http.cookies and not http.params:
        return http._cached_request(method, url, content, base, headers, extensions)
    return http.build_request(
        method, url, content=content, headers={**base, **headers}, extensions=extensions
    )


#: Entries each cache of ``_AttemptRequests`` holds before it starts over: a client
#: has a few URLs (its endpoints' paths) and one header set per ``with_options``.
_CACHED = 256
#: The methods whose requests ``_cached_request`` completes itself, and the headers
#: that, set by the call, leave it to the library (``host``: a discovered address).
_PLAIN = ("GET", "POST")
_AUTOMATIC = (b"host", b"content-length", b"transfer-encoding")


class OwnClient(_AttemptRequests, httpx.Client):
    """``httpx.Client`` on ``transport`` (and ``mounts``), whose streamed sends skip
    what the pool does not need (module doc)."""

    def __init__(
        self, *, transport: httpx.BaseTransport, mounts: Mapping[str, httpx.BaseTransport | None]
    ) -> None:
        super().__init__(transport=transport, mounts=mounts)
        self._straight = _straight(transport, mounts)
        self._cache_init()

    def send(
        self,
        request: httpx.Request,
        *,
        stream: bool = False,
        auth: Any = _DEFAULT,
        follow_redirects: Any = _DEFAULT,
    ) -> httpx.Response:
        transport = _direct(self, request, self._straight, stream, auth, follow_redirects)
        if transport is None:
            return super().send(
                request, stream=stream, auth=auth, follow_redirects=follow_redirects
            )
        start = time.perf_counter()
        try:
            response: httpx.Response = transport.handle_request(request)
        except httpx.RequestError as exc:
            exc.request = request
            raise
        return _received(self, request, response, _TimedStream, start)


class OwnAsyncClient(_AttemptRequests, httpx.AsyncClient):
    """The async twin of :class:`OwnClient`."""

    def __init__(
        self,
        *,
        transport: httpx.AsyncBaseTransport,
        mounts: Mapping[str, httpx.AsyncBaseTransport | None],
    ) -> None:
        super().__init__(transport=transport, mounts=mounts)
        self._straight = _straight(transport, mounts)
        self._cache_init()

    async def send(
        self,
        request: httpx.Request,
        *,
        stream: bool = False,
        auth: Any = _DEFAULT,
        follow_redirects: Any = _DEFAULT,
    ) -> httpx.Response:
        transport = _direct(self, request, self._straight, stream, auth, follow_redirects)
        if transport is None:
            return await super().send(
                request, stream=stream, auth=auth, follow_redirects=follow_redirects
            )
        start = time.perf_counter()
        try:
            response: httpx.Response = await transport.handle_async_request(request)
        except httpx.RequestError as exc:
            exc.request = request
            raise
        return _received(self, request, response, _TimedAsyncStream, start)


_Own = TypeVar("_Own", OwnClient, OwnAsyncClient)
_T = TypeVar("_T")


def _environment_proxies() -> dict[str, str | None]:
    """``HTTP(S)_PROXY``/``ALL_PROXY``/``NO_PROXY`` as httpx (httpx2) reads them (a
    client given a transport reads none of them itself)."""
    utils = sys.modules.get(f"{httpx.__name__}._utils")
    read = getattr(utils, "get_environment_proxies", None)
    return dict(read()) if callable(read) else {}


def _proxy_mounts(transport_for: Callable[[str], _T]) -> dict[str, _T | None]:
    """The environment's proxies as a client's ``mounts``: ``transport_for(proxy
    URL)`` for each pattern a proxy serves, None for those ``NO_PROXY`` exempts."""
    return {
        pattern: None if url is None else transport_for(url)
        for pattern, url in _environment_proxies().items()
    }


def own_pool(
    client: type[_Own], make: Callable[..., Any], limits: httpx.Limits, *, shard: bool = True
) -> _Own:
    """``client`` on the transports ``make(proxy=, limits=, verify=)`` builds (an httpx
    ``HTTPTransport`` class or a subclass): one for direct requests and one for each
    proxy of the environment, each split into shards of ``limits`` (``pool_shards.py``;
    not with ``shard=False``: the aiohttp transport, whose pool needs none),
    all on one TLS context (each transport would load the CA bundle for its own,
    about 20 ms), and each made again for a forked child (and, async, for each event
    loop: ``pool_life.py``). A forked child makes its own TLS context too: the locks of
    the parent's (its session cache, its certificate store) may have been held by a
    thread in a handshake at the fork, and nothing in the child would release them.
    OpenSSL's global locks are beyond reach: docs/deploy.md says when to fork."""
    contexts: dict[int, Any] = {}

    def tls() -> Any:
        context = contexts.get(_fork.forks)
        if context is None:
            contexts.clear()
            context = contexts[_fork.forks] = httpx.create_ssl_context()
        return context

    local = ProcessTransport if issubclass(client, OwnClient) else LoopTransport

    def transport(proxy: str | None = None) -> Any:
        if not shard:
            return local(lambda: make(proxy=proxy, limits=limits, verify=tls()))
        return local(
            lambda: pool_transport(
                lambda each: make(proxy=proxy, limits=each, verify=tls()), limits
            )
        )

    return client(transport=transport(), mounts=_proxy_mounts(transport))
