"""The async client's own pool on aiohttp (``AsyncClient(http_backend="aiohttp")``).

Everything above the transport must see what it sees on httpx's pool: the same
requests on the wire, the same httpx errors for the same misbehaviour of a server
(each scenario below runs on both backends and expects httpcore's error), the pool's
limits, the environment's proxies, the TLS context, bodies handed over undecoded.
A body closed before its end, or a send cancelled, must close its connection so the
server sees the client leave; a body read to its end gives its connection back.
Every server here is real, raw asyncio on 127.0.0.1 and the test's own loop.
"""

from __future__ import annotations

import asyncio
import gc
import gzip
import json
import socket
import ssl
import struct
import sys
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import stormguard
from stormguard._call.drivers import BACKEND_VARIABLE, http_backend, http_pool_async
from stormguard._call.unclosed import settled
from tests.e2e.echo_server import self_signed
from tests.sdk.helpers import MESSAGES, chat_json

Handler = Callable[["Wire", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
#: What aiohttp says of a session, connector, connection or response left unclosed.
AIOHTTP_WARNINGS = ("Unclosed client session", "Unclosed connector", "Unclosed connection")
LIMITS = httpx.Limits(max_connections=10, max_keepalive_connections=5, keepalive_expiry=7.0)


class Wire:
    """A raw HTTP/1.1 server: ``handler`` owns each connection. It counts the
    connections opened, and sets ``left`` when a client closes one (EOF or reset)."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.opened = 0
        self.open_now = 0
        self.most_open = 0
        self.left = asyncio.Event()
        self.requests: list[tuple[bytes, dict[str, str], bytes]] = []
        self.port = 0
        self.tasks: set[asyncio.Task[Any]] = set()
        self._arrived = asyncio.Condition()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        """Read one request; its request line, headers (as sent) and body recorded."""
        head = await reader.readuntil(b"\r\n\r\n")
        line, *rest = head.decode("latin-1").split("\r\n")
        headers = dict(h.split(": ", 1) for h in rest if h)  # as sent: names in their case
        length = int({k.lower(): v for k, v in headers.items()}.get("content-length", "0"))
        body = await reader.readexactly(length)
        self.requests.append((line.encode(), headers, body))
        async with self._arrived:
            self._arrived.notify_all()
        return body

    async def received(self, count: int) -> None:
        """Wait until ``count`` requests have arrived."""
        async with self._arrived:
            await self._arrived.wait_for(lambda: len(self.requests) >= count)

    async def until_left(self, reader: asyncio.StreamReader) -> None:
        """Wait for the client to close the connection."""
        try:
            while await reader.read(65536):
                pass
        except ConnectionError:
            pass
        self.left.set()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self.tasks.add(task)
        self.opened += 1
        self.open_now += 1
        self.most_open = max(self.most_open, self.open_now)
        try:
            await self.handler(self, reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            self.left.set()
        except asyncio.CancelledError:
            pass  # the server stops
        finally:
            self.open_now -= 1
            self.tasks.discard(task)
            writer.close()


@asynccontextmanager
async def serving(handler: Handler, tls: ssl.SSLContext | None = None) -> AsyncIterator[Wire]:
    wire = Wire(handler)
    server = await asyncio.start_server(wire._connected, "127.0.0.1", 0, ssl=tls)
    wire.port = server.sockets[0].getsockname()[1]
    try:
        yield wire
    finally:
        server.close()
        for task in list(wire.tasks):
            task.cancel()
        await asyncio.gather(*wire.tasks, return_exceptions=True)
        await server.wait_closed()


def reply(body: bytes, *headers: str, status: str = "200 OK") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"content-length: {len(body)}", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


CHAT = json.dumps(chat_json("hello")).encode()


async def keep_alive(wire: Wire, reader: asyncio.StreamReader, writer: Any) -> None:
    """Answer every request on the connection, keeping it open."""
    while True:
        try:
            await wire.read_request(reader)
        except asyncio.IncompleteReadError:
            wire.left.set()
            return
        writer.write(reply(CHAT, "content-type: application/json"))
        await writer.drain()


def pool(backend: str, limits: httpx.Limits = LIMITS) -> httpx.AsyncClient:
    return http_pool_async(None, limits, backend)


async def send(
    http: httpx.AsyncClient, url: str, *, read: float | None = 5.0, pool_wait: float = 5.0
) -> httpx.Response:
    timeout = {"connect": 5.0, "read": read, "write": 5.0, "pool": pool_wait}
    request = http.build_request(
        "POST", f"{url}/chat/completions", content=b"{}", extensions={"timeout": timeout}
    )
    return await http.send(request, stream=True)


def client(url: str, **options: Any) -> stormguard.AsyncClient:
    options.setdefault("timeout", 10)
    return stormguard.AsyncClient(base_url=url, api_key="sk-test", model="m", **options)


# -- the same errors as httpcore's, for the same wire event --------------------------------


async def closes_at_once(wire: Wire, reader: asyncio.StreamReader, writer: Any) -> None:
    await wire.read_request(reader)


async def truncated(wire: Wire, reader: asyncio.StreamReader, writer: Any) -> None:
    await wire.read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10)
    await writer.drain()


async def reset(wire: Wire, reader: asyncio.StreamReader, writer: Any) -> None:
    await wire.read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n" + b"x" * 10)
    await writer.drain()
    await asyncio.sleep(0.05)  # the head and the first bytes read before the reset
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()  # an RST, not a FIN


def answers(raw: bytes) -> Handler:
    async def handler(wire: Wire, reader: asyncio.StreamReader, writer: Any) -> None:
        await wire.read_request(reader)
        writer.write(raw)
        await writer.drain()

    return handler


async def silent(wire: Wire, reader: asyncio.StreamReader, writer: Any) -> None:
    await wire.read_request(reader)
    await wire.until_left(reader)


SCENARIOS: dict[str, tuple[Handler, type[httpx.TransportError]]] = {
    "closed before answering": (closes_at_once, httpx.RemoteProtocolError),
    "a body cut short of its length": (truncated, httpx.RemoteProtocolError),
    "a reset in the body": (reset, httpx.ReadError),
    "a broken status line": (answers(b"HTTP/1.1 abc\r\n\r\n"), httpx.RemoteProtocolError),
    "a broken header": (
        answers(b"HTTP/1.1 200 OK\r\nno colon here\r\ncontent-length: 0\r\n\r\n"),
        httpx.RemoteProtocolError,
    ),
    "a broken chunk": (
        answers(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n"),
        httpx.RemoteProtocolError,
    ),
    "no answer within the read timeout": (silent, httpx.ReadTimeout),
}


@pytest.mark.parametrize("backend", ["httpx", "aiohttp"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
async def test_each_wire_failure_raises_httpcores_error_with_its_request(
    backend: str, scenario: str
) -> None:
    handler, expected = SCENARIOS[scenario]
    http = pool(backend)
    async with serving(handler) as wire:
        with pytest.raises(httpx.TransportError) as caught:
            response = await send(http, wire.url, read=0.3)
            try:
                await response.aread()
            finally:
                await response.aclose()
    await http.aclose()
    assert type(caught.value) is expected, repr(caught.value)
    assert caught.value.request.url == f"{wire.url}/chat/completions"


@pytest.mark.parametrize("backend", ["httpx", "aiohttp"])
async def test_a_refused_connection_is_a_connect_error(backend: str) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    http = pool(backend)
    with pytest.raises(httpx.ConnectError):
        await send(http, f"http://127.0.0.1:{port}/v1")
    await http.aclose()


async def test_a_full_pool_waits_no_longer_than_the_pool_timeout() -> None:
    """httpx raises ``PoolTimeout`` here, aiohttp one timeout for the wait and the
    connect: ``ConnectTimeout``. Both are ``APITimeoutError`` above."""
    http = pool("aiohttp", httpx.Limits(max_connections=1))
    async with serving(silent) as wire:
        held = asyncio.ensure_future(send(http, wire.url, read=None))
        await wire.received(1)
        with pytest.raises(httpx.ConnectTimeout):
            await send(http, wire.url, pool_wait=0.2)
        held.cancel()
        await asyncio.gather(held, return_exceptions=True)
    await http.aclose()


async def test_the_call_sees_the_same_errors_through_the_client() -> None:
    async with serving(closes_at_once) as wire:
        for backend in ("httpx", "aiohttp"):
            async with client(wire.url, http_backend=backend, max_retries=0) as each:
                with pytest.raises(stormguard.APIConnectionError) as caught:
                    await each.chat.completions.create(messages=MESSAGES)
            assert "RemoteProtocolError" in str(caught.value)
            assert caught.value.request is not None


# -- the request on the wire, the body handed over undecoded ------------------------------


async def test_the_request_on_the_wire_is_the_one_httpx_sends() -> None:
    async with serving(keep_alive) as wire:
        for backend in ("httpx", "aiohttp"):
            async with client(wire.url, http_backend=backend) as each:
                await each.chat.completions.create(messages=MESSAGES, max_tokens=3)
        (line_x, headers_x, body_x), (line_a, headers_a, body_a) = wire.requests
    assert (line_a, body_a) == (line_x, body_x)
    deadline = "x-request-deadline-ms"  # the time left: a millisecond or two apart
    assert {k: v for k, v in headers_a.items() if k != deadline} == {
        k: v for k, v in headers_x.items() if k != deadline
    }
    assert list(headers_a) == list(headers_x)  # the same names, in the same order


async def test_the_response_headers_are_the_ones_httpx_reads() -> None:
    sent = (
        "Content-Type: application/json",
        "X-RateLimit-Remaining-Requests: 7",
        "set-cookie: a=1",
        "Set-Cookie: b=2",
        "x-empty: ",
        "x-latin: caf\xe9",
    )

    async def headed(wire: Wire, reader: asyncio.StreamReader, writer: Any) -> None:
        while True:
            await wire.read_request(reader)
            writer.write(reply(CHAT, *sent).replace(b"caf\xc3\xa9", b"caf\xe9"))
            await writer.drain()

    async with serving(headed) as wire:
        got = []
        for backend in ("httpx", "aiohttp"):
            async with pool(backend) as http:
                response = await http.post(f"{wire.url}/chat/completions", content=b"{}")
            got.append(response.headers)
    from_httpx, from_aiohttp = got
    assert from_aiohttp.raw == from_httpx.raw  # names as sent, values, order, repeats
    assert from_aiohttp.multi_items() == from_httpx.multi_items()
    assert from_aiohttp.get_list("set-cookie") == ["a=1", "b=2"]
    assert from_aiohttp["x-latin"] == from_httpx["x-latin"]


async def test_a_compressed_body_is_decoded_by_httpx_and_capped_decoded() -> None:
    packed = gzip.compress(CHAT)
    big = gzip.compress(b" " * (4 << 20) + CHAT)  # 4 MiB decoded, 4 KB on the wire

    async def compressed(wire: Wire, reader: asyncio.StreamReader, writer: Any) -> None:
        await wire.read_request(reader)
        body = packed if wire.opened == 1 else big
        gzipped = ("content-type: application/json", "content-encoding: gzip")
        writer.write(reply(body, *gzipped, "connection: close"))
        await writer.drain()

    cap = 1 << 20
    async with (
        serving(compressed) as wire,
        client(wire.url, http_backend="aiohttp", max_response_bytes=cap) as each,
    ):
        resp = await each.chat.completions.create(messages=MESSAGES)
        assert resp.choices[0].message.content == "hello"
        with pytest.raises(stormguard.APIResponseValidationError, match="max_response_bytes"):
            await each.chat.completions.create(messages=MESSAGES)


# -- the pool: limits, connections kept and closed ---------------------------------------


async def test_the_pool_holds_its_limits_unsharded() -> None:
    http = pool("aiohttp", httpx.Limits(max_connections=2, keepalive_expiry=7.0))
    gate = asyncio.Event()

    async def held(wire: Wire, reader: asyncio.StreamReader, writer: Any) -> None:
        await wire.read_request(reader)
        await gate.wait()
        writer.write(reply(CHAT))
        await writer.drain()

    async with serving(held) as wire:
        calls = [asyncio.ensure_future(send(http, wire.url)) for _ in range(5)]
        await wire.received(2)
        gate.set()
        for response in await asyncio.gather(*calls):
            await response.aread()
    assert (len(wire.requests), wire.most_open) == (5, 2)  # three waited for a connection
    connector = http._transport.transport._session.connector  # type: ignore[attr-defined]
    assert (connector.limit, connector._keepalive_timeout) == (2, 7.0)
    await http.aclose()
    assert connector.closed


async def test_a_body_read_to_its_end_gives_its_connection_back() -> None:
    async with serving(keep_alive) as wire:
        async with client(wire.url, http_backend="aiohttp") as each:
            for _ in range(3):
                await each.chat.completions.create(messages=MESSAGES)
        assert (len(wire.requests), wire.opened) == (3, 1)


async def test_a_body_closed_before_its_end_closes_its_connection() -> None:
    async def endless(wire: Wire, reader: asyncio.StreamReader, writer: Any) -> None:
        await wire.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
        writer.write(b"transfer-encoding: chunked\r\n\r\n")
        event = b'data: {"choices": []}\n\n'
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
        await wire.until_left(reader)

    async with serving(endless) as wire, client(wire.url, http_backend="aiohttp") as each:
        async with each.chat.completions.with_streaming_response.create(
            messages=MESSAGES, stream=True
        ) as response:
            async for _ in response.iter_bytes():
                break
        await asyncio.wait_for(wire.left.wait(), 5)


async def test_a_cancelled_send_closes_its_connection() -> None:
    async with serving(silent) as wire, client(wire.url, http_backend="aiohttp") as each:
        call = asyncio.ensure_future(each.chat.completions.create(messages=MESSAGES))
        await wire.received(1)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        await asyncio.wait_for(wire.left.wait(), 5)


async def test_a_call_past_its_deadline_closes_its_connection() -> None:
    async with serving(silent) as wire:
        each = client(wire.url, http_backend="aiohttp", timeout=0.3, max_retries=0)
        async with each:
            with pytest.raises(stormguard.APITimeoutError):
                await each.chat.completions.create(messages=MESSAGES)
            await asyncio.wait_for(wire.left.wait(), 5)


# -- proxies and TLS, as the own pool sets them up ------------------------------------------


async def test_the_environment_proxy_carries_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    async with serving(keep_alive) as proxy:
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        async with client("http://llm.invalid/v1", http_backend="aiohttp") as each:
            resp = await each.chat.completions.create(messages=MESSAGES)
    assert resp.choices[0].message.content == "hello"
    line, headers, _ = proxy.requests[0]
    assert line == b"POST http://llm.invalid/v1/chat/completions HTTP/1.1"
    assert {k.lower(): v for k, v in headers.items()}["host"] == "llm.invalid"


async def test_no_proxy_sends_straight(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = sock.getsockname()[1]
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{dead}")  # would refuse
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    async with serving(keep_alive) as wire, client(wire.url, http_backend="aiohttp") as each:
        await each.chat.completions.create(messages=MESSAGES)
    assert len(wire.requests) == 1


async def test_tls_uses_the_pools_context(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cert, key = self_signed(tmp_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    async with serving(keep_alive, tls=context) as wire:
        url = wire.url.replace("http:", "https:")
        async with client(url, http_backend="aiohttp", max_retries=0) as each:
            with pytest.raises(stormguard.APIConnectionError, match="ConnectError"):
                await each.chat.completions.create(messages=MESSAGES)  # not trusted
        monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # the pool's context trusts it
        async with client(url, http_backend="aiohttp") as each:
            resp = await each.chat.completions.create(messages=MESSAGES)
    assert resp.choices[0].message.content == "hello"


# -- choosing it -------------------------------------------------------------------------


def test_the_backend_is_asked_for_or_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(BACKEND_VARIABLE, raising=False)
    assert http_backend(None, None) == "httpx"
    assert http_backend("aiohttp", None) == "aiohttp"
    monkeypatch.setenv(BACKEND_VARIABLE, "aiohttp")
    assert http_backend(None, None) == "aiohttp"
    assert http_backend("httpx", None) == "httpx"
    assert http_backend(None, httpx.AsyncClient()) == "httpx"  # your pool, as it is
    monkeypatch.setenv(BACKEND_VARIABLE, "requests")
    with pytest.raises(ValueError, match=BACKEND_VARIABLE):
        http_backend(None, None)
    with pytest.raises(ValueError, match="http_backend"):
        http_backend("curl", None)


def test_a_backend_with_your_own_http_client_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="http_backend"):
        stormguard.AsyncClient(
            base_url="http://x.test/v1", http_client=httpx.AsyncClient(), http_backend="aiohttp"
        )


def test_the_sync_client_has_no_backend_option() -> None:
    with pytest.raises(TypeError, match="http_backend"):
        stormguard.Client(base_url="http://x.test/v1", http_backend="aiohttp")  # type: ignore[call-arg]


def test_aiohttp_missing_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "aiohttp", None)  # import aiohttp: ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "stormguard._io.aiohttp_transport", raising=False)
    with pytest.raises(ImportError, match=r"pip install 'stormguard\[aiohttp\]'"):
        stormguard.AsyncClient(base_url="http://x.test/v1", http_backend="aiohttp")


async def test_off_asyncio_httpxs_transport_serves(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp runs on asyncio only: a loop of another kind (trio) gets httpx's pool."""
    from stormguard._io import aiohttp_transport

    monkeypatch.setattr(aiohttp_transport, "running_loop", lambda: None)
    async with serving(keep_alive) as wire, client(wire.url, http_backend="aiohttp") as each:
        await each.chat.completions.create(messages=MESSAGES)
        transport = each._http._transport.transport  # type: ignore[attr-defined]
        assert transport._session is None and transport.fallback is not None


# -- close, and a client left unclosed ------------------------------------------------------


async def test_close_and_collection_leave_no_aiohttp_warning() -> None:
    seen: list[str] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: seen.append(context["message"]))
    try:
        async with serving(keep_alive) as wire:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                closed = client(wire.url, http_backend="aiohttp")
                await closed.chat.completions.create(messages=MESSAGES)
                await closed.close()
                left = client(wire.url, http_backend="aiohttp")
                await left.chat.completions.create(messages=MESSAGES)
                http = left._http
                del closed, left
                gc.collect()
                await settled()  # the finalizer hands the pool's close to this loop
                assert http.is_closed
                gc.collect()
        texts = [str(w.message) for w in caught] + seen
        # stormguard's own warning names the client left unclosed; aiohttp says nothing.
        assert [text for text in texts if "Unclosed AsyncClient" in text] != []
        assert [t for t in texts if any(w in t for w in AIOHTTP_WARNINGS)] == [], texts
    finally:
        loop.set_exception_handler(None)
