"""Streaming: chunks per second per core, stormguard against raw httpx, raw aiohttp and openai.

    .venv/bin/python bench/bench_streaming.py [--rounds 5] [--long 10000]
        [--streams 200] [--chunks 500] [--profile]

Every client reads the same streamed chat completion from a zero-latency stub in
its own process (bench/zero_stream_server.py), in two arrival modes:

* per event: one HTTP chunk per SSE event, as vLLM sends them;
* bulk: the same events in HTTP chunks of 64 KiB cut wherever the 64 KiB fall,
  as a buffering proxy passes them on (nginx with ``proxy_buffering on``), or a
  replay or an engine faster than the network: some 300 events per read, so
  the client's own CPU per event is all that is left.

Three loads per mode: one stream of ``--long`` chunks (sync and async), then
``--streams`` concurrent streams of ``--chunks`` chunks each on one event loop.
The measure is chunks per second of this process's CPU time (not wall time: the
server and anything else on the machine are left out), so a client bound by its
own CPU reads that many chunks per second per core.

* raw httpx: ``iter_lines``/``aiter_lines`` and ``json.loads`` of each data line,
  the least any client over httpx does;
* raw aiohttp (async): ``ClientSession.post``, ``resp.content.iter_any()`` split
  into lines by hand and ``json.loads`` of each data line (``async for line in
  resp.content`` awaits a ``readline`` per line and reads half as many);
* stormguard: ``Stream``/``AsyncStream`` (the whole pipeline on: budget, breaker,
  adaptive concurrency limit, deadline, telemetry with no provider); async also on
  its aiohttp backend (``http_backend="aiohttp"``: ``stormguard+aiohttp``);
* openai-python: its ``Stream``/``AsyncStream``, ``max_retries=0``; async also on
  ``openai.DefaultAioHttpClient()`` (its aiohttp transport: ``openai+aiohttp``).

Rounds are interleaved (httpx, stormguard, openai, httpx, ...) so drift hits all
alike; a client's figure is the median over rounds, and each ratio is the median
of the ratios within a round. Then the memory of an open stream: ``--streams``
streams opened at once, each with its first chunk read and the rest held back
by the server, measured with tracemalloc (Python allocations: the response,
connection, buffers and the client's own state) and divided by their number.

Targets: stormguard >= 0.7x raw httpx and >= 2x openai-python, in both modes;
async, stormguard on aiohttp >= 0.7x raw aiohttp.
``--profile`` runs cProfile over stormguard's reading of one long stream (sync,
each mode) and of the concurrent load (async) and prints where the time goes.
Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import json
import os
import pstats
import statistics
import time
import tracemalloc
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import httpx
import openai

import stormguard
from zero_stream_server import running

MESSAGES = [{"role": "user", "content": "Say hello"}]
OAI_MESSAGES: Any = MESSAGES  # openai types them as TypedDicts
KEY = "bench"
#: How long every pool keeps an idle connection: longer than the other clients'
#: rounds between two of its own, so that none reconnects its 200 each round
#: (httpx's default is 5 s, aiohttp's 15 s).
KEEPALIVE_S = 300.0
#: Enough for every load here: no client waits for a connection or a slot.
LIMITS = httpx.Limits(
    max_connections=1000, max_keepalive_connections=300, keepalive_expiry=KEEPALIVE_S
)
TIMEOUT = 60.0
#: The stub's model for each arrival mode (bench/zero_stream_server.py).
ARRIVALS = {"per event": "zero", "bulk": "bulk"}

SyncReader = Callable[[int, str], int]
AsyncReader = Callable[[int, str], Awaitable[int]]


def _body(chunks: int, model: str) -> dict[str, Any]:
    return {"model": model, "messages": MESSAGES, "max_tokens": chunks, "stream": True}


def _count_lines(lines: Any) -> int:
    """Raw httpx's least work per event: each data line decoded as JSON."""
    count = 0
    for line in lines:
        if line.startswith("data: ") and line != "data: [DONE]":
            json.loads(line[6:])
            count += 1
    return count


def _guard_limiter() -> stormguard.ConcurrencyLimiter:
    return stormguard.ConcurrencyLimiter(initial_limit=250)


