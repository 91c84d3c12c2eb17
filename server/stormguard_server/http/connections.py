"""The server's HTTP/1.1 connections: read deadlines, request heads, a connection limit.

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
* **request heads**: a request's head (request line, header lines, blank line)
  may take ``max_header_bytes`` and hold ``max_header_count`` header lines.
  h11's own limit (``max_incomplete_event_size``) bounds only a head still
  incomplete: one that arrives whole in a read (up to 256 KiB) was parsed
  whatever its size (3,000 headers in 90 KiB: 7.7 ms of CPU; 2,000 in 60 KiB:
  236 KB held per request). So each head is measured before h11 parses it (a
  search for its end and a count of its line feeds, over at most the byte
  limit), including one sent ahead behind a request being served; past either
  limit the client gets an OpenAI-shaped ``431`` and the connection closes.
  The limits are Envoy's and Kestrel's count (100) and h11's size (16 KiB).
* **ambiguous framing**: a request with both ``Content-Length`` and
  ``Transfer-Encoding`` gets ``400`` and the connection closes (RFC 9112
  section 6.1 lets a server reject it and requires it to close the connection
  in any case; nginx and Envoy reject it): h11 reads such a body by its
  chunks, and a proxy in front that went by the length would see another
  request in the same bytes.
* **lingering close**: after a ``431`` or that ``400`` the server stops
  writing and reads (and drops) what the client still sends for at most
  ``LINGER_S``, as nginx and Apache do, then closes: closing with unread bytes
  makes the kernel send a reset, which can destroy the answer before the
  client reads it.
* **connection limit**: past ``max_connections``, a new connection closes the
  connection that has been idle longest (waiting for request headers, or
  trickling the body of a request already answered); when every connection is
  serving a request, the new one is closed at once. Idle connections cannot
  starve real ones: a newcomer always finds room while any connection is idle.

The server passes the class explicitly (``http=`` in :func:`uvicorn_config`),
so uvicorn's "auto" choice (httptools when installed) never swaps in a protocol
without these bounds. It relies on uvicorn's h11 protocol internals
(``cycle``, ``conn``, ``on_response_complete``, ``send_400_response``), which
``tests/server/http/test_request_heads.py`` (in process) and the end-to-end tests in
``tests/e2e/test_hostile_client.py`` exercise.
"""

from __future__ import annotations

import asyncio
import errno
import json
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import h11
import uvicorn
from prometheus_client import CollectorRegistry, Counter
from uvicorn.protocols.http.h11_impl import H11Protocol

from stormguard_server.config import ServerConfig
from stormguard_server.http.errors import error_body

