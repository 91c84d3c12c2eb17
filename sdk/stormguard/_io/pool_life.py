"""The client's own pool, made for the process and the event loop that use it, and
closed so that the calls reading it end.

A pooled connection belongs to the process that opened it, and an async one to the
event loop too; httpx's pool knows neither. The pool a client builds for itself
(``own_pool.own_pool``) therefore holds its httpx transports through one of these:

- :class:`ProcessTransport` (sync) and :class:`LoopTransport` (async) check on each
  request that they run in the process that made them, as redis-py's
  ``ConnectionPool`` does (``_checkpid``, with the process id; here with a count of
  forks, ``_fork.forks``, which costs no system call). A child forked after the
  pool was used (gunicorn ``--preload``, ``multiprocessing`` with fork) builds a
  pool of its own on its first request.
  Without that, parent and child write their requests on the same sockets and read
  each other's answers, with no error. The child lets go of the inherited
  connections by closing its own copies of their file descriptors, and does
  nothing else: a ``shutdown()`` or a TLS ``close_notify`` would end the
  connection for the parent too (redis-py's ``Connection.disconnect`` shuts a
  socket down only in the process that opened it, for the same reason).
- :class:`LoopTransport` keeps one pool per asyncio event loop. An httpx
  ``AsyncClient`` serves one loop (its maintainers: do not share one across event
  loops): a connection opened on a loop that has since closed fails with
  ``RuntimeError: Event loop is closed``, as at the second ``asyncio.run()`` of a
  script with a module-level client. Here a call on another loop gets a pool of
  that loop's own; the pool of a loop that has closed is let go of (its sockets
  closed: nothing can run on that loop any more) when a call on another loop
  finds it, or at ``aclose()``.
- ``close()`` (sync) shuts every socket of the pool down before closing it, so a
  thread blocked reading a response wakes at once, and its call ends with
  ``ClientClosedError``; closing a socket that another thread is reading does not
  wake that thread on Linux (and its descriptor could be reused under the read).
  ``aclose()`` closes each loop's pool on that loop: awaited for the running one,
  handed to a loop running in another thread, let go of for a closed one.

A pool you pass (``http_client=``) is yours and used as it is; it is only watched
for a fork (:func:`used_given_pool`).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import warnings
import weakref
from collections.abc import Callable, Coroutine
from typing import Any

from .._core import fork as _fork
from .._core.fork import fork_safe_lock
from .._core.http import httpx

__all__ = [
    "LoopTransport",
    "ProcessTransport",
    "given_pool",
    "keeping",
    "running_loop",
    "used_given_pool",
    "wake_reads",
]


def _transports(transport: object) -> list[Any]:
    """The httpx transports ``transport`` is made of: its shards' (``pool_shards.py``),
    or itself; for the aiohttp transport off asyncio, those of httpx's it hands the
    requests to (``aiohttp_transport.py``)."""
    fallback = getattr(transport, "fallback", None)
    if fallback is not None:
        transport = fallback
    shards = getattr(transport, "shards", None)
    return [shard.transport for shard in shards] if shards is not None else [transport]


def _backends(transport: object) -> list[Any]:
    """The network backends of ``transport``'s pools that keep their streams
    (``deadline_backend.kept_backend``)."""
    from .deadline_backend import kept_backend

    return [b for b in map(kept_backend, _transports(transport)) if b is not None]


def _sockets(transport: object) -> list[Any]:
    """The sockets of the connections ``transport``'s pools hold (an aiohttp
    transport lists its own)."""
    own = getattr(transport, "sockets", None)
    found = own() if callable(own) else []
    for backend in _backends(transport):
        for stream in list(backend.streams):
            sock = stream.get_extra_info("socket")
            if sock is not None:
                found.append(sock)
    return found


def _closing(transport: object) -> None:
    """``transport``'s pools are being closed: a connection a call is still making
    is closed as soon as it is made (it is in no pool, and no close would reach it)."""
    for backend in _backends(transport):
        backend.closed = True


def keeping(transport: httpx.AsyncBaseTransport) -> httpx.AsyncBaseTransport:
    """``transport``, its pools keeping the streams they make (the sync ones'
    ``DeadlineBackend`` keeps them already)."""
    from .deadline_backend import keep_streams

    for each in _transports(transport):
        keep_streams(each)
    return transport


def _wake(transport: object) -> None:
    """Shut down every socket of ``transport``'s pools, in the process that opened
    them: a read blocked on one returns at once, and its request fails."""
    _closing(transport)
    for sock in _sockets(transport):
        with contextlib.suppress(OSError):  # closed already, or never connected
            sock.shutdown(socket.SHUT_RDWR)


def wake_reads(http: object, deadline: object) -> None:
    """Shut down the sockets of ``http``'s own pools (sync: ``DeadlineBackend``) whose
    request ``deadline`` bounds, the one call's that holds it: a read blocked on one
    returns at once, and the server sees the connection close (a hedged call's
    racer that lost, ``_call/drivers.py``)."""
    transports = [getattr(http, "_transport", None), *getattr(http, "_mounts", {}).values()]
    for transport in transports:
        if transport is None:
            continue
        current = getattr(transport, "transport", transport)  # a ProcessTransport's own
        for backend in _backends(current):
            for stream in list(backend.streams):
                if getattr(stream, "_deadline", None) is not deadline:
                    continue
                sock = stream.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):  # closed already
                        sock.shutdown(socket.SHUT_RDWR)


_null_fd = -1


def _let_go(transport: object) -> None:
    """Drop this process's hold on the sockets of ``transport``'s pools, and touch
    nothing they share with another process: each descriptor of this process is
    closed, with no ``shutdown()`` and no TLS ``close_notify``. An asyncio socket
    (not closable but by its transport, whose loop may be closed or another
    process's) has its descriptor replaced by one on ``/dev/null``, so that the
    transport, when it closes it, closes that one."""
    global _null_fd
    for sock in _sockets(transport):
        if isinstance(sock, socket.socket):  # an SSLSocket's close() sends nothing either
            sock.close()
            continue
        fd = sock.fileno()
        if fd < 0 or os.name != "posix":
            continue  # closed already; elsewhere, no fork and no dup2 of sockets
        if _null_fd < 0:
            _null_fd = os.open(os.devnull, os.O_RDWR)
        os.dup2(_null_fd, fd, inheritable=False)
    forget = getattr(transport, "forget", None)
    if callable(forget):
        forget()  # an aiohttp session, told it is closed, with no I/O


class ProcessTransport(httpx.BaseTransport):
    """The sync own pool's transport, ``make()``, made again in a forked child
    (module doc). Thread-safe."""

    def __init__(self, make: Callable[[], httpx.BaseTransport]) -> None:
        self._make = make
        self._lock = fork_safe_lock()
        #: The transport of the process that uses this one.
        self.transport = make()
        self._forks = _fork.forks  # the process it serves

    def _current(self) -> httpx.BaseTransport:
        if self._forks != _fork.forks:
            with self._lock:
                if self._forks != _fork.forks:
                    _let_go(self.transport)
                    self.transport = self._make()
                    # Last: a thread that sees it finds the new pool in place.
                    self._forks = _fork.forks
        return self.transport

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self._forks == _fork.forks:
            return self.transport.handle_request(request)
        return self._current().handle_request(request)

    def close(self) -> None:
        if self._forks != _fork.forks:
            _let_go(self.transport)  # the parent's pool: never shut down from here
            return
        _wake(self.transport)
        self.transport.close()


#: A ``LoopTransport`` not used by any loop yet.
_UNBOUND = object()


def running_loop() -> Any:
    """The asyncio event loop running in this thread; None when none runs (trio, where
    one pool serves, as in httpx). Looked up without importing asyncio: a sync
    program never loads it."""
    asyncio = sys.modules.get("asyncio")
    return None if asyncio is None else asyncio._get_running_loop()


def _closed(loop: object) -> bool:
    return loop is not None and loop is not _UNBOUND and bool(loop.is_closed())  # type: ignore[attr-defined]


class LoopTransport(httpx.AsyncBaseTransport):
    """The async own pool's transport: a ``make()`` for each event loop that uses
    it, made again in a forked child (module doc). The loops may run in threads of
    their own."""

    def __init__(self, make: Callable[[], httpx.AsyncBaseTransport]) -> None:
        self._make: Callable[[], httpx.AsyncBaseTransport] = lambda: keeping(make())
        self._lock = fork_safe_lock()
        #: The loop that used this one last and its transport, in one tuple: a loop in
        #: another thread reads both at once. The first transport waits for a loop.
        self._last: tuple[object, httpx.AsyncBaseTransport] = (_UNBOUND, self._make())
        self._pools: dict[object, httpx.AsyncBaseTransport] = {}
        self._forks = _fork.forks

    @property
    def transport(self) -> httpx.AsyncBaseTransport:
        """The transport of the loop that used this one last (of the first to use it,
        until one does)."""
        return self._last[1]

    def _switch(self, loop: object) -> httpx.AsyncBaseTransport:
        """The transport of ``loop``: the one already made for it, or one made now,
        after letting go of the parent's (in a forked child) and of closed loops'."""
        with self._lock:
            if self._forks != _fork.forks:
                for pool in self._every():
                    _let_go(pool)
                self._pools = {}
                self._last = (_UNBOUND, self._make())
                self._forks = _fork.forks
            for gone in [each for each in self._pools if _closed(each)]:
                _let_go(self._pools.pop(gone))
            last, pool = self._last
            if last is not _UNBOUND:
                pool = self._pools.get(loop) or self._make()
            self._pools[loop] = pool
            self._last = (loop, pool)
            return pool

    def _every(self) -> list[httpx.AsyncBaseTransport]:
        return list({id(pool): pool for pool in (self.transport, *self._pools.values())}.values())

    def handle_async_request(self, request: httpx.Request) -> Coroutine[Any, Any, httpx.Response]:
        # Not a coroutine of its own: the pool's is handed on, to be awaited in its place.
        loop = running_loop()
        last, pool = self._last
        if last is not loop or self._forks != _fork.forks:
            pool = self._switch(loop)
        return pool.handle_async_request(request)

    async def aclose(self) -> None:
        if self._forks != _fork.forks:
            for pool in self._every():
                _let_go(pool)  # the parent's pools: never closed from here
            return
        running = running_loop()
        with self._lock:
            pools, self._pools = self._pools, {}
            last, unbound = self._last
        if last is _UNBOUND:  # never used: nothing open
            await unbound.aclose()
        for loop, pool in pools.items():
            _closing(pool)
            if loop is running:
                await pool.aclose()
            elif loop is None or _closed(loop) or not loop.is_running():  # type: ignore[attr-defined]
                _let_go(pool)  # nothing will run on that loop to close it
            else:  # running in another thread: closed there, on its own loop
                sys.modules["asyncio"].run_coroutine_threadsafe(pool.aclose(), loop)


#: The process (``_fork.forks``, and its id) each ``http_client`` you passed was
#: given in, or last warned about.
_given: weakref.WeakKeyDictionary[object, tuple[int, int]] = weakref.WeakKeyDictionary()


def given_pool(http: object) -> None:
    """Note the process ``http`` (an ``http_client`` you passed) was given in."""
    _given[http] = (_fork.forks, os.getpid())


def used_given_pool(http: object) -> None:
    """Warn, once per process, when ``http`` (an ``http_client`` you passed) is used
    in a process forked from the one it was given in: its connections opened before
    the fork are the parent's too, and stormguard does not replace a pool of yours."""
    given = _given.get(http)
    if given is not None and given[0] != _fork.forks:
        _given[http] = (_fork.forks, os.getpid())
        warnings.warn(
            f"the http_client passed to a stormguard client in process {given[1]} is used"
            f" in process {os.getpid()}, forked from it: connections it opened before the"
            " fork are shared by both processes, which then read each other's answers."
            " Make the http_client in the process that uses it (after the fork), or"
            " pass none: the client's own pool makes a pool for each process",
            RuntimeWarning,
            stacklevel=4,
        )