def sync_readers(base_url: str) -> dict[str, SyncReader]:
    raw = httpx.Client(headers={"authorization": f"Bearer {KEY}"}, timeout=TIMEOUT)
    guard = stormguard.Client(
        base_url=base_url, api_key=KEY, model="zero", timeout=TIMEOUT, concurrency=_guard_limiter()
    )
    oai = openai.OpenAI(base_url=base_url, api_key=KEY, timeout=TIMEOUT, max_retries=0)
    url = f"{base_url}/chat/completions"

    def read_raw(chunks: int, model: str) -> int:
        with raw.stream("POST", url, json=_body(chunks, model)) as response:
            return _count_lines(response.iter_lines())

    def read_guard(chunks: int, model: str) -> int:
        stream = guard.chat.completions.create(
            messages=MESSAGES, model=model, max_tokens=chunks, stream=True
        )
        return sum(1 for _ in stream)

    def read_openai(chunks: int, model: str) -> int:
        stream = oai.chat.completions.create(
            model=model,
            messages=OAI_MESSAGES,
            max_tokens=chunks,
            stream=True,
        )
        return sum(1 for _ in stream)

    return {"httpx": read_raw, "stormguard": read_guard, "openai": read_openai}


class AsyncReaders:
    """Each client's async reader of one stream, and of one open stream held at its
    first chunk (for the memory figure). Made on the event loop that uses it."""

    def __init__(self, base_url: str) -> None:
        self.url = f"{base_url}/chat/completions"
        headers = {"authorization": f"Bearer {KEY}"}
        self.raw = httpx.AsyncClient(headers=headers, timeout=TIMEOUT, limits=LIMITS)
        self.aio = aiohttp.ClientSession(
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=TIMEOUT),
            connector=aiohttp.TCPConnector(limit=1000, keepalive_timeout=KEEPALIVE_S),
        )
        self.guard = stormguard.AsyncClient(
            base_url=base_url,
            api_key=KEY,
            model="zero",
            timeout=TIMEOUT,
            concurrency=_guard_limiter(),
            connection_limits=LIMITS,
        )
        self.guard_aio = stormguard.AsyncClient(
            base_url=base_url,
            api_key=KEY,
            model="zero",
            timeout=TIMEOUT,
            concurrency=_guard_limiter(),
            connection_limits=LIMITS,
            http_backend="aiohttp",
        )
        self.oai = openai.AsyncOpenAI(
            base_url=base_url, api_key=KEY, timeout=TIMEOUT, max_retries=0
        )
        self.oai_aio = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=KEY,
            timeout=TIMEOUT,
            max_retries=0,
            http_client=openai.DefaultAioHttpClient(limits=LIMITS),
        )
        self.read: dict[str, AsyncReader] = {
            "httpx": self.read_raw,
            "aiohttp": self.read_aiohttp,
            "stormguard": self.read_guard,
            "stormguard+aiohttp": self.read_guard_aiohttp,
            "openai": self.read_openai,
            "openai+aiohttp": self.read_openai_aiohttp,
        }
        self.open: dict[str, Callable[[], Awaitable[Any]]] = {
            "httpx": self.open_raw,
            "aiohttp": self.open_aiohttp,
            "stormguard": self.open_guard,
            "stormguard+aiohttp": self.open_guard_aiohttp,
            "openai": self.open_openai,
            "openai+aiohttp": self.open_openai_aiohttp,
        }

    async def close(self) -> None:
        await self.raw.aclose()
        await self.aio.close()
        await self.guard.close()
        await self.guard_aio.close()
        await self.oai.close()
        await self.oai_aio.close()

    async def read_raw(self, chunks: int, model: str) -> int:
        async with self.raw.stream("POST", self.url, json=_body(chunks, model)) as response:
            count = 0
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    json.loads(line[6:])
                    count += 1
            return count

    async def read_aiohttp(self, chunks: int, model: str) -> int:
        async with self.aio.post(self.url, json=_body(chunks, model)) as response:
            count = 0
            rest = b""
            async for piece in response.content.iter_any():
                lines = (rest + piece).split(b"\n") if rest else piece.split(b"\n")
                rest = lines.pop()  # a line still arriving
                for line in lines:
                    if line.startswith(b"data: ") and line != b"data: [DONE]":
                        json.loads(line[6:])
                        count += 1
            return count

    async def read_guard(self, chunks: int, model: str) -> int:
        return await self._read_guard(self.guard, chunks, model)

    async def read_guard_aiohttp(self, chunks: int, model: str) -> int:
        return await self._read_guard(self.guard_aio, chunks, model)

    @staticmethod
    async def _read_guard(client: stormguard.AsyncClient, chunks: int, model: str) -> int:
        stream = await client.chat.completions.create(
            messages=MESSAGES, model=model, max_tokens=chunks, stream=True
        )
        return await _acount(stream)

    async def read_openai(self, chunks: int, model: str) -> int:
        stream = await self.oai.chat.completions.create(
            model=model,
            messages=OAI_MESSAGES,
            max_tokens=chunks,
            stream=True,
        )
        return await _acount(stream)

    async def read_openai_aiohttp(self, chunks: int, model: str) -> int:
        stream = await self.oai_aio.chat.completions.create(
            model=model,
            messages=OAI_MESSAGES,
            max_tokens=chunks,
            stream=True,
        )
        return await _acount(stream)

    async def open_raw(self) -> Callable[[], Awaitable[None]]:
        request = self.raw.build_request("POST", self.url, json=_body(1, "hold"))
        response = await self.raw.send(request, stream=True)
        lines = response.aiter_lines()
        async for line in lines:
            if line.startswith("data: "):
                json.loads(line[6:])
                break
        return response.aclose

    async def open_aiohttp(self) -> Callable[[], Awaitable[None]]:
        response = await self.aio.post(self.url, json=_body(1, "hold"))
        line = await response.content.readline()
        json.loads(line[6:])

        async def close() -> None:
            response.close()

        return close

    async def open_guard(self) -> Callable[[], Awaitable[None]]:
        return await self._open_guard(self.guard)

    async def open_guard_aiohttp(self) -> Callable[[], Awaitable[None]]:
        return await self._open_guard(self.guard_aio)

    @staticmethod
    async def _open_guard(client: stormguard.AsyncClient) -> Callable[[], Awaitable[None]]:
        stream = await client.chat.completions.create(
            messages=MESSAGES, model="hold", max_tokens=1, stream=True
        )
        await stream.__anext__()
        return stream.aclose

    async def open_openai(self) -> Callable[[], Awaitable[None]]:
        return await self._open_openai(self.oai)

    async def open_openai_aiohttp(self) -> Callable[[], Awaitable[None]]:
        return await self._open_openai(self.oai_aio)

    @staticmethod
    async def _open_openai(client: openai.AsyncOpenAI) -> Callable[[], Awaitable[None]]:
        stream = await client.chat.completions.create(
            model="hold",
            messages=OAI_MESSAGES,
            max_tokens=1,
            stream=True,
        )
        await stream.__anext__()
        return stream.close


