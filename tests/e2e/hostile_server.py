"""A hostile HTTP/1.1 server for fault-injection tests of the SDK.

Real servers (uvicorn, the reference server) always frame their answers
properly; the failures a client must survive are the ones they never produce:
headers that arrive a byte a second, a body that never ends, a gzip bomb, an
API key echoed back in every place a server can put text. So this server is
raw asyncio streams, not an ASGI app: a *behaviour* gets the parsed request and
the socket's writer and may write any bytes, at any pace, or nothing at all.

    with HostileServer({"/v1/chat/completions": drip(HEAD_JSON, interval=1.0)}) as server:
        client = stormguard.Client(base_url=server.base_url, model="m", timeout=2)

It runs on 127.0.0.1 and a free port, in a thread of its own with its own event
loop, records every request it read (``server.requests``), and on exit cancels
whatever its behaviours are still doing and closes every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
import threading
import zlib
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any

__all__ = [
    "HEAD_JSON",
    "HEAD_SSE",
    "Behaviour",
    "HostileServer",
    "RawRequest",
    "answer",
    "deflate_bomb",
    "drip",
    "gzip_bomb",
    "head",
    "never_answer",
]

# A request head larger than this is not a client we test with: the connection is dropped.
_MAX_HEAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class RawRequest:
    """One request as it came off the wire (header names lower-cased)."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


#: What the server does with a request: write to the connection, at any pace, or not at all.
Behaviour = Callable[[RawRequest, asyncio.StreamWriter], Awaitable[None]]


def head(
    status: int = 200,
    headers: Iterable[tuple[str, str]] = (),
    *,
    reason: str = "OK",
) -> bytes:
    """A status line and header block, ending with the blank line."""
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{name}: {value}" for name, value in headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


#: A head that promises a JSON body of unknown length (closed by the server).
HEAD_JSON = head(200, [("content-type", "application/json"), ("connection", "close")])
#: A head that opens an SSE stream.
HEAD_SSE = head(200, [("content-type", "text/event-stream"), ("connection", "close")])