__all__ = [
    "LINGER_S",
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
CloseReason = Literal[
    "header_timeout",
    "body_timeout",
    "bytes_ahead",
    "headers_too_large",
    "ambiguous_length",
    "limit_idle",
    "limit_full",
]

# Bytes a client may send ahead of the request being served: room for the head
# of a pipelined request as large as h11 accepts one. No HTTP client in common
# use pipelines at all.
MAX_BYTES_AHEAD = 16 * 1024

# How long a connection refused for its request head keeps reading (and dropping)
# what its client still sends before it closes; Apache waits 2 s for each read.
LINGER_S = 2.0

# The end of a request head, as h11 finds it (a bare LF is a line end too).
_HEAD_END = re.compile(rb"\n\r?\n")

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
    # A request head: its bytes (request line to blank line) and its header lines.
    max_header_bytes: int = 16 * 1024
    max_header_count: int = 100

    @classmethod
    def for_server(cls, config: ServerConfig, max_connections: int) -> ConnectionLimits:
        """The limits ``config`` sets, with ``max_connections`` connections."""
        return cls(
            header_timeout_s=config.header_timeout_s,
            body_timeout_s=config.body_timeout_s,
            max_connections=max_connections,
            max_header_bytes=config.max_header_bytes,
            max_header_count=config.max_header_count,
        )

    def __post_init__(self) -> None:
        if not (self.header_timeout_s > 0 and self.body_timeout_s > 0):
            raise ValueError("read timeouts must be > 0")
        if self.max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        if self.max_header_bytes < 256 or self.max_header_count < 1:
            raise ValueError("max_header_bytes must be at least 256, max_header_count at least 1")


@dataclass(frozen=True, slots=True)
class _Refusal:
    """A request refused before the app: its answer and why the connection closes."""

    status: int
    reason: bytes
    code: str
    message: str
    close: CloseReason


def head_refusal(buffer: bytes, limits: ConnectionLimits) -> _Refusal | None:
    """The refusal of the request head at the start of ``buffer``, or None while it is
    within both limits (complete or not). Reads at most ``max_header_bytes`` of it."""
    end = _HEAD_END.search(buffer, 0, limits.max_header_bytes)
    scanned = end.end() if end is not None else min(len(buffer), limits.max_header_bytes)
    # Line feeds before the end: the request line's, each header line's, the blank line's.
    header_lines = buffer.count(b"\n", 0, scanned) - (2 if end is not None else 1)
    if header_lines > limits.max_header_count:
        message = f"more than {limits.max_header_count} header fields"
    elif end is None and len(buffer) > limits.max_header_bytes:
        message = f"request line and headers longer than {limits.max_header_bytes} bytes"
    else:
        return None
    return _Refusal(
        431,
        b"Request Header Fields Too Large",
        "request_headers_too_large",
        f"request headers too large: {message}",
        "headers_too_large",
    )


_AMBIGUOUS_LENGTH = _Refusal(
    400,
    b"Bad Request",
    "ambiguous_body_length",
    "a request may not have both Content-Length and Transfer-Encoding",
    "ambiguous_length",
)


class _GuardedConnection(h11.Connection):
    """h11's server connection, refusing a request head past the limits before h11
    parses it, and a request whose body length is ambiguous. A refusal is raised as
    h11's ``RemoteProtocolError`` (uvicorn's way out of its event loop) and kept in
    ``refusal`` for the protocol to answer."""

    def __init__(self, limits: ConnectionLimits) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.limits = limits
        self.refusal: _Refusal | None = None

    def next_event(self) -> Any:
        if self.their_state is h11.IDLE:  # the next event is a request head
            self.refusal = head_refusal(self.trailing_data[0], self.limits)
            if self.refusal is not None:
                raise h11.RemoteProtocolError(self.refusal.message, self.refusal.status)
        event = super().next_event()
        if isinstance(event, h11.Request) and _both_lengths(event.headers):
            self.refusal = _AMBIGUOUS_LENGTH
            raise h11.RemoteProtocolError(self.refusal.message, self.refusal.status)
        return event


def _both_lengths(headers: Any) -> bool:
    names = {name for name, _ in headers}  # h11 gives them lower-cased
    return b"content-length" in names and b"transfer-encoding" in names


class HardenedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with read deadlines and a connection limit (see module doc).

    Use :func:`protocol_class` to get one bound to a :class:`ConnectionLimits`."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    closes: ClassVar[Counter | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn: _GuardedConnection = _GuardedConnection(self.limits)
        self._phase: _Phase | None = None
        self._phase_since = 0.0
        self._deadline: asyncio.TimerHandle | None = None
        self._lingering = False

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
        if self._lingering:  # answered and refused: what still comes is dropped
            return
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

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to bytes h11 cannot parse, or ours to a head we refused."""
        refusal = self.conn.refusal
        if refusal is None:
            super().send_400_response(msg)
            return
        logger.debug("request refused before the app: %s", refusal.message)
        self._count(refusal.close)
        self._answer(refusal.status, refusal.reason, refusal.code, refusal.message)
        self._linger()

    # Deadlines

    def _watch(self) -> None:
        """Arm the deadline of the phase the connection is in, when it enters it."""
        if self._lingering:
            return
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
            # Written here, not by the app: the app is waiting for the body that is late.
            message = f"request body not received within {self.limits.body_timeout_s:g} s"
            self._answer(408, b"Request Timeout", "body_timeout", message)
        self._drop("body_timeout")

    def _age(self) -> str:
        return f"{self.loop.time() - self._phase_since:.1f}"

    def _answer(self, status: int, reason: bytes, code: str, message: str) -> None:
        """An OpenAI-shaped error answer with ``Connection: close``, written by the protocol."""
        payload = error_body(message, status=status, code=code)
        body = json.dumps(payload, separators=(",", ":")).encode()
        headers = [
            *self.server_state.default_headers,
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
        ]
        try:
            for event in (
                h11.Response(status_code=status, headers=headers, reason=reason),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                data = self.conn.send(event)
                if data:
                    self.transport.write(data)
        except h11.LocalProtocolError:  # the h11 state allows no answer: just close
            pass

    def _linger(self) -> None:
        """Stop writing, drop what the client still sends, close at its EOF (asyncio
        does, as ``eof_received`` returns None) or after ``LINGER_S``."""
        self._disarm()
        self._lingering = True
        self._phase = None
        self._phase_since = self.loop.time()
        if self.transport.is_closing() or not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.transport.resume_reading()
        self._deadline = self.loop.call_later(LINGER_S, self.transport.close)

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
        if self.transport.is_closing():
            return False
        if self._lingering:
            return True
        if self._phase is None:
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
            "Connections the server closed: read deadline, bytes sent ahead, request head "
            "refused, connection limit.",
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
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=http,
        ws="none",
        h11_max_incomplete_event_size=limits.max_header_bytes,
        **options,
    )


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