async def _acount(stream: AsyncIterator[object]) -> int:
    count = 0
    async for _ in stream:
        count += 1
    return count


def _cpu_rate(read: Callable[[], int]) -> float:
    """Chunks per CPU second of this process while ``read`` runs."""
    start = time.process_time()
    chunks = read()
    return chunks / (time.process_time() - start)


async def _acpu_rate(read: Callable[[], Awaitable[int]]) -> float:
    start = time.process_time()
    chunks = await read()
    return chunks / (time.process_time() - start)


def _summary(rates: dict[str, list[float]]) -> dict[str, Any]:
    """Medians over rounds, and the median of each round's ratios of stormguard's
    rate to each other client's (and, async, of stormguard on aiohttp to raw aiohttp)."""
    rounds = range(len(rates["httpx"]))
    guard = rates["stormguard"]
    figures = {
        "rates": {name: statistics.median(values) for name, values in rates.items()},
        "spread": {name: (min(values), max(values)) for name, values in rates.items()},
        "ratios": {
            name: statistics.median(guard[i] / values[i] for i in rounds)
            for name, values in rates.items()
            if not name.startswith("stormguard")
        },
    }
    if "stormguard+aiohttp" in rates:
        guard_aio, raw_aio = rates["stormguard+aiohttp"], rates["aiohttp"]
        figures["aiohttp_ratio"] = statistics.median(guard_aio[i] / raw_aio[i] for i in rounds)
    return figures


def measure_sync(
    readers: dict[str, SyncReader], chunks: int, model: str, rounds: int
) -> dict[str, Any]:
    for read in readers.values():  # connections, imports and caches
        assert read(200, model) == 200
    rates: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(rounds):
        for name, read in readers.items():
            rates[name].append(_cpu_rate(lambda read=read: read(chunks, model)))  # type: ignore[misc]
    return _summary(rates)


async def measure_async_one(
    readers: AsyncReaders, chunks: int, model: str, rounds: int
) -> dict[str, Any]:
    for read in readers.read.values():
        assert await read(200, model) == 200
    rates: dict[str, list[float]] = {name: [] for name in readers.read}
    for _ in range(rounds):
        for name, read in readers.read.items():
            rates[name].append(await _acpu_rate(lambda read=read: read(chunks, model)))  # type: ignore[misc]
    return _summary(rates)


async def _many(read: AsyncReader, streams: int, chunks: int, model: str) -> int:
    counts = await asyncio.gather(*(read(chunks, model) for _ in range(streams)))
    assert all(count == chunks for count in counts), counts
    return sum(counts)


