"""A burst against a reference server that sheds what it cannot hold, every client
side by side in one run.

    .venv/bin/python bench/bench_burst.py [--calls 300] [--threads 100] [--max-tokens 32]

The server is ``stormguard-server --num-kv-blocks 256 --max-num-seqs 16
--max-queue-requests 8`` (admission on), fresh for each client. A burst of
``--calls`` chat calls from ``--threads`` threads, each with the whole
``--deadline`` (60 s), the way an application hands a batch to a thread pool.
Per client:

- success: calls that returned a completion within their deadline;
- attempts per call, counted at the server (``stormguard_attempts_total``);
- goodput: completion tokens of successful calls per second of the burst;
- p99 latency of the successful calls, and the burst's wall time (its drain).

The clients: stormguard's default ``Client``; the same with ``breaker=None``;
openai-python as it comes (2 retries); openai-python with ``max_retries=0`` in a
tenacity decorator (3 attempts, random exponential wait); openai-python on
``stormguard.httpx_client``. Not a timed test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import tenacity

import stormguard
from stormguard_server.drill.sampler import parse_metrics
from stormguard_server.drill.servers import EngineSpec, ServerFleet, ServerProcess

MODEL = "stormguard-sim"
MESSAGES = [{"role": "user", "content": "say something about queues"}]
SERVER_ARGS = ("--num-kv-blocks", "256", "--max-num-seqs", "16", "--max-queue-requests", "8")

Call = Callable[[], int]  # one chat call; returns its completion tokens, raises on failure


@dataclass(frozen=True, slots=True)
class BurstResult:
    client: str
    calls: int
    ok: int
    server_attempts: int
    wall_s: float
    completion_tokens: int
    p99_s: float | None
    errors: dict[str, int]

    @property
    def success(self) -> float:
        return self.ok / self.calls

    @property
    def attempts_per_call(self) -> float:
        return self.server_attempts / self.calls

    @property
    def goodput(self) -> float:
        return self.completion_tokens / self.wall_s


def _stormguard(base_url: str, deadline: float, max_tokens: int, **options: Any) -> Call:
    client = stormguard.Client(base_url=base_url, model=MODEL, timeout=deadline, **options)

    def call() -> int:
        resp = client.chat.completions.create(messages=MESSAGES, max_tokens=max_tokens)
        return int(resp.usage.completion_tokens) if resp.usage is not None else 0

    return call


def _openai(client: openai.OpenAI, max_tokens: int) -> Call:
    def call() -> int:
        resp = client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=max_tokens,
        )
        return resp.usage.completion_tokens if resp.usage else 0

    return call


def _openai_default(base_url: str, deadline: float, max_tokens: int) -> Call:
    return _openai(openai.OpenAI(base_url=base_url, api_key="bench", timeout=deadline), max_tokens)


def _openai_tenacity(base_url: str, deadline: float, max_tokens: int) -> Call:
    client = openai.OpenAI(base_url=base_url, api_key="bench", timeout=deadline, max_retries=0)
    retrying = tenacity.retry(
        stop=tenacity.stop_after_attempt(3) | tenacity.stop_after_delay(deadline),
        wait=tenacity.wait_random_exponential(multiplier=1, max=8),
        reraise=True,
    )
    return retrying(_openai(client, max_tokens))


def _openai_on_stormguard(base_url: str, deadline: float, max_tokens: int) -> Call:
    http = stormguard.httpx_client(base_url=base_url, model=MODEL, timeout=deadline)
    # openai 3.x types http_client as an httpx2 client; it takes an httpx one too.
    client = openai.OpenAI(
        base_url=base_url,
        api_key="bench",
        http_client=http,  # type: ignore[arg-type]
        max_retries=0,
    )
    return _openai(client, max_tokens)


CLIENTS: dict[str, Callable[[str, float, int], Call]] = {
    "stormguard": lambda url, deadline, n: _stormguard(url, deadline, n),
    "stormguard(breaker=None)": lambda url, deadline, n: _stormguard(
        url, deadline, n, breaker=None
    ),
    "openai": _openai_default,
    "openai+tenacity(3)": _openai_tenacity,
    "openai on httpx_client": _openai_on_stormguard,
}


def _server_attempts(root: str) -> int:
    metrics = parse_metrics(httpx.get(f"{root}/metrics", timeout=10).text)
    return int(metrics.get("stormguard_attempts_total", 0.0))


def run_burst(name: str, call: Call, root: str, calls: int, threads: int) -> BurstResult:
    """``calls`` calls from ``threads`` threads, all released at once."""
    before = _server_attempts(root)
    latencies: list[float] = []
    tokens = 0
    errors: dict[str, int] = {}
    lock = threading.Lock()
    start = threading.Event()

    def one() -> None:
        nonlocal tokens
        start.wait()
        began = time.monotonic()
        try:
            got = call()
        except Exception as exc:  # the figure is what the application saw
            with lock:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
            return
        with lock:
            latencies.append(time.monotonic() - began)
            tokens += got

    with ThreadPoolExecutor(max_workers=threads) as pool:
        futures = [pool.submit(one) for _ in range(calls)]
        began = time.monotonic()
        start.set()
        for future in futures:
            future.result()
    wall = time.monotonic() - began
    p99 = statistics.quantiles(latencies, n=100)[98] if len(latencies) >= 2 else None
    return BurstResult(
        client=name,
        calls=calls,
        ok=len(latencies),
        server_attempts=_server_attempts(root) - before,
        wall_s=wall,
        completion_tokens=tokens,
        p99_s=p99,
        errors=errors,
    )


async def _start(fleet: ServerFleet, name: str) -> ServerProcess:
    return await fleet.start(name, *SERVER_ARGS)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--threads", type=int, default=100)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds per call")
    parser.add_argument("--only", action="append", choices=sorted(CLIENTS), help="repeatable")
    args = parser.parse_args(argv)
    names = args.only or list(CLIENTS)
    fleet = ServerFleet(Path(tempfile.mkdtemp(prefix="bench-burst-")), EngineSpec(args=()))
    print(f"burst: {args.calls} calls from {args.threads} threads, max_tokens {args.max_tokens},")
    print(f"deadline {args.deadline:g} s; server: stormguard-server {' '.join(SERVER_ARGS)}\n")
    header = f"{'client':<26} {'success':>8} {'att/call':>9} {'goodput':>9} {'p99':>7} {'wall':>7}"
    print(header + "  errors")
    try:
        for name in names:
            server = asyncio.run(_start(fleet, name.replace(" ", "_")))
            call = CLIENTS[name](server.base_url, args.deadline, args.max_tokens)
            r = run_burst(name, call, server.root, args.calls, args.threads)
            p99 = f"{r.p99_s:.1f}s" if r.p99_s is not None else "-"
            print(
                f"{r.client:<26} {r.success:>8.0%} {r.attempts_per_call:>9.2f}"
                f" {r.goodput:>7.0f}/s {p99:>7} {r.wall_s:>6.1f}s  {r.errors or ''}",
                flush=True,
            )
            fleet.stop(server)  # a fresh server for each client
    finally:
        fleet.stop_all()


if __name__ == "__main__":
    main()
