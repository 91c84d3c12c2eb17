"""The server's HTTP/1.1 protocol driven in-process: bytes in, bytes out, no socket.

``Wire`` builds the protocol exactly as the server configures it
(``connections.uvicorn_config``) over a fake transport, so a test can hand it
any bytes in any cuts, see what it wrote back and whether it closed, and which
requests reached the app, in microseconds and without a free port:

    async with Wire(ConnectionLimits()) as wire:
        wire.receive(b"GET / HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
        await wire.settle()
        assert wire.status() == 200 and wire.requests == 1
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.server import ServerState

from stormguard_server.http.connections import ConnectionLimits, HardenedH11Protocol, uvicorn_config

Headers = list[tuple[bytes, bytes]]


class FakeTransport(asyncio.Transport):
    """What the protocol writes, and whether it closed (or half-closed) the connection."""

    def __init__(self, loop: asyncio.AbstractEventLoop, peer: tuple[str, int]) -> None:
        super().__init__()
        self.loop = loop
        self.peer = peer
        self.written = bytearray()
        self.closed = False
        self.write_closed = False
        self.reading = True
        self.protocol: asyncio.Protocol | None = None
        self.on_resume: Any = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": self.peer}.get(name, default)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        assert not self.write_closed, "wrote after closing for writing"
        self.written += data

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.write_closed = True

    def close(self) -> None:
        if not self.closed and self.protocol is not None:
            self.loop.call_soon(self.protocol.connection_lost, None)
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        if not self.reading:
            self.reading = True
            if self.on_resume is not None:
                self.loop.call_soon(self.on_resume)

    def is_reading(self) -> bool:
        return self.reading


class Wire:
    """One connection to an app (by default one that reads the body and answers 200)."""

    def __init__(self, limits: ConnectionLimits, app: Any = None, peer: str = "127.0.0.1") -> None:
        self.limits = limits
        self.app = app or self._answer_200
        self.peer = peer
        self.requests = 0
        self.heads: list[Headers] = []
        self.pending = bytearray()
        # Called after each read the protocol is handed (a test's invariant check).
        self.after_read: Any = lambda wire: None

    async def __aenter__(self) -> Wire:
        loop = asyncio.get_running_loop()
        config = uvicorn_config(
            self.app,
            host="127.0.0.1",
            port=0,
            limits=self.limits,
            interface="asgi3",
            log_config=None,
        )
        config.load()
        self.protocol: HardenedH11Protocol = config.http_protocol_class(  # type: ignore[call-arg]
            config=config, server_state=ServerState(), app_state={}, _loop=loop
        )
        self.transport = FakeTransport(loop, (self.peer, 50000))
        self.transport.protocol = self.protocol
        self.transport.on_resume = self._pump
        self.protocol.connection_made(self.transport)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.transport.close()
        await self.settle()

    async def _answer_200(self, scope: Any, receive: Any, send: Any) -> None:
        self.requests += 1
        self.heads.append(list(scope["headers"]))
        while True:
            message = await receive()
            if message["type"] != "http.request" or not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    def receive(self, data: bytes) -> None:
        """``data`` arrives from the client: read at once, or once the protocol reads
        again (as the kernel would keep it); dropped once the connection is closed."""
        self.pending += data
        self._pump()

    def _pump(self) -> None:
        if self.pending and not self.transport.closed and self.transport.reading:
            data, self.pending = bytes(self.pending), bytearray()
            self.protocol.data_received(data)
            self.after_read(self)

    async def settle(self, turns: int = 20) -> None:
        """Let the app's tasks and the loop's callbacks run."""
        for _ in range(turns):
            await asyncio.sleep(0)

    def status(self) -> int | None:
        """The status of the first answer written, if any."""
        line = bytes(self.transport.written).split(b"\r\n", 1)[0].split()
        return int(line[1]) if len(line) >= 2 and line[1].isdigit() else None

    def answer_headers(self) -> dict[bytes, bytes]:
        head = bytes(self.transport.written).split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]
        return dict((k.strip().lower(), v.strip()) for k, _, v in (h.partition(b":") for h in head))

    def body(self) -> bytes:
        return bytes(self.transport.written).partition(b"\r\n\r\n")[2]


def request_head(
    headers: Headers, *, target: bytes = b"/v1/models", method: bytes = b"GET"
) -> bytes:
    """A request head with ``headers`` after a ``Host`` header."""
    lines = [method + b" " + target + b" HTTP/1.1", b"Host: 127.0.0.1"]
    lines += [name + b": " + value for name, value in headers]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def many_headers(count: int, value_size: int = 20) -> Headers:
    """``count`` distinct headers, each value ``value_size`` bytes."""
    return [(b"x-h%d" % i, b"v" * value_size) for i in range(count)]
