"""Many concurrent calls on one event loop: stormguard's CPU and added latency at 1,000.

    .venv/bin/python bench/bench_concurrency.py [--calls 1000] [--rounds 5]
        [--http httpx2,httpx,aiohttp,mock,mock-given] [--profile N] [--handoff SLOTS]

A local server in its own process (``--serve``, below: raw asyncio, no framework,
file limit raised, backlog 4096) answers every chat completion after ``--delay``
seconds (1 s), sleeping on its event loop, so it holds all 1,000 calls at once.
Two clients on one event loop, both allowed 1,000+ pooled connections: a raw
``AsyncClient`` posting and decoding the JSON (``json.loads``, the least any
client does), and ``stormguard.AsyncClient`` with its default policy (adaptive
concurrency limiter and retry budget on, telemetry with no provider) over the
pool its user would have: its own default pool (httpx's client, sized with
``connection_limits``) for httpx, the ``httpx2.AsyncClient`` passed as
``http_client`` for httpx2. ``--http`` names the pools, one run each: httpx,
httpx2, ``mock``, an in-process httpx transport that answers after the delay (no
sockets, no pool) under stormguard's default pool, or ``mock-given``, the same
transport in a plain ``httpx.AsyncClient`` passed as ``http_client`` (which takes
httpx's whole ``Client.send``, as raw httpx does). At 1,000 connections
httpcore's pool scans every connection per request and costs far more than
either client, so only the mock shows the clients' own work. ``aiohttp``:
stormguard with ``http_backend="aiohttp"`` against raw aiohttp
(``ClientSession.post`` and ``json.loads``, a connector of the same size), with a
third client in the same interleaved rounds: openai-python over
``openai.DefaultAioHttpClient`` (same limits, openai's defaults otherwise), and a
fourth: stormguard's aiohttp transport alone (``transport alone``: the request its
own pool builds, sent, the body read and decoded; no pipeline), the floor under
every resilience feature.

A cold round of new clients comes first, the calls at once: its connections are
new and stormguard's limiter starts at ``initial_limit`` (20), so calls queue
while the limit doubles per round trip (the limiter working, not overhead). Then
interleaved warm rounds of the same clients (raw, stormguard, raw, ...), the
calls at once (``asyncio.gather``), then arriving evenly over one delay.
Measured per round: the client's CPU per call (this process's CPU time over the
round / calls; the server is another process) and each call's added latency
(its wall time, from its task's first step to its decoded result, minus the
server's delay); the figures are medians over rounds (CPU) and quantiles over
every call of those rounds (latency). The garbage collector's share is measured
with them (``gc.callbacks``): the time in collections per call, by generation, and
the full (generation-2) collections per round. Python runs a full collection once
the objects that survived into the oldest generation since the last one exceed a
quarter of it, so what drives them is how many tracked objects each call keeps
alive while it waits: one more round of each client counts them (``gc.get_objects``
half-way through the server's delay, against before it). ``--handoff`` measures
only the limiter's hand-off from a release to the waiting task, in process.

Targets: CPU per call <= 1.2x raw httpx's (on aiohttp, <= 1.5x raw aiohttp's); the p99 of
the added latency < 5 ms (no lock convoy). ``--profile N`` runs cProfile over one
warm stormguard round. Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import io
import json
import pstats
import resource
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import httpx2

import stormguard
from stormguard._io.own_pool import OwnAsyncClient
from zero_server import COMPLETION, OK, in_process, read_request

MESSAGES = [{"role": "user", "content": "Say hello"}]
BODY = {"model": "slow", "messages": MESSAGES, "max_tokens": 16}
KEY = "bench"


def _raise_file_limit() -> None:
    """1,000 sockets need more than the usual soft limit of 1,024 descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or soft < hard):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# -- the server ------------------------------------------------------------------------


async def _serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float
) -> None:
    try:
        while True:
            await read_request(reader)
            await asyncio.sleep(delay)
            writer.write(OK)
            await writer.drain()
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(port: int, delay: float) -> None:
    _raise_file_limit()
    server = await asyncio.start_server(
        lambda r, w: _serve_connection(r, w, delay), "127.0.0.1", port, backlog=4096
    )
    print(f"ready on 127.0.0.1:{port}", flush=True)
    async with server:
        await server.serve_forever()


@contextlib.contextmanager
def slow_server(delay: float) -> Iterator[str]:
    """Start the server in its own process on a free loopback port; yield its /v1 URL."""
    with in_process(
        lambda port: [str(Path(__file__)), "--serve", str(port), "--delay", str(delay)]
    ) as port:
        yield f"http://127.0.0.1:{port}/v1"


