"""Per-call overhead: stormguard against raw httpx and the openai package.

    .venv/bin/python bench/bench_overhead.py [--calls 400] [--rounds 7] [--profile]

Each client calls a zero-latency stub server (bench/zero_server.py, its own process)
for the same fixed chat completion, one call at a time, sync and async. Rounds are
interleaved (httpx, stormguard, openai, httpx, ...) so drift hits all alike; the
figure per client is the median over rounds of the mean time per call. Raw httpx
also decodes the JSON body, the least any client does.

Targets: stormguard <= 1.10x raw httpx, and below openai. ``--profile``
runs cProfile over stormguard's sync calls and prints where the time goes.
``--quota-ab`` compares the process's CPU time per sync call with the quota
policy on (the default) and off (``quota=None``), in interleaved rounds: what
a call to a server that sends no quota signal pays for it.
Not a timed test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import pstats
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator

import httpx
import openai

import stormguard
from zero_server import running as zero_server_running

MESSAGES = [{"role": "user", "content": "Say hello"}]
BODY = {"model": "zero", "messages": MESSAGES, "max_tokens": 16}
KEY = "bench"


@contextlib.contextmanager
def zero_server() -> Iterator[str]:
    """Start bench/zero_server.py; yield its /v1 base URL; stop it."""
    with zero_server_running() as root:
        yield f"{root}/v1"


def sync_callers(base_url: str) -> dict[str, Callable[[], object]]:
    raw = httpx.Client(headers={"authorization": f"Bearer {KEY}"})
    guard = stormguard.Client(base_url=base_url, api_key=KEY, model="zero", timeout=30)
    oai = openai.OpenAI(base_url=base_url, api_key=KEY, timeout=30)
    url = f"{base_url}/chat/completions"
    return {
        "httpx": lambda: raw.post(url, json=BODY).json(),
        "stormguard": lambda: guard.chat.completions.create(messages=MESSAGES, max_tokens=16),
        "openai": lambda: oai.chat.completions.create(
            model="zero",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=16,
        ),
    }


def async_callers(base_url: str) -> dict[str, Callable[[], Awaitable[object]]]:
    raw = httpx.AsyncClient(headers={"authorization": f"Bearer {KEY}"})
    guard = stormguard.AsyncClient(base_url=base_url, api_key=KEY, model="zero", timeout=30)
    oai = openai.AsyncOpenAI(base_url=base_url, api_key=KEY, timeout=30)
    url = f"{base_url}/chat/completions"

    async def raw_call() -> object:
        return (await raw.post(url, json=BODY)).json()

    return {
        "httpx": raw_call,
        "stormguard": lambda: guard.chat.completions.create(messages=MESSAGES, max_tokens=16),
        "openai": lambda: oai.chat.completions.create(
            model="zero",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=16,
        ),
    }


def measure_sync(
    callers: dict[str, Callable[[], object]], calls: int, rounds: int
) -> dict[str, float]:
    per_round: dict[str, list[float]] = {name: [] for name in callers}
    for call in callers.values():  # warm up connections and caches
        for _ in range(50):
            call()
    for _ in range(rounds):
        for name, call in callers.items():
            start = time.perf_counter()
            for _ in range(calls):
                call()
            per_round[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(values) for name, values in per_round.items()}


async def measure_async(
    callers: dict[str, Callable[[], Awaitable[object]]], calls: int, rounds: int
) -> dict[str, float]:
    per_round: dict[str, list[float]] = {name: [] for name in callers}
    for call in callers.values():
        for _ in range(50):
            await call()
    for _ in range(rounds):
        for name, call in callers.items():
            start = time.perf_counter()
            for _ in range(calls):
                await call()
            per_round[name].append((time.perf_counter() - start) / calls)
    return {name: statistics.median(values) for name, values in per_round.items()}


def report(title: str, figures: dict[str, float]) -> None:
    base, guard, oai = figures["httpx"], figures["stormguard"], figures["openai"]
    print(f"{title}: time per call (median of round means)")
    for name, seconds in figures.items():
        print(f"  {name:<11} {seconds * 1e6:8.1f} us   {seconds / base:5.2f}x httpx")
    verdict = "met" if guard <= 1.10 * base and guard < oai else "MISSED"
    print(
        f"  stormguard / httpx = {guard / base:.2f} (target <= 1.10), "
        f"stormguard / openai = {guard / oai:.2f} (target < 1): {verdict}"
    )


def profile(call: Callable[[], object], calls: int) -> None:
    """cProfile of ``calls`` stormguard calls: the top functions by own time."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        call()
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out).sort_stats("tottime")
    stats.print_stats(25)
    print(out.getvalue())


async def profile_async(call: Callable[[], Awaitable[object]], calls: int) -> None:
    """The same for the async client."""
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        await call()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(25)
    print(out.getvalue())


def quota_ab(base_url: str, calls: int, rounds: int) -> None:
    """CPU time per call with ``quota=QuotaPolicy()`` (the default) and ``quota=None``."""
    clients = {
        "quota on": stormguard.Client(base_url=base_url, api_key=KEY, model="zero", timeout=30),
        "quota=None": stormguard.Client(
            base_url=base_url, api_key=KEY, model="zero", timeout=30, quota=None
        ),
    }
    per_round: dict[str, list[float]] = {name: [] for name in clients}
    for client in clients.values():
        for _ in range(100):
            client.chat.completions.create(messages=MESSAGES, max_tokens=16)
    for i in range(rounds):
        order = list(clients.items())
        for name, client in order if i % 2 == 0 else reversed(order):
            start = time.process_time()
            for _ in range(calls):
                client.chat.completions.create(messages=MESSAGES, max_tokens=16)
            per_round[name].append((time.process_time() - start) / calls)
    print("quota A/B: CPU time per sync call (median, best of the rounds)")
    for name, values in per_round.items():
        median, best = statistics.median(values) * 1e6, min(values) * 1e6
        print(f"  {name:<11} {median:8.1f} us  {best:8.1f} us")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=400, help="calls per client per round")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="cProfile stormguard's calls")
    parser.add_argument("--quota-ab", action="store_true", help="quota policy on vs None")
    args = parser.parse_args()
    with zero_server() as base_url:
        if args.quota_ab:
            quota_ab(base_url, args.calls, args.rounds)
            return
        sync = sync_callers(base_url)
        report("sync", measure_sync(sync, args.calls, args.rounds))
        report(
            "async", asyncio.run(measure_async(async_callers(base_url), args.calls, args.rounds))
        )
        if args.profile:
            profile(sync["stormguard"], args.calls * 5)


if __name__ == "__main__":
    main()