def answer(
    status: int = 200,
    body: bytes | str | Mapping[str, Any] = b"",
    headers: Iterable[tuple[str, str]] = (),
) -> Behaviour:
    """A complete, well-framed response (``body``: bytes, text, or a JSON object).

    It says ``connection: close``, as the server does after every request: without
    it a client may send its next request on the pooled connection before the
    close reaches it, and that request fails without the server having read it."""
    if isinstance(body, Mapping):
        payload = json.dumps(body).encode()
        headers = [("content-type", "application/json"), *headers]
    else:
        payload = body.encode() if isinstance(body, str) else body
    framing = [("content-length", str(len(payload))), ("connection", "close")]
    raw = head(status, [*headers, *framing]) + payload

    async def behaviour(_: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        await writer.drain()

    return behaviour


def never_answer() -> Behaviour:
    """Read the request, then say nothing, ever (until the server stops)."""

    async def behaviour(_: RawRequest, __: asyncio.StreamWriter) -> None:
        await asyncio.Event().wait()

    return behaviour


def drip(prefix: bytes, *, interval: float, then: bytes = b"x", step: int = 1) -> Behaviour:
    """Send ``prefix`` ``step`` bytes every ``interval`` seconds, then repeat ``then``
    the same way, forever: every socket read of the client succeeds, none finishes."""

    async def behaviour(_: RawRequest, writer: asyncio.StreamWriter) -> None:
        for at in range(0, len(prefix), step):
            writer.write(prefix[at : at + step])
            await writer.drain()
            await asyncio.sleep(interval)
        while True:
            for at in range(0, len(then), step):
                writer.write(then[at : at + step])
                await writer.drain()
                await asyncio.sleep(interval)

    return behaviour


def _compressed(wbits: int, unit: bytes, size: int) -> bytes:
    """``size`` bytes of ``unit`` repeated, compressed: 1 MiB blocks, each ended by a
    full flush. A full flush makes the compressor forget what it saw, so every
    block after the first compresses to the same bytes: one is compressed and
    repeated (a 1 GiB bomb takes milliseconds, not the 10 s of compressing it), and
    the checksum in the trailer is computed over the whole body."""
    block = unit * max(1, (1 << 20) // len(unit))
    count, rest = divmod(size, len(block))
    compressor = zlib.compressobj(9, zlib.DEFLATED, wbits)
    parts = []
    if count:
        parts.append(compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH))
    if count > 1:
        again = compressor.compress(block) + compressor.flush(zlib.Z_FULL_FLUSH)
        parts.append(again * (count - 1))
    gzip = wbits > 15
    end = compressor.compress(block[:rest]) + compressor.flush()
    trailer = 8 if gzip else 4
    checksum = zlib.crc32 if gzip else zlib.adler32
    value = 0 if gzip else 1
    for _ in range(count):
        value = checksum(block, value)
    value = checksum(block[:rest], value)
    if gzip:
        end = end[:-trailer] + struct.pack("<II", value, size & 0xFFFFFFFF)
    else:
        end = end[:-trailer] + struct.pack(">I", value)
    return b"".join([*parts, end])


def _bomb(encoding: str, wbits: int, content_type: str, unit: bytes, size: int) -> Behaviour:
    compressed = _compressed(wbits, unit, size)
    raw = (
        head(
            200,
            [
                ("content-type", content_type),
                ("content-encoding", encoding),
                ("content-length", str(len(compressed))),
            ],
        )
        + compressed
    )

    async def behaviour(_: RawRequest, writer: asyncio.StreamWriter) -> None:
        writer.write(raw)
        await writer.drain()

    return behaviour


def gzip_bomb(
    size: int, *, content_type: str = "application/json", unit: bytes = b"\n"
) -> Behaviour:
    """A small gzip body that decodes to ``size`` bytes of ``unit`` repeated
    (1 GiB of newlines is about 1 MiB on the wire)."""
    return _bomb("gzip", 31, content_type, unit, size)


def deflate_bomb(
    size: int, *, content_type: str = "application/json", unit: bytes = b"\n"
) -> Behaviour:
    """As ``gzip_bomb``, with ``content-encoding: deflate``."""
    return _bomb("deflate", 15, content_type, unit, size)


class HostileServer:
    """Serves ``behaviours`` (by exact path; others get a 404) on 127.0.0.1.

    ``behaviours`` may be changed between phases of a test (``server.behaviours[path] =``).
    """

    def __init__(self, behaviours: Mapping[str, Behaviour] | None = None) -> None:
        self.behaviours: dict[str, Behaviour] = dict(behaviours or {})
        self.requests: list[RawRequest] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hostile-server", daemon=True)
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.origin}/v1"

    def requests_to(self, path: str) -> list[RawRequest]:
        with self._lock:
            return [r for r in self.requests if r.path == path]

    def __enter__(self) -> HostileServer:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the hostile server did not start within 10 s")
        if self._error is not None:
            raise RuntimeError("the hostile server failed to start") from self._error
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported by __enter__ if it happens before ready
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.add(task)  # type: ignore[arg-type]
            try:
                await self._serve_connection(reader, writer)
            except asyncio.CancelledError:
                pass  # the server is stopping: end quietly (asyncio logs a cancelled handler)
            finally:
                tasks.discard(task)  # type: ignore[arg-type]
                writer.close()

        server = await asyncio.start_server(connected, "127.0.0.1", 0, backlog=256)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        for task in list(tasks):
            task.cancel()
        for task in list(tasks):
            with contextlib.suppress(BaseException):
                await task
        await server.wait_closed()

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """One request per connection: every behaviour owns the socket until it returns."""
        try:
            raw_head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            return
        if len(raw_head) > _MAX_HEAD_BYTES:
            return
        request_line, *header_lines = raw_head.decode("latin-1").split("\r\n")
        method, path, _ = [*request_line.split(" ", 2), "", ""][:3]
        headers: dict[str, str] = {}
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        length = headers.get("content-length", "0")
        try:
            body = await reader.readexactly(int(length)) if length.isdigit() else b""
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        request = RawRequest(method, path.split("?", 1)[0], headers, body)
        with self._lock:
            self.requests.append(request)
        behaviour = self.behaviours.get(request.path)
        if behaviour is None:
            behaviour = answer(404, {"error": {"message": f"no behaviour for {request.path}"}})
        with contextlib.suppress(ConnectionError):
            await behaviour(request, writer)
            await writer.drain()