# -- the clients -----------------------------------------------------------------------


Call = Callable[[], Awaitable[object]]
#: How long every pool keeps an idle connection: longer than the other clients'
#: rounds between two of its own, so that no client reconnects its 1,000 each round
#: (httpx's default is 5 s, aiohttp's 15 s: at their defaults the rounds measured
#: stormguard's connects and not raw aiohttp's).
KEEPALIVE_S = 120.0
#: stormguard's CPU per call against the raw client's, by pool: 1.5x raw aiohttp's on
#: its aiohttp backend, 1.2x raw httpx's elsewhere.
TARGETS = {"aiohttp": 1.5, "httpx": 1.2, "httpx2": 1.2, "mock": 1.2, "mock-given": 1.2}
HTTP_LIBRARIES = {"httpx": httpx, "httpx2": httpx2}


def pool_limits(calls: int, module: Any = httpx) -> Any:
    """``module.Limits`` (httpx's or httpx2's) of every pool here: room for every
    call, its idle connections kept ``KEEPALIVE_S``."""
    return module.Limits(
        max_connections=calls + 24,
        max_keepalive_connections=calls + 24,
        keepalive_expiry=KEEPALIVE_S,
    )


def _pool(library: str, calls: int, **options: object) -> httpx.AsyncClient:
    """An ``AsyncClient`` of ``library`` whose pool holds every call's connection;
    ``library`` "mock" is httpx with an in-process transport that answers after
    the delay (no sockets, no pool: what is left is the clients' own work)."""
    if library == "mock":
        transport = _mock_transport(float(options.pop("delay")))  # type: ignore[arg-type]
        client: httpx.AsyncClient = httpx.AsyncClient(transport=transport, **options)  # type: ignore[arg-type]
        return client
    options.pop("delay")
    module = HTTP_LIBRARIES[library]
    limits = pool_limits(calls, module)
    client = module.AsyncClient(limits=limits, timeout=60, **options)
    return client


def _mock_transport(delay: float) -> httpx.MockTransport:
    return httpx.MockTransport(partial(_answer_later, delay))


async def _answer_later(delay: float, request: httpx.Request) -> httpx.Response:
    await request.aread()
    await asyncio.sleep(delay)
    return httpx.Response(200, headers={"content-type": "application/json"}, content=COMPLETION)


def raw_client(
    base_url: str, calls: int, library: str, delay: float
) -> tuple[Call, Callable[[], Awaitable[None]]]:
    if library == "aiohttp":
        return _raw_aiohttp(base_url, calls)
    library = library.removesuffix("-given")  # raw httpx has no pool but the one it is given
    client = _pool(library, calls, delay=delay, headers={"authorization": f"Bearer {KEY}"})
    url = f"{base_url}/chat/completions"

    async def call() -> object:
        return json.loads((await client.post(url, json=BODY)).content)

    return call, client.aclose


def _raw_aiohttp(base_url: str, calls: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
    """aiohttp's ``ClientSession.post`` and ``json.loads``, on a connector sized as
    the other pools."""
    import aiohttp

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=calls + 24, keepalive_timeout=KEEPALIVE_S),
        headers={"authorization": f"Bearer {KEY}"},
    )
    url = f"{base_url}/chat/completions"

    async def call() -> object:
        async with session.post(url, json=BODY) as response:
            return json.loads(await response.read())

    return call, session.close


