"""Full outages, every client side by side: how many attempts a dead server gets
per call, and how fast a call fails once stormguard knows the server is dead.

    .venv/bin/python bench/bench_outage.py [--calls 300] [--threads 50] [--deadline 20]
        [--fast-calls 2000] [--runs 1]

The outages, each on a fresh stub (bench/zero_server.py, its own process, which
counts the POSTs it gets: attempts are counted at the server):

- ``reset``: every request is read and its connection closed unanswered (a
  process that dies on every request);
- ``500``: every request answers 500 (an engine that fails every call);
- ``503``: every request answers a plain 503, no Retry-After and no load headers
  (a proxy with no healthy upstream, an overloaded server that says nothing more).

A burst of ``--calls`` chat calls from ``--threads`` threads, each with the whole
``--deadline``, from stormguard's default ``Client``, openai-python as it comes (2
retries), and openai-python (``max_retries=0``) in a tenacity decorator of 3
attempts. Per client and outage: attempts per call at the server, what the calls
raised, and the median and p99 time for a call to fail.

Then the fail-fast latency: a stormguard client whose breaker has opened on a dead
port (nothing listens: connection refused) makes ``--fast-calls`` calls one at a
time, sync and from asyncio, each refused by the open breaker without I/O; the
median and p99 of their times.

Targets: attempts per call <= 1.3 in every outage for stormguard; an open breaker
answers in well under 5 ms. Not a timed test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx

import stormguard
from burst_calls import (
    MESSAGES,
    Call,
    Tally,
    openai_default,
    openai_tenacity,
    p99,
    run_threads,
    stormguard_call,
)
from stormguard_drill.clients.drill_client import MODEL
from stormguard_drill.servers import free_port
from zero_server import running

OUTAGES: dict[str, tuple[str, ...]] = {
    "reset": ("--close",),
    "500": ("--status", "500"),
    "503": ("--status", "503"),
}
CLIENTS: dict[str, Callable[[str, float, int], Call]] = {
    "stormguard": stormguard_call,
    "openai": openai_default,
    "openai+tenacity(3)": openai_tenacity,
}
TARGET_ATTEMPTS = 1.3
TARGET_FAIL_FAST_S = 0.005


@dataclass(frozen=True, slots=True)
class OutageResult:
    outage: str
    client: str
    run: int
    calls: int
    ok: int
    attempts: int
    errors: dict[str, int]
    fail_p50_s: float | None
    fail_p99_s: float | None

    @property
    def attempts_per_call(self) -> float:
        return self.attempts / self.calls


class _FailureTally(Tally):
    """The burst's tally, plus how long each failed call took to fail."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_times: list[float] = []


def _timed(call: Call, tally: _FailureTally) -> Call:
    def timed() -> int:
        began = time.monotonic()
        try:
            return call()
        except Exception:
            with tally.lock:
                tally.fail_times.append(time.monotonic() - began)
            raise

    return timed


def run_outage(outage: str, client: str, run: int, args: argparse.Namespace) -> OutageResult:
    with running(*OUTAGES[outage]) as root:
        call = CLIENTS[client](f"{root}/v1", args.deadline, 16)
        tally = _FailureTally()
        run_threads(_timed(call, tally), args.calls, args.threads, tally)
        posts = int(httpx.get(f"{root}/count", timeout=10).json()["posts"])
    fails = tally.fail_times
    return OutageResult(
        outage=outage,
        client=client,
        run=run,
        calls=args.calls,
        ok=len(tally.latencies),
        attempts=posts,
        errors=dict(tally.errors),
        fail_p50_s=statistics.median(fails) if fails else None,
        fail_p99_s=p99(fails),
    )


@dataclass(frozen=True, slots=True)
class FailFast:
    mode: str
    calls: int
    p50_s: float
    p99_s: float
    opened_after: int  # calls it took the breaker to open


def _dead_url() -> str:
    return f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there


