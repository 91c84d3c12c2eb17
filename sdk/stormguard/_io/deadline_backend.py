"""The network backends of the client's own pools, on httpcore's ``NetworkBackend``
seam: :class:`DeadlineBackend` under :class:`~stormguard.DeadlineTransport`, whose
streams clip each socket operation to the current call's deadline (the design is
in ``deadline_transport.py``'s docstring), and :class:`KeptBackend` under the async
pool. Both keep the streams they made (``streams``), so that their pool can let
go of them in a forked child or for a closed event loop, and the sync one wake the
calls reading them when it is closed (``pool_life.py``).

A module of its own because its classes subclass httpcore's, and httpcore (with
h11 and h2 under it) is only needed once a connection pool is built: httpx
imports it then too. ``import stormguard`` therefore leaves it unloaded.
"""

from __future__ import annotations

import ipaddress
import queue
import socket
import ssl
import sys
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from .._core.deadline import Deadline, current_deadline
from .._core.http import httpcore

__all__ = [
    "DeadlineBackend",
    "DeadlineStream",
    "KeptBackend",
    "hold_transport",
    "keep_streams",
    "kept_backend",
]

#: The streams a backend made that are still referenced (by their connections).
Streams = weakref.WeakSet[Any]
_Stream = TypeVar("_Stream", bound=httpcore.NetworkStream)
_AsyncStream = TypeVar("_AsyncStream", bound=httpcore.AsyncNetworkStream)


class _Keeps:
    """What the two backends share: the streams they made, and whether their pool
    was closed (a connection made after that, by a call that was connecting at the
    close, is closed at once: it is in no pool any more, and nothing would wake a
    read on it)."""

    streams: Streams
    #: Set when the pool is closed (``pool_life.py``).
    closed = False
    _core: Any

    def _made(self, stream: _Stream) -> _Stream:
        if self.closed:
            stream.close()
            raise self._core.ConnectError("the connection pool was closed")
        return stream

    async def _amade(self, stream: _AsyncStream) -> _AsyncStream:
        if self.closed:
            await stream.aclose()
            raise self._core.ConnectError("the connection pool was closed")
        return stream


_PASSED = "the call's deadline passed"


def _passed(deadline: Deadline | None) -> str:
    """What passed: the call's deadline, or the stream bound it was moved to."""
    return _PASSED if deadline is None else deadline.passed


def _clip(
    deadline: Deadline | None, timeout: float | None, error: type[Exception], doing: str
) -> tuple[float | None, bool]:
    """The timeout of one socket operation under ``deadline``, and whether the
    deadline is what limits it; raises ``error`` when no time is left."""
    if deadline is None or deadline.timeout is None:
        return timeout, False
    left = deadline.remaining()
    if left <= 0.0:
        raise error(f"{_passed(deadline)} before {doing}")
    if timeout is None or left < timeout:
        return left, True
    return timeout, False


class DeadlineStream(httpcore.NetworkStream):
    """A network stream whose reads and writes end by the deadline of its request."""

    def __init__(
        self,
        stream: httpcore.NetworkStream,
        deadline: Deadline | None,
        core: Any = httpcore,
        kept: Streams | None = None,
    ) -> None:
        self._stream = stream
        self._deadline = deadline
        self._core = core  # httpcore or httpcore2: whose errors the pool above maps
        self._kept = kept  # the backend's ``streams``, which this one joins
        if kept is not None:
            kept.add(self)

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        core = self._core
        clipped, by_deadline = _clip(self._deadline, timeout, core.ReadTimeout, "a read")
        try:
            return self._stream.read(max_bytes, clipped)
        except core.ReadTimeout as exc:
            if by_deadline:
                raise core.ReadTimeout(f"{_passed(self._deadline)} while reading") from exc
            raise

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        # Only a request writes: its deadline is the one the reads that follow keep.
        self._deadline = current_deadline()
        core = self._core
        clipped, by_deadline = _clip(self._deadline, timeout, core.WriteTimeout, "a write")
        try:
            self._stream.write(buffer, clipped)
        except core.WriteTimeout as exc:
            if by_deadline:
                raise core.WriteTimeout(f"{_passed(self._deadline)} while writing") from exc
            raise

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        core = self._core
        clipped, _ = _clip(self._deadline, timeout, core.ConnectTimeout, "the TLS handshake")
        return DeadlineStream(
            self._stream.start_tls(ssl_context, server_hostname, clipped),
            self._deadline,
            core,
            self._kept,
        )

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


#: Looks up a host's addresses (``socket.getaddrinfo``'s job); injectable for tests.
Resolver = Callable[[str, int], list[str]]