def transport_floor(base_url: str, calls: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
    """stormguard's aiohttp transport alone, no pipeline above it: the request the
    own pool builds (URL parsed once, the same headers), handed to the transport,
    its body read through httpx's stream and decoded. What a call on the aiohttp
    backend costs before any resilience feature: the floor the pipeline sits on."""
    from stormguard._io.aiohttp_transport import AiohttpTransport

    limits = pool_limits(calls)
    transport = AiohttpTransport(limits=limits, verify=True)
    url = httpx.URL(f"{base_url}/chat/completions")
    body = json.dumps(BODY).encode()
    headers = httpx.Headers(
        {
            "accept": "application/json",
            "accept-encoding": "gzip, deflate",
            "user-agent": "stormguard",
            "authorization": f"Bearer {KEY}",
            "content-type": "application/json",
        }
    )
    timeout = {"connect": 60.0, "read": 60.0, "write": 60.0, "pool": 60.0}

    async def call() -> object:
        request = httpx.Request(
            "POST", url, content=body, headers=headers, extensions={"timeout": timeout}
        )
        response = await transport.handle_async_request(request)
        try:
            return json.loads(b"".join([piece async for piece in response.aiter_raw()]))
        finally:
            await response.aclose()

    return call, transport.aclose


def openai_client(base_url: str, calls: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
    """openai-python over ``openai.DefaultAioHttpClient`` (its aiohttp transport, on
    httpx2 in openai 3.x), sized as the other pools. openai's own defaults otherwise
    (``max_retries=2``): the server never fails, so no retry is ever made."""
    import openai

    limits = pool_limits(calls, httpx2)
    client = openai.AsyncOpenAI(
        base_url=base_url,
        api_key=KEY,
        timeout=60,
        http_client=openai.DefaultAioHttpClient(limits=limits),
    )

    def call() -> Awaitable[object]:
        return client.chat.completions.create(model="slow", messages=MESSAGES, max_tokens=16)  # type: ignore[arg-type]

    return call, client.close


def guard_client(
    base_url: str, calls: int, library: str, delay: float
) -> tuple[Call, Callable[[], Awaitable[None]], stormguard.AsyncClient]:
    """stormguard's default policy over the pool a user of ``library`` gets: its own
    (httpx's ``AsyncClient`` subclassed, as by default) sized by ``connection_limits``
    for httpx, over the mock's transport for "mock"; the pool passed as
    ``http_client`` for httpx2 (how openai-python 3.x users bring theirs) and for
    "mock-given" (the mock as a pool of your own, which takes httpx's whole
    ``Client.send``). The same limits either way."""
    http: httpx.AsyncClient | None = None
    limits = None
    if library in ("httpx", "aiohttp"):
        limits = pool_limits(calls)
    elif library == "mock":
        # The default pool's class over the mock's transport: stormguard builds this
        # pool itself, and no public option hands it a transport.
        http = OwnAsyncClient(transport=_mock_transport(delay), mounts={})
    else:
        http = _pool(library.removesuffix("-given"), calls, delay=delay)
    client = stormguard.AsyncClient(
        base_url=base_url,
        api_key=KEY,
        model="slow",
        timeout=60,
        http_client=http,
        connection_limits=limits,
        http_backend="aiohttp" if library == "aiohttp" else None,
    )

    async def close() -> None:
        await client.close()
        if http is not None:
            await http.aclose()

    def call() -> Awaitable[object]:
        return client.chat.completions.create(messages=MESSAGES, max_tokens=16)

    return call, close, client


# -- measuring -------------------------------------------------------------------------


_BATCHES = 100


class _Collections:
    """The time the garbage collector spends in collections while entered, and their
    count, by generation (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.seconds = [0.0, 0.0, 0.0]
        self.count = [0, 0, 0]
        self._start = 0.0

    def __call__(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
            return
        generation = info["generation"]
        self.seconds[generation] += time.perf_counter() - self._start
        self.count[generation] += 1

    def __enter__(self) -> _Collections:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self)


@dataclass
class Round:
    cpu_per_call: float
    wall: float
    added: list[float]  # seconds per call beyond the server's delay
    failed: int = 0  # calls that raised (counted, not timed)
    gc_per_call: tuple[float, float, float] = (0.0, 0.0, 0.0)  # seconds, by generation
    full_collections: int = 0  # generation-2 collections in the round


async def one_round(call: Call, calls: int, delay: float, spread: float = 0.0) -> Round:
    """``calls`` calls at once (``spread`` 0), or arriving evenly over ``spread``
    seconds in 100 batches (each measured from its own start)."""
    added: list[float] = []
    failed: list[BaseException] = []

    async def timed() -> None:
        start = time.perf_counter()
        try:
            await call()
        except Exception as exc:  # e.g. a connect timeout while the pool starves the loop
            failed.append(exc)
            return
        added.append(time.perf_counter() - start - delay)

    with _Collections() as collections:
        cpu, wall = time.process_time(), time.perf_counter()
        if not spread:
            await asyncio.gather(*(timed() for _ in range(calls)))
        else:
            step = -(-calls // _BATCHES)
            tasks: list[asyncio.Task[None]] = []
            while len(tasks) < calls:
                due = min(calls, int((time.perf_counter() - wall) / spread * _BATCHES + 1) * step)
                tasks += [asyncio.create_task(timed()) for _ in range(due - len(tasks))]
                await asyncio.sleep(spread / _BATCHES)
            await asyncio.gather(*tasks)
        cpu_per_call = (time.process_time() - cpu) / calls
    gen0, gen1, gen2 = (seconds / calls for seconds in collections.seconds)
    return Round(
        cpu_per_call,
        time.perf_counter() - wall,
        sorted(added),
        len(failed),
        (gen0, gen1, gen2),
        collections.count[2],
    )


async def alive_per_call(call: Call, calls: int, delay: float) -> float:
    """The tracked objects each of ``calls`` calls at once keeps alive while it waits
    for the server: ``gc.get_objects()`` half-way through the delay, against before
    the round (both after a full collection)."""
    gc.collect()
    before = len(gc.get_objects())
    tasks = [asyncio.create_task(call()) for _ in range(calls)]
    await asyncio.sleep(delay / 2)
    gc.collect()
    during = len(gc.get_objects())
    await asyncio.gather(*tasks, return_exceptions=True)
    return (during - before - 1) / calls  # less the list of tasks


def quantile(sorted_values: list[float], q: float) -> float:
    return sorted_values[min(int(q * len(sorted_values)), len(sorted_values) - 1)]


def line(name: str, rounds: list[Round]) -> str:
    added = sorted(x for r in rounds for x in r.added)
    cpu = statistics.median(r.cpu_per_call for r in rounds)
    wall = statistics.median(r.wall for r in rounds)
    gc_each = [statistics.median(r.gc_per_call[g] for r in rounds) * 1e6 for g in range(3)]
    full = statistics.median(r.full_collections for r in rounds)
    return (
        f"  {name:<22} cpu/call {cpu * 1e6:7.0f} us   round {wall:6.2f} s   added p50 "
        f"{quantile(added, 0.5) * 1e3:7.1f} ms  p99 {quantile(added, 0.99) * 1e3:7.1f} ms"
        f"  max {added[-1] * 1e3:7.1f} ms"
        + (f"  FAILED {failed}" if (failed := sum(r.failed for r in rounds)) else "")
        + f"\n  {'':<22} gc/call {sum(gc_each):7.0f} us   by generation"
        f" {gc_each[0]:.0f} / {gc_each[1]:.0f} / {gc_each[2]:.0f} us,"
        f" full collections per round {full:g}"
    )


async def run(args: argparse.Namespace, base_url: str, library: str) -> None:
    calls, delay = args.calls, args.delay
    print(f"== {library} (load average at start: {_loadavg()})")

    # Cold: a new client of each kind, new connections, the limiter at its start.
    raw_call, raw_close = raw_client(base_url, calls, library, delay)
    cold_raw = await one_round(raw_call, calls, delay)
    guard_call, guard_close, guard = guard_client(base_url, calls, library, delay)
    cold_guard = await one_round(guard_call, calls, delay)
    limiter = guard._core.limiter
    print(f"cold round ({calls} calls at once, new clients and connections):")
    print(line("raw", [cold_raw]))
    print(line("stormguard", [cold_guard]))
    if limiter is not None:
        print(f"  stormguard's limiter after it: {limiter.state()}")

    peers: dict[str, Call] = {}
    closes = [raw_close, guard_close]
    if library == "aiohttp":
        openai_call, openai_close = openai_client(base_url, calls)
        await one_round(openai_call, calls, delay)  # cold, like the others
        peers["openai+aiohttp"] = openai_call
        closes.append(openai_close)
        floor_call, floor_close = transport_floor(base_url, calls)
        await one_round(floor_call, calls, delay)
        peers["transport alone"] = floor_call
        closes.append(floor_close)
    for spread in (0.0, delay):
        await warm_rounds(args, raw_call, guard_call, spread, peers, target=TARGETS[library])
    if limiter is not None:
        print(f"  stormguard's limiter after them: {limiter.state()}")
    each = {"raw": raw_call, "stormguard": guard_call, **peers}
    alive = {name: await alive_per_call(call, calls, delay) for name, call in each.items()}
    print(
        "  tracked objects alive per in-flight call: "
        + ", ".join(f"{name} {count:.1f}" for name, count in alive.items())
    )
    print(f"  load average at end: {_loadavg()}")

    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        await one_round(guard_call, calls, delay)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(args.profile)
        print(out.getvalue())
    for close in closes:
        await close()


async def warm_rounds(
    args: argparse.Namespace,
    raw_call: Call,
    guard_call: Call,
    spread: float,
    peers: dict[str, Call] | None = None,
    *,
    target: float,
) -> None:
    """Interleaved rounds of the same (warm) clients (and ``peers``, other clients
    measured alongside); the medians, the spread and the targets."""
    calls, delay = args.calls, args.delay
    each = {"raw": raw_call, "stormguard": guard_call, **(peers or {})}
    per: dict[str, list[Round]] = {name: [] for name in each}
    for _ in range(args.rounds):
        for name, call in each.items():
            per[name].append(await one_round(call, calls, delay, spread))
    how = f"arriving over {spread:g} s" if spread else "at once"
    print(f"warm rounds ({args.rounds} interleaved, {calls} calls {how} each):")
    for name, rounds in per.items():
        print(line(name, rounds))
        print(f"    cpu/call per round (us): {[round(r.cpu_per_call * 1e6) for r in rounds]}")
    for name in per:
        if name not in ("raw", "stormguard"):
            peer = zip(per["raw"], per[name], strict=True)
            ratio = statistics.median(p.cpu_per_call / r.cpu_per_call for r, p in peer)
            print(f"  cpu {name} / raw = {ratio:.2f}")
    pairs = zip(per["raw"], per["stormguard"], strict=True)
    ratios = [g.cpu_per_call / r.cpu_per_call for r, g in pairs]
    ratio = statistics.median(ratios)
    p99 = quantile(sorted(x for r in per["stormguard"] for x in r.added), 0.99)
    raw_p99 = quantile(sorted(x for r in per["raw"] for x in r.added), 0.99)
    print(
        f"  cpu stormguard / raw = {ratio:.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f};"
        f" target <= {target:g}): {'met' if ratio <= target else 'MISSED'}"
    )
    print(
        f"  added p99 stormguard {p99 * 1e3:.1f} ms, raw {raw_p99 * 1e3:.1f} ms"
        f" (target < 5 ms): {'met' if p99 < 0.005 else 'MISSED'}"
    )


async def handoff(tasks: int, slots: int, turns: int) -> tuple[list[float], float]:
    """The limiter's hand-off alone, in process: ``tasks`` tasks, each ``turns`` times,
    take a slot of a fixed limit of ``slots`` (or wait for one), hold it one turn
    of the loop and give it back. Returns each grant's delay (from the release
    that grants it to the waiting task running) and the CPU per slot taken."""
    from stormguard import ConcurrencyLimiter
    from stormguard._policies.limiter.slot_waiter import SlotWaiter

    limiter = ConcurrencyLimiter(initial_limit=slots, max_limit=slots)
    limit = limiter.endpoint("bench:1")
    delays: list[float] = []

    async def worker() -> None:
        for _ in range(turns):
            got = limit.acquire(1, limiter.next_seq(), deadline_at=time.monotonic() + 600)
            if isinstance(got, SlotWaiter):
                lease = await got.wait_async(600)
                delays.append(time.monotonic() - lease.granted_at)
            else:
                lease = got
            await asyncio.sleep(0)
            lease.release()  # outcome IGNORED: the limit stays where it is

    cpu = time.process_time()
    await asyncio.gather(*(worker() for _ in range(tasks)))
    return sorted(delays), (time.process_time() - cpu) / (tasks * turns)


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=1000, help="concurrent calls per round")
    parser.add_argument("--rounds", type=int, default=5, help="warm rounds per client")
    parser.add_argument("--delay", type=float, default=1.0, help="the server's answer time")
    parser.add_argument(
        "--http",
        default="httpx2,httpx",
        help="pools under both clients, comma-separated (httpx, httpx2, aiohttp, mock, mock-given)",
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="cProfile one warm stormguard round; print the top N functions",
    )
    parser.add_argument(
        "--handoff",
        type=int,
        default=0,
        metavar="SLOTS",
        help="only the limiter's hand-off in process: --calls tasks over SLOTS slots",
    )
    parser.add_argument("--serve", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(_serve(args.serve, args.delay))
        return
    _raise_file_limit()
    if args.handoff:
        delays, cpu = asyncio.run(handoff(args.calls, args.handoff, 5))
        print(
            f"limiter hand-off, {args.calls} tasks over {args.handoff} slots: cpu/slot"
            f" {cpu * 1e6:.1f} us, delay p50 {quantile(delays, 0.5) * 1e6:.0f} us"
            f" p99 {quantile(delays, 0.99) * 1e6:.0f} us"
        )
        return
    with slow_server(args.delay) as base_url:
        for library in args.http.split(","):
            asyncio.run(run(args, base_url, library))


if __name__ == "__main__":
    main()
