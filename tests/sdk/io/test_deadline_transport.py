"""The current deadline, and the sync transport that clips every socket operation to it."""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Iterable
from typing import Any

import httpcore
import httpx
import pytest

import stormguard
from stormguard._call.drivers import http_pool_async, http_pool_sync
from stormguard._core.deadline import Deadline, current_deadline
from stormguard._io.deadline_backend import DeadlineBackend, DeadlineStream
from stormguard._io.deadline_transport import DeadlineTransport
from stormguard._io.own_pool import OwnAsyncClient
from stormguard._io.pool_shards import ShardedTransport
from stormguard.testing import FakeClock
from tests.sdk.helpers import local


class RecordingStream(httpcore.NetworkStream):
    """Records the timeout of every operation; a read may be told to time out."""

    def __init__(self) -> None:
        self.timeouts: list[tuple[str, float | None]] = []
        self.time_out = False

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self.timeouts.append(("read", timeout))
        if self.time_out:
            raise httpcore.ReadTimeout("timed out")
        return b"x"

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self.timeouts.append(("write", timeout))

    def close(self) -> None:
        self.timeouts.append(("close", None))


class RecordingBackend(httpcore.NetworkBackend):
    def __init__(self) -> None:
        self.connects: list[float | None] = []
        self.stream = RecordingStream()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        self.connects.append(timeout)
        return self.stream


