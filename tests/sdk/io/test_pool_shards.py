"""The client's own pool split into shards: the limits divided, a request sent to
the least busy shard and counted there until its body is closed, and the
default clients over a real server on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

import stormguard
from stormguard._io.pool_shards import (
    SHARD_CONNECTIONS,
    AsyncShardedTransport,
    ShardedTransport,
    pool_transport,
    shard_limits,
)
from tests.sdk.helpers import local, own_pools

# -- the limits ------------------------------------------------------------------------


def test_limits_that_fit_one_shard_are_not_split() -> None:
    for limits in (
        httpx.Limits(max_connections=SHARD_CONNECTIONS, max_keepalive_connections=5),
        httpx.Limits(max_connections=None, max_keepalive_connections=20),
    ):
        assert shard_limits(limits) == [limits]


def test_the_default_limits_are_divided_exactly() -> None:
    parts = shard_limits(httpx.Limits(max_connections=1000, max_keepalive_connections=100))
    assert len(parts) == 32
    assert all(part.max_connections is not None for part in parts)
    assert max(part.max_connections or 0 for part in parts) <= SHARD_CONNECTIONS
    assert sum(part.max_connections or 0 for part in parts) == 1000
    assert sum(part.max_keepalive_connections or 0 for part in parts) == 100
    assert [p.max_connections for p in parts[:9]] == [32] * 8 + [31]  # the first take more
    assert all(part.keepalive_expiry == 5.0 for part in parts)


def test_each_shard_keeps_an_idle_connection_when_any_may_be_kept() -> None:
    few = shard_limits(httpx.Limits(max_connections=200, max_keepalive_connections=3))
    assert [p.max_keepalive_connections for p in few] == [1] * 7
    none = shard_limits(httpx.Limits(max_connections=200, max_keepalive_connections=0))
    assert {p.max_keepalive_connections for p in none} == {0}
    unlimited = shard_limits(httpx.Limits(max_connections=200, max_keepalive_connections=None))
    assert {p.max_keepalive_connections for p in unlimited} == {None}


def test_pool_transport_splits_only_what_does_not_fit() -> None:
    def sync(limits: httpx.Limits) -> httpx.BaseTransport:
        return httpx.HTTPTransport(limits=limits)

    def in_async(limits: httpx.Limits) -> httpx.AsyncBaseTransport:
        return httpx.AsyncHTTPTransport(limits=limits)

    one = pool_transport(sync, httpx.Limits(max_connections=10))
    assert isinstance(one, httpx.HTTPTransport)
    sharded = pool_transport(sync, httpx.Limits(max_connections=100))
    assert isinstance(sharded, ShardedTransport)
    pools: list[Any] = [shard.transport._pool for shard in sharded.shards]  # type: ignore[attr-defined]
    assert [pool._max_connections for pool in pools] == [25, 25, 25, 25]
    asynced = pool_transport(in_async, httpx.Limits(max_connections=100))
    assert isinstance(asynced, AsyncShardedTransport) and len(asynced.shards) == 4
    for transport in (one, sharded):
        transport.close()


# -- routing, with recording transports -------------------------------------------------


class _Body(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A body left open until read or closed (``content=`` would be read at once)."""

    def __iter__(self) -> Iterator[bytes]:
        yield b"{}"

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield b"{}"


class _Recording(httpx.BaseTransport, httpx.AsyncBaseTransport):
    """A shard that records which requests it got; fails when asked to."""

    def __init__(self, index: int, log: list[int], fail: bool = False) -> None:
        self.index, self.log, self.fail, self.closed = index, log, fail, False

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Recording) and other.index == self.index

    def _answer(self) -> httpx.Response:
        self.log.append(self.index)
        if self.fail:
            raise httpx.ConnectError("refused")
        return httpx.Response(200, stream=_Body())

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        return self._answer()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return self._answer()

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


def _sharded(count: int) -> tuple[ShardedTransport, list[int]]:
    log: list[int] = []
    return ShardedTransport([_Recording(i, log) for i in range(count)]), log


def _send(transport: ShardedTransport) -> httpx.Response:
    return transport.handle_request(httpx.Request("POST", "http://llm.test/v1/x"))


def test_one_request_at_a_time_always_takes_the_first_shard() -> None:
    transport, log = _sharded(4)
    for _ in range(5):
        response = _send(transport)
        assert response.read() == b"{}"
        response.close()
    assert log == [0] * 5
    assert [s.in_flight for s in transport.shards] == [0, 0, 0, 0]


def test_requests_in_flight_spread_and_a_closed_body_frees_its_shard() -> None:
    transport, log = _sharded(3)
    held = [_send(transport) for _ in range(4)]
    assert log == [0, 1, 2, 0]  # the least busy, the first on a tie
    assert [s.in_flight for s in transport.shards] == [2, 1, 1]
    held[1].close()
    held[1].close()  # closed twice: counted once
    assert [s.in_flight for s in transport.shards] == [2, 0, 1]
    held.append(_send(transport))
    assert log[-1] == 1
    for response in held:
        response.close()
    assert [s.in_flight for s in transport.shards] == [0, 0, 0]


