"""The server's HTTP/1.1 connections: read deadlines and a connection limit.

uvicorn has no timeout on reading a request. Its ``timeout_keep_alive`` is
reset by every byte that arrives, so a client that sends its headers a byte at
a time (slowloris) or never finishes its body holds a connection, a file
descriptor and its buffers for as long as it likes; and its
``limit_concurrency`` counts idle connections along with requests, so a crowd
of idle connections turns every real request into a plain-text 503. No ASGI
middleware can help: the app sees a request only once its headers are complete.
uvicorn's "Further timeouts and resource limiting" issue has asked for a
request-start timeout since 2018, and h11 leaves timing to its caller; hence
this small subclass of uvicorn's h11 protocol, written by hand:

* **header deadline**: a connection must complete its request headers within
  ``header_timeout_s`` of connecting, or of the end of its previous response
  on keep-alive; otherwise it is closed. Bytes arriving do not extend it.
* **body deadline**: a request's body must arrive completely within
  ``body_timeout_s`` of its headers; otherwise the client gets an OpenAI-shaped
  408 (when no response has started) and the connection is closed. The app is
  told the client left, so the body read so far is dropped with its request.
* **bytes sent ahead**: while a request is being served, uvicorn keeps what the
  client sends next (pipelining) unparsed, up to one socket read (256 KiB); a
  connection with more than 16 KiB waiting there is closed, so that each
  request in flight holds at most that beyond its body.
* **connection limit**: past ``max_connections``, a new connection closes the
  connection that has been idle longest (waiting for request headers, or
  trickling the body of a request already answered); when every connection is
  serving a request, the new one is closed at once. Idle connections cannot
  starve real ones: a newcomer always finds room while any connection is idle.

The server passes the class explicitly (``http=`` in :func:`uvicorn_config`),
so uvicorn's "auto" choice (httptools when installed) never swaps in a protocol
without these bounds. It relies on uvicorn's h11 protocol internals
(``cycle``, ``conn``, ``on_response_complete``), which the end-to-end tests in
``tests/e2e/test_hostile_client.py`` exercise.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import h11
import uvicorn
from prometheus_client import CollectorRegistry, Counter
from uvicorn.protocols.http.h11_impl import H11Protocol

from stormguard_server.errors import error_body

__all__ = [
    "MAX_BYTES_AHEAD",
    "ConnectionLimits",
    "HardenedH11Protocol",
    "fit_to_fd_limit",
    "protocol_class",
    "summarize_accept_failures",
    "uvicorn_config",
]

logger = logging.getLogger("stormguard_server.connections")

_Phase = Literal["headers", "body"]
# Why the server closed a connection (label of stormguard_http_connections_closed_total).
CloseReason = Literal["header_timeout", "body_timeout", "bytes_ahead", "limit_idle", "limit_full"]

# Bytes a client may send ahead of the request being served: room for the head
# of a pipelined request as large as h11 accepts one. No HTTP client in common
# use pipelines at all.
MAX_BYTES_AHEAD = 16 * 1024

# The soft file-descriptor limit asked for when the hard one is unlimited.
_FD_LIMIT_CAP = 1 << 20

# What the server waits for from the client in each h11 state of the peer; in
# the others (request complete, connection closing) it waits for nothing.
_READ_PHASES: dict[object, _Phase] = {
    h11.IDLE: "headers",
    h11.SEND_BODY: "body",
}


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """How long a client may take to send a request, and how many connections it may hold."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 4096

    def __post_init__(self) -> None:
        if not (self.header_timeout_s > 0 and self.body_timeout_s > 0):
            raise ValueError("read timeouts must be > 0")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")


class HardenedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines and a connection limit (see module doc).

    Use :func:`protocol_class` to get one bound to a :class:`ConnectionLimits`."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    closes: ClassVar[Counter | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: _Phase | None = None
        self._phase_since = 0.0
        self._deadline: asyncio.TimerHandle | None = None

    # asyncio.Protocol callbacks and uvicorn's response hook: after each, the
    # connection may have entered a new phase.

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            logger.debug("connection refused: every connection is serving a request")
            self._count("limit_full")
            self.transport.close()
            return
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()
        if self._phase is None and not self.transport.is_closing():
            ahead = len(self.conn.trailing_data[0])
            if ahead > MAX_BYTES_AHEAD:
                logger.debug("closing a connection that sent %d bytes ahead", ahead)
                self._drop("bytes_ahead")

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # Deadlines

    def _watch(self) -> None:
        """Arm the deadline of the phase the connection is in, when it enters it."""
        if self.transport.is_closing():
            self._disarm()
            return
        phase = _READ_PHASES.get(self.conn.their_state)
        if phase == self._phase:
            return
        self._disarm()
        self._phase = phase
        self._phase_since = self.loop.time()
        if phase == "headers":
            self._deadline = self.loop.call_later(
                self.limits.header_timeout_s, self._header_deadline_passed
            )
        elif phase == "body":
            self._deadline = self.loop.call_later(
                self.limits.body_timeout_s, self._body_deadline_passed
            )

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _header_deadline_passed(self) -> None:
        self._deadline = None
        logger.debug("closing a connection without request headers after %s s", self._age())
        self._drop("header_timeout")

    def _body_deadline_passed(self) -> None:
        self._deadline = None
        logger.debug("closing a connection whose request body is late after %s s", self._age())
        cycle = self.cycle
        if cycle is not None and not cycle.response_started and not cycle.disconnected:
            self._answer_408()
        self._drop("body_timeout")

    def _age(self) -> str:
        return f"{self.loop.time() - self._phase_since:.1f}"

    def _answer_408(self) -> None:
        """Written here, not by the app: the app is waiting for the body that is late."""
        message = f"request body not received within {self.limits.body_timeout_s:g} s"
        payload = error_body(message, status=408, code="body_timeout")
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = [
            *self.server_state.default_headers,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            for event in (
                h11.Response(status_code=408, headers=headers, reason=b"Request Timeout"),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                data = self.conn.send(event)
                if data:
                    self.transport.write(data)
        except h11.LocalProtocolError:  # the h11 state allows no answer: just close
            pass

    def _drop(self, reason: CloseReason) -> None:
        """Close the connection; a request still running is told its client left
        (as when the peer closes), so it stops and its buffered body is freed."""
        self._count(reason)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True
            cycle.message_event.set()
        self.transport.close()

    # Connection limit

    def _idle(self) -> bool:
        """No request of this connection is being served (so closing it loses no work)."""
        if self.transport.is_closing() or self._phase is None:
            return False
        return self.cycle is None or self.cycle.response_complete

    def _make_room(self) -> bool:
        """Close the connection idle the longest; False when none is idle."""
        idle = [
            other
            for other in self.connections
            if other is not self and isinstance(other, HardenedH11Protocol) and other._idle()
        ]
        if not idle:
            return False
        oldest = min(idle, key=lambda other: other._phase_since)
        logger.debug("connection limit reached: closing the connection idle longest")
        oldest._drop("limit_idle")
        return True

    def _count(self, reason: CloseReason) -> None:
        if self.closes is not None:
            self.closes.labels(reason).inc()


def protocol_class(
    limits: ConnectionLimits, registry: CollectorRegistry | None = None
) -> type[HardenedH11Protocol]:
    """A :class:`HardenedH11Protocol` subclass bound to ``limits`` (uvicorn builds the
    protocol from its class, with no room for arguments of ours), counting the
    connections it closes in ``registry``."""
    closes = None
    if registry is not None:
        closes = Counter(
            "stormguard_http_connections_closed",
            "Connections the server closed: read deadline, bytes sent ahead, connection limit.",
            ["reason"],
            registry=registry,
        )
    attributes = {"limits": limits, "closes": closes}
    return type("HardenedH11Protocol", (HardenedH11Protocol,), attributes)


def uvicorn_config(
    app: Any,
    *,
    host: str,
    port: int,
    limits: ConnectionLimits,
    registry: CollectorRegistry | None = None,
    **options: Any,
) -> uvicorn.Config:
    """The uvicorn config of a stormguard server: the hardened h11 protocol, chosen
    explicitly, and no websockets (no route uses them; an upgrade would leave the
    protocol and its deadlines). uvicorn's own ``limit_concurrency`` stays off: it
    counts idle connections too (the request limit is ``request_limits.py``)."""
    http = protocol_class(limits, registry)
    return uvicorn.Config(app, host=host, port=port, http=http, ws="none", **options)


def fit_to_fd_limit(max_connections: int, reserve: int = 128) -> int:
    """The connection limit the process's file-descriptor limit allows.

    Each connection takes a descriptor; ``reserve`` more are kept for everything
    else (listening sockets, logs, the admin server). The soft limit is raised to
    the hard one (as Go's runtime does at start), which also leaves room for a
    burst of connections accepted before the limit closes the idlest ones. When
    even the hard limit is too low, the connection limit is lowered, with a
    warning, so that it is the limit, not accept() failing with EMFILE (which
    stalls every new connection, real ones included), that turns clients away."""
    try:
        import resource
    except ImportError:  # not a Unix: no limit to read
        return max_connections
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + reserve
    if soft != resource.RLIM_INFINITY and soft < hard:
        raised = max(wanted, _FD_LIMIT_CAP) if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return max_connections
    allowed = max(1, soft - reserve)
    logger.warning(
        "connection limit lowered to fit the file-descriptor limit",
        extra={
            "event": "connection_limit_lowered",
            "max_connections": allowed,
            "wanted": max_connections,
            "fd_limit": soft,
        },
    )
    return allowed


_OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def summarize_accept_failures(
    loop: asyncio.AbstractEventLoop, every_s: float = 10.0
) -> Callable[[asyncio.AbstractEventLoop, dict[str, Any]], None]:
    """One warning per ``every_s`` for accept() running out of file descriptors,
    instead of asyncio's error with a traceback for each try.

    In a burst of new connections, asyncio accepts a whole batch before any of them
    reaches the connection limit (which closes the idlest connection in
    ``connection_made``), so descriptors can run out for a moment even below the
    limit. asyncio then stops accepting for 1 s while the limit frees descriptors,
    and logs every accept() it tried: 4,024 error lines with a traceback for 1,100
    connections opened at once under ``ulimit -n 1024``. Installed as the loop's
    exception handler; every other error goes to the handler there was before.
    Returns the handler."""
    previous = loop.get_exception_handler()
    failures = 0
    last_warning = -math.inf

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        nonlocal failures, last_warning
        error = context.get("exception")
        accepting = str(context.get("message", "")).startswith("socket.accept()")
        if accepting and isinstance(error, OSError) and error.errno in _OUT_OF_RESOURCES:
            failures += 1
            if loop.time() - last_warning >= every_s:
                logger.warning(
                    "accept() out of file descriptors: new connections wait while the "
                    "connection limit closes idle ones",
                    extra={"event": "accept_out_of_fds", "failures": failures},
                )
                last_warning = loop.time()
                failures = 0
            return
        if previous is not None:
            previous(loop, context)
        else:
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)
    return handler
