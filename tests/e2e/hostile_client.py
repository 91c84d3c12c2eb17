"""Hostile HTTP/1.1 clients on raw sockets: the ones no HTTP library will be.

A client that opens a connection and says nothing, sends its headers a byte at
a time (slowloris), sends a head with thousands of headers, or declares a body
and never finishes it. Each connection is
a :class:`Held`: when it was opened, when the server closed it (``recv`` gave
``b""`` or the connection was reset) and what the server said before that.

    conns = [open_held(port, PARTIAL_HEADERS) for _ in range(20)]
    hold(conns, trickle=b"x", interval=0.2, timeout=10)  # until the server closes all
    assert all(c.closed_after is not None for c in conns)

Used by ``tests/e2e/test_hostile_client.py``, ``bench/bench_slowloris.py`` and
``bench/hostile_cases.py``.
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

# A request line and a header, never ended by the blank line: a slowloris.
PARTIAL_HEADERS = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "


def partial_body_request(declared: int, sent: int) -> bytes:
    """A chat request's head declaring ``declared`` body bytes, and ``sent`` of them."""
    return body_head(declared) + b" " * sent


def body_head(declared: int, *, expect_continue: bool = False) -> bytes:
    """The head of a chat request declaring ``declared`` body bytes."""
    expect = b"Expect: 100-continue\r\n" if expect_continue else b""
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: application/json\r\n"
        + expect
        + b"Content-Length: "
        + str(declared).encode()
        + b"\r\n\r\n"
    )


def many_headers_head(
    count: int, value_size: int, *, declared_body: int = 0, path: bytes = b"/v1/chat/completions"
) -> bytes:
    """A POST's head with ``count`` extra headers of ``value_size`` bytes each, declaring
    ``declared_body`` body bytes (none of them sent)."""
    lines = [b"POST " + path + b" HTTP/1.1", b"Host: 127.0.0.1", b"Connection: close"]
    lines += [b"X-H%d: %s" % (i, b"v" * value_size) for i in range(count)]
    lines += [b"Content-Type: application/json", b"Content-Length: %d" % declared_body]
    return b"\r\n".join(lines) + b"\r\n\r\n"


@dataclass
class Held:
    """One connection a hostile client holds open."""

    sock: socket.socket
    opened: float  # time.monotonic() just before connecting
    closed: float | None = None
    received: bytearray = field(default_factory=bytearray)
    sent_after_open: int = 0

    @property
    def closed_after(self) -> float | None:
        """Seconds from connecting to the server closing the connection (None: still open)."""
        return None if self.closed is None else self.closed - self.opened

    def status(self) -> int | None:
        """The status code of the response the server sent before closing, if any."""
        line = bytes(self.received).split(b"\r\n", 1)[0]
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith(b"HTTP/") and parts[1].isdigit():
            return int(parts[1])
        return None

    def body(self) -> bytes:
        return bytes(self.received).partition(b"\r\n\r\n")[2]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def open_held(port: int, first: bytes = b"", timeout: float = 10.0) -> Held:
    """Connect to 127.0.0.1:``port`` and send ``first`` (possibly nothing)."""
    opened = time.monotonic()  # before connecting: the server accepts after this
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    held = Held(sock=sock, opened=opened)
    if first:
        sock.sendall(first)
    sock.setblocking(False)
    return held


def open_in_flight(port: int, declared: int, sent: int = 0, timeout: float = 10.0) -> Held:
    """A request the server is serving, its body unfinished.

    Its head asks for ``100 Continue``, which uvicorn sends when the app first
    reads the body: once this returns, the request holds its place among those
    served (and its declared bytes). Then ``sent`` bytes of the body follow."""
    opened = time.monotonic()
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    held = Held(sock=sock, opened=opened)
    sock.sendall(body_head(declared, expect_continue=True))
    interim = b""
    while b"\r\n\r\n" not in interim:
        data = sock.recv(4096)
        if not data:
            raise AssertionError(f"closed before 100 Continue, after {interim!r}")
        interim += data
    if not interim.startswith(b"HTTP/1.1 100 "):
        raise AssertionError(f"expected 100 Continue, got {interim!r}")
    held.received += interim.partition(b"\r\n\r\n")[2]
    if sent:
        sock.sendall(b" " * sent)
    sock.setblocking(False)
    return held


def hold(
    conns: Iterable[Held],
    *,
    timeout: float,
    trickle: bytes | None = None,
    interval: float = 0.2,
) -> None:
    """Keep ``conns`` open until the server has closed every one, or ``timeout`` passes
    (0: one look at what has arrived).

    With ``trickle``, one more byte of it goes to each open connection every
    ``interval`` (a slowloris keeps its connection busy). Records when each
    connection was closed and everything the server sent on it."""
    open_conns = [c for c in conns if c.closed is None]
    deadline = time.monotonic() + timeout
    next_trickle = time.monotonic() + interval
    with selectors.DefaultSelector() as selector:
        for held in open_conns:
            selector.register(held.sock, selectors.EVENT_READ, held)
        while open_conns:
            wait = max(0.0, min(next_trickle, deadline) - time.monotonic())
            for key, _ in selector.select(wait):
                held = key.data
                if _read(held):
                    selector.unregister(held.sock)
                    open_conns.remove(held)
            if trickle is not None and time.monotonic() >= next_trickle:
                next_trickle = time.monotonic() + interval
                for held in list(open_conns):
                    byte = trickle[held.sent_after_open % len(trickle)]
                    try:
                        held.sock.send(bytes([byte]))
                        held.sent_after_open += 1
                    except OSError:  # reset: the server closed it
                        held.closed = time.monotonic()
                        selector.unregister(held.sock)
                        open_conns.remove(held)
            if time.monotonic() >= deadline:
                return


def _read(held: Held) -> bool:
    """Read what is there; True when the server has closed the connection."""
    while True:
        try:
            data = held.sock.recv(65536)
        except BlockingIOError:
            return False
        except OSError:  # reset by the server
            held.closed = time.monotonic()
            return True
        if not data:
            held.closed = time.monotonic()
            return True
        held.received += data


def is_closed_now(held: Held, wait: float = 0.0) -> bool:
    """Whether the server has closed the connection (within ``wait`` seconds)."""
    hold([held], timeout=wait)
    return held.closed is not None
