"""The client's own pool split into shards of at most 32 connections, so that a
thousand calls in flight do not each pay for a look at a thousand connections.

httpcore's pool looks at every connection it holds whenever a request enters or
leaves it (``_assign_requests_to_connections``: each idle connection's expiry,
which probes its socket, and a count of the idle ones for each idle one). Its
CPU per request grows with the connections it holds, and at a thousand it is
far more than the call itself: 21 to 25 ms of CPU per request with httpcore 1.0.9,
against 1.1 to 1.6 ms in 32 pools of at most 32 (docs/benchmarks.md, "1,000
concurrent calls"). httpcore offers no knob for it, so the pool is split: the same
connections held by several pools, each request paying for a look at its own
pool only. No connection code of our own: every shard is httpx's transport,
made by the caller's factory (a ``DeadlineTransport`` for the sync client).

A request goes to the shard with the fewest requests in flight, the first one
of those on a tie. One call at a time always goes to the first shard and reuses
its connections; a burst spreads evenly, so no shard's limit is reached while
another has room. A request is in flight from its send until its body is closed
(or its send fails). The limits are divided among the shards (``shard_limits``).
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, Generic, TypeVar, overload

from .._core.http import httpx

__all__ = [
    "SHARD_CONNECTIONS",
    "AsyncShardedTransport",
    "ShardedTransport",
    "pool_transport",
    "shard_limits",
]

#: Connections per shard at most. Smaller costs less per request (16: 15 % less CPU
#: at 1,000 in flight) but makes twice the shards, each keeping fewer idle.
SHARD_CONNECTIONS = 32

_T = TypeVar("_T")


def shard_limits(limits: httpx.Limits) -> list[httpx.Limits]:
    """The limits of each shard ``limits`` makes: one (no split) when they allow at
    most ``SHARD_CONNECTIONS`` connections or any number; else ``limits`` divided
    among shards of at most that many, their sums the limits' own (the first
    shards, which a light load uses most, take what does not divide evenly). A
    shard keeps at least one idle connection when any may be kept."""
    most = limits.max_connections
    if most is None or most <= SHARD_CONNECTIONS:
        return [limits]
    count = -(-most // SHARD_CONNECTIONS)
    idle = limits.max_keepalive_connections
    return [
        httpx.Limits(
            max_connections=_share(most, count, index),
            max_keepalive_connections=None
            if idle is None
            else max(_share(idle, count, index), min(idle, 1)),
            keepalive_expiry=limits.keepalive_expiry,
        )
        for index in range(count)
    ]


def _share(total: int, count: int, index: int) -> int:
    """Shard ``index``'s part of ``total`` divided among ``count``, the first ones
    taking the remainder."""
    return total // count + (index < total % count)


@overload
def pool_transport(
    make: Callable[[httpx.Limits], httpx.BaseTransport], limits: httpx.Limits
) -> httpx.BaseTransport: ...


@overload
def pool_transport(
    make: Callable[[httpx.Limits], httpx.AsyncBaseTransport], limits: httpx.Limits
) -> httpx.AsyncBaseTransport: ...


def pool_transport(make: Callable[[httpx.Limits], Any], limits: httpx.Limits) -> Any:
    """``make(limits)`` when ``limits`` fit one shard; else a sharded transport over
    ``make(part)`` for each shard's part of them, sync or async as ``make``'s
    transports are."""
    each = shard_limits(limits)
    if len(each) == 1:
        return make(limits)
    shards = [make(part) for part in each]
    if isinstance(shards[0], httpx.AsyncBaseTransport):
        return AsyncShardedTransport(shards)
    return ShardedTransport(shards)


class _Shard(Generic[_T]):
    __slots__ = ("in_flight", "transport")

    def __init__(self, transport: _T) -> None:
        self.transport = transport
        self.in_flight = 0


def _least_busy(shards: Sequence[_Shard[_T]]) -> _Shard[_T]:
    """The shard with the fewest requests in flight, the first one on a tie."""
    best = shards[0]
    if best.in_flight:
        for shard in shards:
            if shard.in_flight < best.in_flight:
                best = shard
                if not shard.in_flight:
                    break
    return best


class _Held:
    """A response body that keeps its request counted on its shard until it is
    closed, once (a body closed twice, or a send that failed, counts once)."""

    __slots__ = ("_release", "_stream")

    def __init__(self, stream: Any, release: Callable[[], None]) -> None:
        self._stream = stream
        self._release: Callable[[], None] | None = release

    def _done(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release()


class _HeldStream(_Held, httpx.SyncByteStream):
    def __iter__(self) -> Iterator[bytes]:
        return iter(self._stream)

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._done()


class _HeldAsyncStream(_Held, httpx.AsyncByteStream):
    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._stream.__aiter__()  # type: ignore[no-any-return]

    async def aclose(self) -> None:
        try:
            await self._stream.aclose()
        finally:
            self._done()


class _Shards(Generic[_T]):
    """The shards and their counts: which one a request takes, and its release."""

    def __init__(self, shards: Sequence[_T]) -> None:
        self.shards: tuple[_Shard[_T], ...] = tuple(map(_Shard, shards))
        # A sync client is shared by threads; uncontended on an event loop.
        self._lock = threading.Lock()

    def _take(self) -> tuple[_Shard[_T], Callable[[], None]]:
        """The least busy shard, counted with one more request; the call that
        counts it out again."""
        with self._lock:
            shard = _least_busy(self.shards)
            shard.in_flight += 1

        def release() -> None:
            with self._lock:
                shard.in_flight -= 1

        return shard, release


class ShardedTransport(_Shards[httpx.BaseTransport], httpx.BaseTransport):
    """httpx transports (``shards``, each a pool of its own) used as one (module
    doc). Thread-safe."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        shard, release = self._take()
        try:
            response = shard.transport.handle_request(request)
        except BaseException:
            release()
            raise
        response.stream = _HeldStream(response.stream, release)
        return response

    def close(self) -> None:
        for shard in self.shards:
            shard.transport.close()


class AsyncShardedTransport(_Shards[httpx.AsyncBaseTransport], httpx.AsyncBaseTransport):
    """The async twin of :class:`ShardedTransport`."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        shard, release = self._take()
        try:
            response = await shard.transport.handle_async_request(request)
        except BaseException:
            release()
            raise
        response.stream = _HeldAsyncStream(response.stream, release)
        return response

    async def aclose(self) -> None:
        for shard in self.shards:
            await shard.transport.aclose()