def _getaddrinfo(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    return True


def _core_of(backend: object) -> Any:
    """httpcore or httpcore2: the library ``backend`` belongs to."""
    root = type(backend).__module__.split(".", 1)[0]
    return sys.modules.get(root, httpcore) if root.startswith("httpcore") else httpcore


class DeadlineBackend(_Keeps, httpcore.NetworkBackend):
    """Wraps a backend (httpcore's or httpcore2's ``SyncBackend``): connects within
    the current deadline and hands out :class:`DeadlineStream` s. Its errors are the
    wrapped backend's library's, which the pool above it maps to httpx's (httpx2's)."""

    def __init__(
        self, backend: httpcore.NetworkBackend, *, resolve: Resolver = _getaddrinfo
    ) -> None:
        self._backend = backend
        self._resolve = resolve
        self._core = _core_of(backend)
        #: Every stream made here (a TLS one too) while its connection holds it.
        self.streams: Streams = weakref.WeakSet()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        deadline = current_deadline()
        options = list(socket_options or ())
        if deadline is None or deadline.timeout is None or _is_ip_literal(host):
            clipped, _ = _clip(deadline, timeout, self._core.ConnectTimeout, "connecting")
            stream = self._backend.connect_tcp(host, port, clipped, local_address, options)
            return self._made(DeadlineStream(stream, deadline, self._core, self.streams))
        # A name: resolved beside the call, so a resolver that hangs costs it no more
        # than its deadline; then each address in turn, as socket.create_connection.
        error: Exception = self._core.ConnectError(f"{host!r} resolved to no address")
        for address in self._addresses(host, port, deadline):
            clipped, _ = _clip(deadline, timeout, self._core.ConnectTimeout, "connecting")
            try:
                stream = self._backend.connect_tcp(address, port, clipped, local_address, options)
            except self._core.ConnectError as exc:
                error = exc
                continue
            return self._made(DeadlineStream(stream, deadline, self._core, self.streams))
        raise error

    def _addresses(self, host: str, port: int, deadline: Deadline) -> list[str]:
        """The addresses of ``host``, looked up in a thread of its own and waited for
        no longer than the deadline (a blocked ``getaddrinfo`` cannot be interrupted;
        the thread ends when the resolver gives up)."""
        left, _ = _clip(deadline, None, self._core.ConnectTimeout, "resolving the host")
        answer: queue.SimpleQueue[list[str] | OSError] = queue.SimpleQueue()

        def lookup() -> None:
            try:
                answer.put(self._resolve(host, port))
            except OSError as exc:
                answer.put(exc)

        threading.Thread(target=lookup, name="stormguard-resolve", daemon=True).start()
        try:
            result = answer.get(timeout=left)
        except queue.Empty:
            raise self._core.ConnectTimeout(f"{_PASSED} while resolving {host!r}") from None
        if isinstance(result, OSError):
            raise self._core.ConnectError(f"could not resolve {host!r}: {result}") from result
        return result

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        deadline = current_deadline()
        clipped, _ = _clip(deadline, timeout, self._core.ConnectTimeout, "connecting")
        stream = self._backend.connect_unix_socket(path, clipped, socket_options)
        return self._made(DeadlineStream(stream, deadline, self._core, self.streams))

    def sleep(self, seconds: float) -> None:
        self._backend.sleep(seconds)


def hold_transport(transport: object) -> bool:
    """Wrap the network backend of ``transport``'s pool (an httpx or httpx2
    ``HTTPTransport``) in a :class:`DeadlineBackend` (once); False when it has none,
    or may multiplex requests (HTTP/2)."""
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    core = _core_of(backend)
    if not isinstance(backend, core.NetworkBackend) or getattr(pool, "_http2", False):
        return False
    if not isinstance(backend, DeadlineBackend):
        pool._network_backend = DeadlineBackend(backend)  # type: ignore[union-attr]
    return True


class KeptBackend(_Keeps, httpcore.AsyncNetworkBackend):
    """Wraps an async backend (httpcore's ``AutoBackend``), keeping the streams it
    made (``streams``); each is handed on as it is, so no read or write pays for
    this. A TLS stream reads its socket from the one it wraps, which is kept."""

    def __init__(self, backend: httpcore.AsyncNetworkBackend) -> None:
        self._backend = backend
        self._core = _core_of(backend)
        #: Every stream made here while its connection holds it.
        self.streams: Streams = weakref.WeakSet()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_tcp(host, port, timeout, local_address, socket_options)
        self.streams.add(stream)
        return await self._amade(stream)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        stream = await self._backend.connect_unix_socket(path, timeout, socket_options)
        self.streams.add(stream)
        return await self._amade(stream)

    async def sleep(self, seconds: float) -> None:
        await self._backend.sleep(seconds)


def keep_streams(transport: object) -> None:
    """Have the pool of ``transport`` (an httpx or httpx2 ``AsyncHTTPTransport``) keep
    the streams it makes: its backend wrapped in a :class:`KeptBackend` (once)."""
    pool = getattr(transport, "_pool", None)
    backend = getattr(pool, "_network_backend", None)
    if isinstance(backend, _core_of(backend).AsyncNetworkBackend) and not isinstance(
        backend, KeptBackend
    ):
        pool._network_backend = KeptBackend(backend)  # type: ignore[union-attr]


def kept_backend(transport: object) -> _Keeps | None:
    """The backend of ``transport``'s pool when it keeps its streams (None for a
    transport stormguard did not build)."""
    backend = getattr(getattr(transport, "_pool", None), "_network_backend", None)
    return backend if isinstance(backend, _Keeps) else None