def test_a_send_that_fails_is_not_counted() -> None:
    log: list[int] = []
    transport = ShardedTransport([_Recording(0, log, fail=True), _Recording(1, log)])
    with pytest.raises(httpx.ConnectError):
        _send(transport)
    assert [s.in_flight for s in transport.shards] == [0, 0]
    assert log == [0]


def test_closing_the_transport_closes_every_shard() -> None:
    transport, _ = _sharded(3)
    transport.close()
    assert all(s.transport.closed for s in transport.shards)  # type: ignore[attr-defined]


def test_threads_sharing_the_transport_leave_every_count_at_zero() -> None:
    transport, log = _sharded(4)

    def work(_: int) -> None:
        for _ in range(200):
            _send(transport).close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(work, range(8)))
    assert len(log) == 1600
    assert [s.in_flight for s in transport.shards] == [0, 0, 0, 0]


async def test_the_async_transport_routes_and_counts_the_same_way() -> None:
    log: list[int] = []
    transport = AsyncShardedTransport([_Recording(i, log) for i in range(3)])
    request = httpx.Request("POST", "http://llm.test/v1/x")
    held = [await transport.handle_async_request(request) for _ in range(4)]
    assert log == [0, 1, 2, 0]
    await held[2].aclose()
    await held[2].aclose()
    assert [s.in_flight for s in transport.shards] == [2, 1, 0]
    assert await held[0].aread() == b"{}"
    for response in held:
        await response.aclose()
    assert [s.in_flight for s in transport.shards] == [0, 0, 0]
    failing = AsyncShardedTransport([_Recording(0, log, fail=True)])
    with pytest.raises(httpx.ConnectError):
        await failing.handle_async_request(request)
    assert failing.shards[0].in_flight == 0
    await transport.aclose()
    assert all(s.transport.closed for s in transport.shards)  # type: ignore[attr-defined]


# -- the default clients over a real server ---------------------------------------------

COMPLETION = json.dumps(
    {
        "id": "c",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    #: When set, each request waits until this many are in the server at once.
    together: threading.Barrier | None = None
    connections: set[tuple[str, int]]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a connection serves request after request
    server: _Server

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        self.server.connections.add(self.client_address)
        if self.server.together is not None:
            self.server.together.wait(timeout=30)
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(COMPLETION)))
        self.end_headers()
        self.wfile.write(COMPLETION)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    httpd = _Server(("127.0.0.1", 0), _Handler)
    httpd.connections = set()
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


def _url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/v1"


MESSAGES = [{"role": "user", "content": "hi"}]
LIMITS = httpx.Limits(max_connections=4 * SHARD_CONNECTIONS, max_keepalive_connections=8)


def _idle_per_shard(client: stormguard.Client | stormguard.AsyncClient) -> list[int]:
    return [len(pool._pool.connections) for pool in own_pools(client)]


def test_the_sync_client_reuses_one_connection_and_spreads_a_burst(server: _Server) -> None:
    with stormguard.Client(
        base_url=_url(server), api_key="k", model="m", connection_limits=LIMITS
    ) as client:
        transport = local(client._http._transport)
        assert isinstance(transport, ShardedTransport)
        for _ in range(3):
            client.chat.completions.create(messages=MESSAGES)
        assert len(server.connections) == 1  # one call at a time: one connection
        assert _idle_per_shard(client) == [1, 0, 0, 0]

        server.together = threading.Barrier(8)  # 8 calls in the server at once
        with ThreadPoolExecutor(8) as pool:
            done = list(
                pool.map(lambda _: client.chat.completions.create(messages=MESSAGES), range(8))
            )
        assert all(c.choices[0].message.content == "hi" for c in done)
        assert _idle_per_shard(client) == [2, 2, 2, 2]
        assert [s.in_flight for s in transport.shards] == [0, 0, 0, 0]


async def test_the_async_client_reuses_one_connection_and_spreads_a_burst(
    server: _Server,
) -> None:
    async with stormguard.AsyncClient(
        base_url=_url(server), api_key="k", model="m", connection_limits=LIMITS
    ) as client:
        transport = local(client._http._transport)
        assert isinstance(transport, AsyncShardedTransport)
        for _ in range(3):
            await client.chat.completions.create(messages=MESSAGES)
        assert len(server.connections) == 1
        assert _idle_per_shard(client) == [1, 0, 0, 0]

        server.together = threading.Barrier(8)
        done = await asyncio.gather(
            *(client.chat.completions.create(messages=MESSAGES) for _ in range(8))
        )
        assert all(c.choices[0].message.content == "hi" for c in done)
        assert _idle_per_shard(client) == [2, 2, 2, 2]
        assert [s.in_flight for s in transport.shards] == [0, 0, 0, 0]


async def test_the_shards_of_a_default_pool_share_one_tls_context() -> None:
    """Each TLS context loads the CA bundle (about 20 ms): 32 of them made a client
    take 0.7 s to build."""
    with stormguard.Client(base_url="https://llm.test/v1") as client:
        pools = own_pools(client)
        assert len(pools) == 32 and len({id(pool._pool._ssl_context) for pool in pools}) == 1
    async with stormguard.AsyncClient(base_url="https://llm.test/v1") as aclient:
        pools = own_pools(aclient)
        assert len(pools) == 32 and len({id(pool._pool._ssl_context) for pool in pools}) == 1