def _open_breaker(attempt: Callable[[], None]) -> int:
    """Call until a call is refused by the open breaker; the calls that took."""
    for n in range(1, 1000):
        try:
            attempt()
        except stormguard.CircuitOpenError:
            return n
        except stormguard.APIError:
            continue
    raise RuntimeError("the breaker never opened")


def fail_fast_sync(calls: int) -> FailFast:
    client = stormguard.Client(base_url=_dead_url(), model=MODEL)

    def attempt() -> None:
        client.chat.completions.create(messages=MESSAGES, max_tokens=16)

    opened = _open_breaker(attempt)
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        try:
            attempt()
        except stormguard.CircuitOpenError:
            times.append(time.perf_counter() - began)
    client.close()
    return FailFast("sync", len(times), statistics.median(times), p99(times) or 0.0, opened)


async def fail_fast_async(calls: int) -> FailFast:
    client = stormguard.AsyncClient(base_url=_dead_url(), model=MODEL)
    opened = 0
    for n in range(1, 1000):
        try:
            await client.chat.completions.create(messages=MESSAGES, max_tokens=16)
        except stormguard.CircuitOpenError:
            opened = n
            break
        except stormguard.APIError:
            continue
    times = []
    for _ in range(calls):
        began = time.perf_counter()
        try:
            await client.chat.completions.create(messages=MESSAGES, max_tokens=16)
        except stormguard.CircuitOpenError:
            times.append(time.perf_counter() - began)
    await client.close()
    return FailFast("async", len(times), statistics.median(times), p99(times) or 0.0, opened)


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f} ms"


def _errors(errors: dict[str, int]) -> str:
    return ", ".join(f"{n} {name}" for name, n in sorted(errors.items(), key=lambda e: -e[1]))


def report(results: list[OutageResult], fast: list[FailFast]) -> None:
    print(
        f"\n{'outage':<7} {'client':<20} {'run':>3} {'ok':>4} {'att/call':>8} "
        f"{'fail p50':>10} {'fail p99':>10}  raised"
    )
    for r in results:
        mark = ""
        if r.client == "stormguard" and r.attempts_per_call > TARGET_ATTEMPTS:
            mark = "  MISSED attempts"
        print(
            f"{r.outage:<7} {r.client:<20} {r.run:>3} {r.ok:>4} {r.attempts_per_call:>8.2f} "
            f"{_ms(r.fail_p50_s):>10} {_ms(r.fail_p99_s):>10}  {_errors(r.errors)}{mark}"
        )
    print("\nan open breaker (stormguard, refused connections):")
    for f in fast:
        met = "met" if f.p99_s < TARGET_FAIL_FAST_S else "MISSED"
        print(
            f"  {f.mode:<5} {f.calls} calls: p50 {f.p50_s * 1e6:.0f} us, p99 {f.p99_s * 1e6:.0f} us"
            f" (opened after {f.opened_after} calls; target p99 < 5 ms: {met})"
        )


def _runs(args: argparse.Namespace) -> Iterator[tuple[str, str, int]]:
    for run in range(1, args.runs + 1):
        for outage in OUTAGES:
            for client in CLIENTS:
                yield outage, client, run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--threads", type=int, default=50)
    parser.add_argument("--deadline", type=float, default=20.0, help="seconds per call")
    parser.add_argument("--fast-calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=1)
    args = parser.parse_args(argv)
    print(
        f"{args.calls} calls from {args.threads} threads, deadline {args.deadline:g} s,"
        f" {args.runs} run(s); Python {sys.version.split()[0]}"
    )
    results = []
    for outage, client, run in _runs(args):
        result = run_outage(outage, client, run, args)
        per_call = result.attempts_per_call
        print(f"  {outage} / {client} / run {run}: {per_call:.2f} attempts per call")
        results.append(result)
    fast = [fail_fast_sync(args.fast_calls), asyncio.run(fail_fast_async(args.fast_calls))]
    report(results, fast)


if __name__ == "__main__":
    main()