def test_a_connection_made_after_its_pool_was_closed_is_closed_at_once() -> None:
    """A call that was connecting when close() shut the pool's sockets down gets a
    connection in no pool, which no close reaches: it is closed as soon as made."""

    class ClosedWhileConnecting(RecordingBackend):
        def connect_tcp(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
            backend.closed = True  # the pool closes while the connection is made
            return super().connect_tcp(*args, **kwargs)

    inner = ClosedWhileConnecting()
    backend = DeadlineBackend(inner)
    with pytest.raises(httpcore.ConnectError, match="closed"):
        backend.connect_tcp("127.0.0.1", 80, timeout=10.0)
    assert inner.stream.timeouts == [("close", None)]
    with pytest.raises(httpcore.ConnectError, match="closed"):  # and any later one
        backend.connect_tcp("127.0.0.1", 80, timeout=10.0)


def test_within_is_the_sooner_of_the_deadline_and_a_limit_of_its_own() -> None:
    clock = FakeClock()
    deadline = Deadline(clock, 5.0)
    assert deadline.within(2.0).remaining() == 2.0
    assert deadline.within(9.0) is deadline
    assert deadline.within(None) is deadline
    clock.advance(4.0)
    assert deadline.within(2.0) is deadline  # one second left: the call's is sooner
    unbounded = Deadline(clock, None)
    assert unbounded.within(3.0).remaining() == 3.0 and math.isinf(unbounded.remaining())


def test_bound_makes_a_deadline_current_for_its_block_only() -> None:
    outer, inner = Deadline(FakeClock(), 1.0), Deadline(FakeClock(), 2.0)
    assert current_deadline() is None
    with outer.bound():
        assert current_deadline() is outer
        with inner.bound():
            assert current_deadline() is inner
        assert current_deadline() is outer
    assert current_deadline() is None


def test_a_request_clips_its_writes_and_the_reads_that_answer_it_even_later() -> None:
    clock = FakeClock()
    inner = RecordingStream()
    stream = DeadlineStream(inner, None)
    with Deadline(clock, 2.0).bound():
        stream.write(b"GET / HTTP/1.1\r\n\r\n", timeout=10.0)
    clock.advance(1.5)
    stream.read(100, timeout=10.0)  # outside the block: a stream read in the caller's loop
    stream.read(100, timeout=0.25)  # a shorter timeout of its own is kept
    assert inner.timeouts == [("write", 2.0), ("read", 0.5), ("read", 0.25)]


def test_no_time_left_fails_at_once_without_touching_the_socket() -> None:
    clock = FakeClock()
    inner = RecordingStream()
    stream = DeadlineStream(inner, None)
    with Deadline(clock, 1.0).bound():
        stream.write(b"request", timeout=None)
    clock.advance(1.0)
    with pytest.raises(httpcore.ReadTimeout, match="deadline passed before a read"):
        stream.read(100, timeout=5.0)
    assert inner.timeouts == [("write", 1.0)]


def test_a_timeout_the_deadline_cut_says_so_and_an_own_timeout_does_not() -> None:
    clock = FakeClock()
    inner = RecordingStream()
    inner.time_out = True
    stream = DeadlineStream(inner, None)
    with Deadline(clock, 2.0).bound():
        stream.write(b"request", timeout=None)
    with pytest.raises(httpcore.ReadTimeout, match="deadline passed while reading"):
        stream.read(100, timeout=5.0)
    with pytest.raises(httpcore.ReadTimeout, match=r"^timed out$"):
        stream.read(100, timeout=1.0)


def test_a_request_without_a_deadline_is_not_clipped_nor_held_to_the_last_one() -> None:
    inner = RecordingStream()
    stream = DeadlineStream(inner, None)
    with Deadline(FakeClock(), 1.0).bound():
        stream.write(b"first", timeout=None)
    stream.write(b"second, sent by code that is not a stormguard call", timeout=None)
    stream.read(100, timeout=None)
    with Deadline(FakeClock(), None).bound():  # a call with timeout=None
        stream.write(b"third", timeout=None)
    stream.read(100, timeout=7.0)
    assert inner.timeouts == [
        ("write", 1.0),
        ("write", None),
        ("read", None),
        ("write", None),
        ("read", 7.0),
    ]


def test_connecting_is_clipped_and_the_connection_takes_the_current_deadline() -> None:
    clock = FakeClock()
    backend = RecordingBackend()
    with Deadline(clock, 3.0).bound():
        stream = DeadlineBackend(backend).connect_tcp("127.0.0.1", 80, timeout=10.0)
    clock.advance(1.0)
    stream.read(10, timeout=None)
    assert backend.connects == [3.0]
    assert backend.stream.timeouts == [("read", 2.0)]
    with Deadline(clock, 1.0).bound(), pytest.raises(httpcore.ConnectTimeout):
        clock.advance(1.0)
        DeadlineBackend(backend).connect_tcp("127.0.0.1", 80, timeout=10.0)


def pool_backend(transport: httpx.BaseTransport) -> object:
    return transport._pool._network_backend  # type: ignore[attr-defined]


def test_the_default_sync_client_connects_through_the_deadline_backend() -> None:
    with stormguard.Client(base_url="http://127.0.0.1:9/v1") as client:
        sharded = local(client._http._transport)
        assert isinstance(sharded, ShardedTransport)  # 1,000 connections: 32 pools
        for shard in sharded.shards:
            assert isinstance(shard.transport, DeadlineTransport)
            assert isinstance(pool_backend(shard.transport), DeadlineBackend)
    small = httpx.Limits(max_connections=5)
    with stormguard.Client(base_url="http://127.0.0.1:9/v1", connection_limits=small) as client:
        transport = local(client._http._transport)
        assert isinstance(transport, DeadlineTransport)  # one pool: nothing to split
        assert isinstance(pool_backend(transport), DeadlineBackend)


def test_environment_proxies_are_kept_on_deadline_transports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.test:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    with http_pool_sync(None, httpx.Limits(max_connections=3)) as http:
        mounted = {str(pattern.pattern): local(t) for pattern, t in http._mounts.items()}
    assert isinstance(mounted["https://"], DeadlineTransport)
    assert isinstance(pool_backend(mounted["https://"]), DeadlineBackend)
    assert mounted["all://localhost"] is None  # the default transport: no proxy


async def test_environment_proxies_are_kept_on_the_async_default_pool(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.test:3128")
    monkeypatch.setenv("NO_PROXY", "localhost")
    http = http_pool_async(None, httpx.Limits(max_connections=3))
    async with http:
        mounted = {str(pattern.pattern): local(t) for pattern, t in http._mounts.items()}
    assert isinstance(http, OwnAsyncClient)
    proxy = mounted["https://"]
    assert isinstance(proxy, httpx.AsyncHTTPTransport)
    assert proxy._pool._proxy_url.host == b"proxy.test"  # type: ignore[attr-defined]
    assert proxy._pool._max_connections == 3  # the pool's limits
    assert mounted["all://localhost"] is None  # the default transport: no proxy


def test_a_deadline_transport_takes_the_options_of_httpx_transports() -> None:
    transport = DeadlineTransport(retries=1, limits=httpx.Limits(max_connections=2))
    assert isinstance(pool_backend(transport), DeadlineBackend)
    transport.close()
    with pytest.raises(ValueError, match=r"HTTP/1\.1 only"):
        DeadlineTransport(http2=True)  # one deadline per connection cannot serve multiplexing


class AddressBackend(RecordingBackend):
    """Refuses the addresses in ``refused``; records every address it was asked for."""

    def __init__(self, refused: set[str]) -> None:
        super().__init__()
        self.refused = refused
        self.hosts: list[str] = []

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        self.hosts.append(host)
        if host in self.refused:
            raise httpcore.ConnectError("connection refused")
        return super().connect_tcp(host, port, timeout, local_address, socket_options)


def test_a_resolver_that_hangs_costs_the_connect_no_more_than_the_deadline() -> None:
    release = threading.Event()

    def hanging(host: str, port: int) -> list[str]:
        release.wait(30)
        return ["127.0.0.1"]

    backend = AddressBackend(set())
    try:
        with (
            Deadline(FakeClock(), 0.05).bound(),
            pytest.raises(
                httpcore.ConnectTimeout, match=r"deadline passed while resolving 'llm\.test'"
            ),
        ):
            DeadlineBackend(backend, resolve=hanging).connect_tcp("llm.test", 80, timeout=10.0)
    finally:
        release.set()
    assert backend.hosts == []


def test_a_name_is_resolved_and_its_addresses_tried_in_turn() -> None:
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return ["::1", "127.0.0.1"]

    backend = AddressBackend(refused={"::1"})  # as localhost when nothing listens on IPv6
    with Deadline(FakeClock(), 3.0).bound():
        DeadlineBackend(backend, resolve=resolve).connect_tcp("localhost", 80, timeout=10.0)
        DeadlineBackend(backend, resolve=resolve).connect_tcp("10.0.0.1", 80, timeout=10.0)
    assert asked == ["localhost"]  # an IP address is not looked up
    assert backend.hosts == ["::1", "127.0.0.1", "10.0.0.1"]
    assert backend.connects == [3.0, 3.0]


def test_a_name_that_does_not_resolve_is_a_connect_error() -> None:
    def failing(host: str, port: int) -> list[str]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    with (
        Deadline(FakeClock(), 3.0).bound(),
        pytest.raises(httpcore.ConnectError, match=r"could not resolve 'nowhere\.test'"),
    ):
        DeadlineBackend(RecordingBackend(), resolve=failing).connect_tcp("nowhere.test", 80)
    backend = AddressBackend(refused={"127.0.0.1"})
    with Deadline(FakeClock(), 3.0).bound(), pytest.raises(httpcore.ConnectError, match="refused"):
        DeadlineBackend(backend, resolve=lambda h, p: ["127.0.0.1"]).connect_tcp("a.test", 80)


def test_without_a_deadline_a_name_goes_to_the_backend_as_it_is() -> None:
    backend = AddressBackend(set())

    def unused(host: str, port: int) -> list[str]:
        raise AssertionError("no lookup without a deadline")

    DeadlineBackend(backend, resolve=unused).connect_tcp("llm.test", 80, timeout=4.0)
    assert backend.hosts == ["llm.test"] and backend.connects == [4.0]


def test_your_own_httpx_client_is_held_to_the_calls_deadlines() -> None:
    own = httpx.Client(mounts={"http://proxied.test": httpx.HTTPTransport(proxy="http://p:1")})
    with stormguard.Client(base_url="http://127.0.0.1:9/v1", http_client=own):
        transports = [own._transport, *own._mounts.values()]
        assert len(transports) == 2
        assert all(isinstance(pool_backend(t), DeadlineBackend) for t in transports)  # type: ignore[arg-type]
    stormguard.Client(base_url="http://127.0.0.1:9/v1", http_client=own)  # wrapped once only
    assert not isinstance(pool_backend(own._transport)._backend, DeadlineBackend)  # type: ignore[attr-defined]
    own.close()


def test_a_multiplexing_or_foreign_transport_of_your_own_is_left_as_it_is() -> None:
    h2 = httpx.Client(http2=True) if _has_h2() else None
    mock = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(200)))
    stormguard.Client(base_url="http://127.0.0.1:9/v1", http_client=mock)
    assert isinstance(mock._transport, httpx.MockTransport)
    if h2 is not None:
        stormguard.Client(base_url="http://127.0.0.1:9/v1", http_client=h2)
        assert not isinstance(pool_backend(h2._transport), DeadlineBackend)
        h2.close()


def _has_h2() -> bool:
    try:
        import h2  # noqa: F401
    except ImportError:
        return False
    return True