async def measure_async_many(
    readers: AsyncReaders, streams: int, chunks: int, model: str, rounds: int
) -> dict[str, Any]:
    for read in readers.read.values():  # open the pool's connections
        await _many(read, streams, 20, model)
    rates: dict[str, list[float]] = {name: [] for name in readers.read}
    for _ in range(rounds):
        for name, read in readers.read.items():
            rates[name].append(
                await _acpu_rate(lambda read=read: _many(read, streams, chunks, model))  # type: ignore[misc]
            )
    return _summary(rates)


async def memory_per_stream(readers: AsyncReaders, streams: int) -> dict[str, float]:
    """KiB of Python allocations per open stream, ``streams`` open at once."""
    kib: dict[str, float] = {}
    for name, open_one in readers.open.items():
        for close in await asyncio.gather(*(open_one() for _ in range(5))):  # warm up
            await close()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        closers = await asyncio.gather(*(open_one() for _ in range(streams)))
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        for close in closers:
            await close()
        kib[name] = held / streams / 1024
    return kib


def report(title: str, figures: dict[str, Any]) -> None:
    rates, ratios = figures["rates"], figures["ratios"]
    print(f"{title}: chunks per CPU second (median of rounds; min-max)")
    for name, rate in rates.items():
        low, high = figures["spread"][name]
        print(f"  {name:<18} {rate / 1000:8.1f} k/s  ({low / 1000:.1f}-{high / 1000:.1f})")
    to_raw, to_oai = ratios["httpx"], ratios["openai"]
    verdict = "met" if to_raw >= 0.7 and to_oai >= 2 else "MISSED"
    print(
        f"  stormguard / httpx = {to_raw:.2f} (target >= 0.7), "
        f"stormguard / openai = {to_oai:.2f} (target >= 2): {verdict}"
    )
    others = [name for name in ratios if name not in ("httpx", "openai")]
    if others:
        print("  stormguard / " + ", ".join(f"{name} = {ratios[name]:.2f}" for name in others))
    if "aiohttp_ratio" in figures:
        to_aio = figures["aiohttp_ratio"]
        print(
            f"  stormguard+aiohttp / aiohttp = {to_aio:.2f} (target >= 0.7): "
            + ("met" if to_aio >= 0.7 else "MISSED")
        )


def _print_profile(profiler: cProfile.Profile, title: str) -> None:
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
    print(f"--- profile: {title}")
    print(out.getvalue())


def profile(base_url: str, args: argparse.Namespace) -> None:
    """cProfile of stormguard alone: one long stream (sync) in each mode, the
    concurrent load (async)."""
    read = sync_readers(base_url)["stormguard"]
    for mode, model in ARRIVALS.items():
        read(200, model)
        profiler = cProfile.Profile()
        profiler.runcall(read, args.long, model)
        _print_profile(profiler, f"sync, one stream of {args.long} chunks, {mode}")

    async def run() -> None:
        readers = AsyncReaders(base_url)
        await _many(readers.read_guard, args.streams, 20, "zero")
        profiler = cProfile.Profile()
        profiler.enable()
        await _many(readers.read_guard, args.streams, args.chunks, "zero")
        profiler.disable()
        _print_profile(profiler, f"async, {args.streams} streams of {args.chunks} chunks")
        await readers.close()

    asyncio.run(run())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--long", type=int, default=10_000, help="chunks of the one long stream")
    parser.add_argument("--streams", type=int, default=200, help="concurrent streams")
    parser.add_argument("--chunks", type=int, default=500, help="chunks of each concurrent stream")
    parser.add_argument("--profile", action="store_true", help="cProfile stormguard only")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()}")
    with running() as base_url:
        if args.profile:
            profile(base_url, args)
            return
        readers = sync_readers(base_url)
        for mode, model in ARRIVALS.items():
            report(
                f"sync, one stream of {args.long}, {mode}",
                measure_sync(readers, args.long, model, args.rounds),
            )

        async def run() -> dict[str, float]:
            readers = AsyncReaders(base_url)
            for mode, model in ARRIVALS.items():
                report(
                    f"async, one stream of {args.long}, {mode}",
                    await measure_async_one(readers, args.long, model, args.rounds),
                )
            for mode, model in ARRIVALS.items():
                report(
                    f"async, {args.streams} concurrent streams of {args.chunks}, {mode}",
                    await measure_async_many(
                        readers, args.streams, args.chunks, model, args.rounds
                    ),
                )
            kib = await memory_per_stream(readers, args.streams)
            await readers.close()
            return kib

        kib = asyncio.run(run())
        print(f"memory per open stream ({args.streams} open, tracemalloc):")
        for name, size in kib.items():
            print(f"  {name:<18} {size:6.1f} KiB")
    print(f"load average at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
