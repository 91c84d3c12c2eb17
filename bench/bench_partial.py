"""A partial outage, every client side by side in one run: one replica dead, one
answering half its calls with 500, one healthy.

    .venv/bin/python bench/bench_partial.py [--calls 300] [--threads 30] [--tasks 30]
        [--deadline 10] [--max-tokens 16] [--error-rate 0.5] [--runs 3] [--only NAME ...]
        [--outage-calls 300] [--no-outage] [--json PATH]

Per run and client, a fresh fleet of three replicas, each its own process on
127.0.0.1 (the drill's ``ServerFleet``):

- **#0 dead**: a port bound but never listened on, so every connection to it is
  refused (held for the run, so no other process can take it);
- **#1 erroring**: ``stormguard-server --error-rate 0.5``, half its calls a 500;
- **#2 healthy**: ``stormguard-server`` as it comes.

Then ``--calls`` chat calls, all released at once, each with the whole
``--deadline``: from ``--threads`` threads for the sync clients, from ``--tasks``
asyncio tasks on one client for the async one. The clients:

- ``stormguard``: ``stormguard.Client(base_url=[#0, #1, #2])``, default options;
- ``stormguard async``: the same ``AsyncClient``;
- ``litellm Router``: three deployments of the model, ``num_retries=2``,
  ``allowed_fails=3`` (imported offline as the drill does; skipped, saying why,
  where LiteLLM cannot be imported);
- ``openai random``: openai-python as it comes (2 retries, to the server it
  picked), one client per server, a server picked at random per call;
- ``openai+tenacity(3) random``: openai-python with ``max_retries=0`` in a tenacity
  loop of 3 attempts (random exponential wait), a server picked at random per attempt.

Per client and run:

- success: calls that returned a completion within their deadline;
- attempts per call on the live servers: ``stormguard_attempts_total`` of #1 and #2
  (their /metrics, before and after), over the calls;
- calls sent to the dead replica after the first second: calls with an attempt to
  #0 that started more than 1 s after the burst began, over the calls. For
  stormguard from each call's attempt history (endpoint and ``started_at``); for
  openai-python and LiteLLM from a counting httpx transport under their HTTP client
  (``http_client=`` for openai, ``litellm.client_session`` for LiteLLM), which sees
  every request they try to send, refused ones included, and the thread's call;
- p50 and p99 latency of the successful calls.

Then the full outage (not with ``--no-outage``): every replica dead, stormguard sync
and async, ``--outage-calls`` calls from the same threads or tasks: ``refused`` (three
ports that refuse connections; attempts counted from the calls' attempt histories)
and ``reset`` (three ``bench/zero_server.py --close`` stubs that read each request
and close the connection unanswered; attempts counted at the stubs). Attempts per
call and the time to fail, p50 and p99.

Targets for the default stormguard client: >= 99.9 % success, <= 1.1 attempts per
call on the live servers, <= 1 % of calls sent to the dead replica after the first
second, p99 no worse than LiteLLM Router's; beat LiteLLM Router on success and on
attempts per call; in the full outage <= 1.3 attempts per call, failing fast.
``--runs N`` repeats everything N times and ends with the spread (min-max). Not a
timed test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import openai
import tenacity

import stormguard
from burst_calls import MESSAGES, p99, settled
from stormguard_drill.clients.drill_client import MODEL, ClientUnavailable
from stormguard_drill.clients.litellm_client import import_litellm
from stormguard_drill.sampler import parse_metrics
from stormguard_drill.servers import EngineSpec, ServerFleet, ServerProcess
from zero_server import running

TARGET_SUCCESS = 0.999
TARGET_ATTEMPTS = 1.1
TARGET_DEAD_SHARE = 0.01
TARGET_OUTAGE_ATTEMPTS = 1.3
FIRST_SECOND = 1.0


# -- the fleet -------------------------------------------------------------------------


@contextlib.contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port bound but never listened on: connections to it are refused,
    and no other process can take it while it is held."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@dataclass(frozen=True, slots=True)
class Fleet:
    dead_port: int
    erroring: ServerProcess
    healthy: ServerProcess

    @property
    def urls(self) -> list[str]:
        return [
            f"http://127.0.0.1:{self.dead_port}/v1",
            self.erroring.base_url,
            self.healthy.base_url,
        ]

    @property
    def dead_name(self) -> str:
        return f"127.0.0.1:{self.dead_port}"

    def live_attempts(self) -> int:
        return sum(_attempts(server) for server in (self.erroring, self.healthy))


def _attempts(server: ServerProcess) -> int:
    """Generation attempts the server received (``parse_metrics`` sums the labels)."""
    metrics = parse_metrics(httpx.get(f"{server.root}/metrics", timeout=10).text)
    return int(metrics.get("stormguard_attempts_total", 0.0))


@contextlib.contextmanager
def partial_outage(servers: ServerFleet, name: str, error_rate: float) -> Iterator[Fleet]:
    with refusing_port() as dead:
        erroring = asyncio.run(servers.start(f"{name}-erroring", "--error-rate", str(error_rate)))
        try:
            healthy = asyncio.run(servers.start(f"{name}-healthy"))
            try:
                yield Fleet(dead, erroring, healthy)
            finally:
                servers.stop(healthy)
        finally:
            servers.stop(erroring)


# -- what each call did ----------------------------------------------------------------


@dataclass
class Tally:
    """What the application saw of each call, from any number of threads or tasks."""

    latencies: list[float] = field(default_factory=list)
    fail_times: list[float] = field(default_factory=list)
    errors: dict[str, int] = field(default_factory=dict)
    #: Calls with an attempt to the dead replica more than a second into the burst.
    dead_late_calls: set[int] = field(default_factory=set)
    #: Attempts the client made (stormguard: from attempt histories).
    client_attempts: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ok(self, latency_s: float) -> None:
        with self.lock:
            self.latencies.append(latency_s)

    def failed(self, exc: BaseException, latency_s: float) -> None:
        with self.lock:
            self.fail_times.append(latency_s)
            self.errors[type(exc).__name__] = self.errors.get(type(exc).__name__, 0) + 1

    def dead_late(self, call_id: int) -> None:
        with self.lock:
            self.dead_late_calls.add(call_id)


class Burst:
    """The burst's start time and the call id of each thread (for counting transports)."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self._local = threading.local()

    @property
    def call_id(self) -> int:
        return int(getattr(self._local, "call_id", -1))

    @call_id.setter
    def call_id(self, value: int) -> None:
        self._local.call_id = value


class CountingTransport(httpx.BaseTransport):
    """Sees every request an HTTP client tries to send (refused ones too) and notes
    the calls that tried the dead replica after the first second."""

    def __init__(self, dead_port: int, burst: Burst, tally: Tally) -> None:
        self._inner = httpx.HTTPTransport()
        self._dead_port = dead_port
        self._burst = burst
        self._tally = tally

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        late = time.monotonic() - self._burst.t0 > FIRST_SECOND
        if request.url.port == self._dead_port and late:
            self._tally.dead_late(self._burst.call_id)
        return self._inner.handle_request(request)

    def close(self) -> None:
        self._inner.close()


def note_history(
    history: tuple[stormguard.AttemptRecord, ...],
    call_id: int,
    dead_name: str | None,
    burst: Burst,
    tally: Tally,
) -> None:
    """A stormguard call's attempts: counted, and the dead replica's noted by time."""
    with tally.lock:
        tally.client_attempts += len(history)
    for attempt in history:
        late = attempt.started_at is not None and attempt.started_at - burst.t0 > FIRST_SECOND
        if attempt.endpoint == dead_name and late:
            tally.dead_late(call_id)


# -- clients ---------------------------------------------------------------------------

Call = Callable[[int], None]  # one chat call, given its id; raises on failure


def _stormguard(fleet: Fleet, burst: Burst, tally: Tally, args: argparse.Namespace) -> Call:
    client = stormguard.Client(base_url=fleet.urls, model=MODEL, timeout=args.deadline)

    def call(call_id: int) -> None:
        try:
            resp = client.chat.completions.create(messages=MESSAGES, max_tokens=args.max_tokens)
        except stormguard.StormguardError as exc:
            note_history(exc.attempt_history, call_id, fleet.dead_name, burst, tally)
            raise
        note_history(resp.attempt_history, call_id, fleet.dead_name, burst, tally)

    return call


def _openai_clients(
    fleet: Fleet, burst: Burst, tally: Tally, args: argparse.Namespace, retries: int
) -> list[openai.OpenAI]:
    return [
        openai.OpenAI(
            base_url=url,
            api_key="bench",
            timeout=args.deadline,
            max_retries=retries,
            # openai 3.x types http_client as an httpx2 client; it takes an httpx one too.
            http_client=httpx.Client(transport=CountingTransport(fleet.dead_port, burst, tally)),  # type: ignore[arg-type]
        )
        for url in fleet.urls
    ]


def _chat(client: openai.OpenAI, args: argparse.Namespace) -> None:
    client.chat.completions.create(
        model=MODEL,
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=args.max_tokens,
    )


def _openai_random(fleet: Fleet, burst: Burst, tally: Tally, args: argparse.Namespace) -> Call:
    clients = _openai_clients(fleet, burst, tally, args, retries=2)
    rng = random.Random()

    def call(call_id: int) -> None:
        _chat(rng.choice(clients), args)

    return call


def _openai_tenacity(fleet: Fleet, burst: Burst, tally: Tally, args: argparse.Namespace) -> Call:
    clients = _openai_clients(fleet, burst, tally, args, retries=0)
    rng = random.Random()
    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_attempt(3) | tenacity.stop_after_delay(args.deadline),
        wait=tenacity.wait_random_exponential(multiplier=1, max=8),
        reraise=True,
    )

    def call(call_id: int) -> None:
        for attempt in retrying.copy():
            with attempt:
                _chat(rng.choice(clients), args)

    return call


def _litellm_router(fleet: Fleet, burst: Burst, tally: Tally, args: argparse.Namespace) -> Call:
    litellm = import_litellm()
    # LiteLLM's OpenAI handler sends through this client when it is set: the counting
    # transport then sees every request its Router makes.
    litellm.client_session = httpx.Client(
        transport=CountingTransport(fleet.dead_port, burst, tally), timeout=args.deadline
    )
    deployments = [
        {
            "model_name": MODEL,
            "litellm_params": {"model": f"openai/{MODEL}", "api_base": url, "api_key": "bench"},
        }
        for url in fleet.urls
    ]
    router = litellm.Router(
        model_list=deployments, num_retries=2, allowed_fails=3, timeout=args.deadline
    )

    def call(call_id: int) -> None:
        router.completion(model=MODEL, messages=MESSAGES, max_tokens=args.max_tokens)

    return call


SYNC_CLIENTS: dict[str, Callable[[Fleet, Burst, Tally, argparse.Namespace], Call]] = {
    "stormguard": _stormguard,
    "litellm Router": _litellm_router,
    "openai random": _openai_random,
    "openai+tenacity(3) random": _openai_tenacity,
}
ASYNC_CLIENTS = ("stormguard async",)
CLIENTS = ("stormguard", "stormguard async", *list(SYNC_CLIENTS)[1:])


# -- running a burst ---------------------------------------------------------------------


def run_threads(call: Call, calls: int, threads: int, burst: Burst, tally: Tally) -> float:
    """``calls`` calls from ``threads`` threads, all released at once; the wall time."""
    start = threading.Event()
    ids = iter(range(calls))
    ids_lock = threading.Lock()

    def worker() -> None:
        start.wait()
        while True:
            with ids_lock:
                call_id = next(ids, None)
            if call_id is None:
                return
            burst.call_id = call_id
            began = time.monotonic()
            try:
                call(call_id)
            except Exception as exc:  # the figure is what the application saw
                tally.failed(exc, time.monotonic() - began)
                continue
            tally.ok(time.monotonic() - began)

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for thread in pool:
        thread.start()
    burst.t0 = time.monotonic()
    start.set()
    for thread in pool:
        thread.join()
    return time.monotonic() - burst.t0


async def run_tasks(
    urls: list[str],
    dead_name: str | None,
    calls: int,
    tasks: int,
    args: argparse.Namespace,
    burst: Burst,
    tally: Tally,
) -> float:
    """``calls`` calls from ``tasks`` tasks on one ``AsyncClient``, all released at once."""
    client = stormguard.AsyncClient(base_url=urls, model=MODEL, timeout=args.deadline)
    start = asyncio.Event()
    ids = iter(range(calls))

    async def worker() -> None:
        await start.wait()
        for call_id in ids:
            began = time.monotonic()
            try:
                resp = await client.chat.completions.create(
                    messages=MESSAGES, max_tokens=args.max_tokens
                )
            except stormguard.StormguardError as exc:
                note_history(exc.attempt_history, call_id, dead_name, burst, tally)
                tally.failed(exc, time.monotonic() - began)
                continue
            note_history(resp.attempt_history, call_id, dead_name, burst, tally)
            tally.ok(time.monotonic() - began)

    workers = [asyncio.create_task(worker()) for _ in range(tasks)]
    await asyncio.sleep(0)
    burst.t0 = time.monotonic()
    start.set()
    try:
        await asyncio.gather(*workers)
    finally:
        await client.close()
    return time.monotonic() - burst.t0


# -- results ---------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


@dataclass(frozen=True, slots=True)
class PartialResult:
    client: str
    run: int
    calls: int
    ok: int
    live_attempts: int
    dead_late_calls: int
    wall_s: float
    p50_s: float | None
    p99_s: float | None
    errors: dict[str, int]

    @property
    def success(self) -> float:
        return self.ok / self.calls

    @property
    def attempts_per_call(self) -> float:
        return self.live_attempts / self.calls

    @property
    def dead_share(self) -> float:
        return self.dead_late_calls / self.calls


@dataclass(frozen=True, slots=True)
class OutageResult:
    outage: str
    client: str
    run: int
    calls: int
    ok: int
    attempts: int
    fail_p50_s: float | None
    fail_p99_s: float | None
    errors: dict[str, int]

    @property
    def attempts_per_call(self) -> float:
        return self.attempts / self.calls


def run_partial(
    name: str, run: int, servers: ServerFleet, args: argparse.Namespace
) -> PartialResult:
    """One client's burst on a fresh partial outage; attempts counted at the live servers."""
    with partial_outage(servers, f"{name.replace(' ', '_')}-{run}", args.error_rate) as fleet:
        burst, tally = Burst(), Tally()
        before = fleet.live_attempts()
        if name in ASYNC_CLIENTS:
            coro = run_tasks(
                fleet.urls, fleet.dead_name, args.calls, args.tasks, args, burst, tally
            )
            wall = asyncio.run(coro)
        else:
            call = SYNC_CLIENTS[name](fleet, burst, tally, args)
            wall = run_threads(call, args.calls, args.threads, burst, tally)
        live = settled(fleet.live_attempts) - before
    return PartialResult(
        client=name,
        run=run,
        calls=args.calls,
        ok=len(tally.latencies),
        live_attempts=live,
        dead_late_calls=len(tally.dead_late_calls),
        wall_s=wall,
        p50_s=_median(tally.latencies),
        p99_s=p99(tally.latencies),
        errors=dict(tally.errors),
    )


@contextlib.contextmanager
def _refusing_fleet() -> Iterator[tuple[list[str], Callable[[], int] | None]]:
    with refusing_port() as a, refusing_port() as b, refusing_port() as c:
        yield [f"http://127.0.0.1:{port}/v1" for port in (a, b, c)], None


@contextlib.contextmanager
def _resetting_fleet() -> Iterator[tuple[list[str], Callable[[], int] | None]]:
    with running("--close") as a, running("--close") as b, running("--close") as c:
        roots = [a, b, c]

        def posts() -> int:
            return sum(int(httpx.get(f"{r}/count", timeout=10).json()["posts"]) for r in roots)

        yield [f"{root}/v1" for root in roots], posts


OUTAGES = {"refused": _refusing_fleet, "reset": _resetting_fleet}


def run_outage(outage: str, name: str, run: int, args: argparse.Namespace) -> OutageResult:
    """Every replica dead: attempts per call (at the stubs, or from the attempt
    histories where nothing listens) and how fast the calls fail."""
    with OUTAGES[outage]() as (urls, posts):
        burst, tally = Burst(), Tally()
        if name in ASYNC_CLIENTS:
            coro = run_tasks(urls, None, args.outage_calls, args.tasks, args, burst, tally)
            asyncio.run(coro)
        else:
            client = stormguard.Client(base_url=urls, model=MODEL, timeout=args.deadline)

            def call(call_id: int) -> None:
                try:
                    client.chat.completions.create(messages=MESSAGES, max_tokens=args.max_tokens)
                except stormguard.StormguardError as exc:
                    note_history(exc.attempt_history, call_id, None, burst, tally)
                    raise

            run_threads(call, args.outage_calls, args.threads, burst, tally)
        attempts = posts() if posts is not None else tally.client_attempts
    return OutageResult(
        outage=outage,
        client=name,
        run=run,
        calls=args.outage_calls,
        ok=len(tally.latencies),
        attempts=attempts,
        fail_p50_s=_median(tally.fail_times),
        fail_p99_s=p99(tally.fail_times),
        errors=dict(tally.errors),
    )


# -- output ----------------------------------------------------------------------------


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


_HEADER = (
    f"{'client':<27} {'run':>3} {'success':>8} {'att/call':>8} {'dead>1s':>7}"
    f" {'p50':>6} {'p99':>6} {'wall':>6}  errors"
)


def _row(r: PartialResult) -> str:
    return (
        f"{r.client:<27} {r.run:>3} {r.success:>8.1%} {r.attempts_per_call:>8.3f}"
        f" {r.dead_share:>7.1%} {_s(r.p50_s):>6} {_s(r.p99_s):>6} {r.wall_s:>5.1f}s"
        f"  {r.errors or ''}"
    )


def _outage_row(r: OutageResult) -> str:
    return (
        f"{r.outage:<8} {r.client:<17} {r.run:>3} {r.attempts_per_call:>8.3f}"
        f" {_ms(r.fail_p50_s):>9} {_ms(r.fail_p99_s):>9}  {r.errors}"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}ms"


def _verdict(results: list[PartialResult], outages: list[OutageResult]) -> None:
    """Each target against every run of the default client (the worst run decides)."""
    mine = [r for r in results if r.client == "stormguard"]
    litellm = [r for r in results if r.client == "litellm Router"]
    if not mine:
        return
    print("\ntargets (stormguard, the worst of its runs):")
    checks: list[tuple[str, bool, str]] = [
        ("success >= 99.9 %", min(r.success for r in mine) >= TARGET_SUCCESS,
         f"{min(r.success for r in mine):.1%}"),
        ("attempts/call on the live servers <= 1.1",
         max(r.attempts_per_call for r in mine) <= TARGET_ATTEMPTS,
         f"{max(r.attempts_per_call for r in mine):.3f}"),
        ("calls to the dead replica after 1 s <= 1 %",
         max(r.dead_share for r in mine) <= TARGET_DEAD_SHARE,
         f"{max(r.dead_share for r in mine):.1%}"),
    ]  # fmt: skip
    if litellm:
        p99_mine = max((r.p99_s or 0.0) for r in mine)
        p99_litellm = min((r.p99_s or float("inf")) for r in litellm)
        checks += [
            ("p99 <= LiteLLM Router's", p99_mine <= p99_litellm,
             f"{p99_mine:.2f}s vs {p99_litellm:.2f}s (its best run)"),
            ("success > LiteLLM Router's",
             min(r.success for r in mine) > max(r.success for r in litellm)
             or min(r.success for r in mine) == 1.0,
             f"{min(r.success for r in mine):.1%} vs {max(r.success for r in litellm):.1%}"),
            ("attempts/call < LiteLLM Router's",
             max(r.attempts_per_call for r in mine) < min(r.attempts_per_call for r in litellm),
             f"{max(r.attempts_per_call for r in mine):.3f} vs"
             f" {min(r.attempts_per_call for r in litellm):.3f}"),
        ]  # fmt: skip
    if outages:
        worst = max(r.attempts_per_call for r in outages)
        checks.append(
            ("full outage: attempts/call <= 1.3", worst <= TARGET_OUTAGE_ATTEMPTS, f"{worst:.3f}")
        )
    for name, met, figure in checks:
        print(f"  {'met   ' if met else 'MISSED'} {name}: {figure}")


def _spread(results: list[PartialResult], outages: list[OutageResult]) -> None:
    print("\nspread over runs (min-max):")
    for name in dict.fromkeys(r.client for r in results):
        mine = [r for r in results if r.client == name]
        ok = [r.success for r in mine]
        att = [r.attempts_per_call for r in mine]
        dead = [r.dead_share for r in mine]
        p99 = [r.p99_s for r in mine if r.p99_s is not None]
        p99_text = f"{min(p99):.2f}-{max(p99):.2f}s" if p99 else "-"
        print(
            f"{name:<27} success {min(ok):.1%}-{max(ok):.1%}"
            f"  att/call {min(att):.3f}-{max(att):.3f}  dead>1s {min(dead):.1%}-{max(dead):.1%}"
            f"  p99 {p99_text}  ({len(mine)} runs)"
        )
    for key in dict.fromkeys((r.outage, r.client) for r in outages):
        mine_o = [r for r in outages if (r.outage, r.client) == key]
        att = [r.attempts_per_call for r in mine_o]
        p99s = [r.fail_p99_s for r in mine_o if r.fail_p99_s is not None]
        p99_text = f"{_ms(min(p99s))}-{_ms(max(p99s))}" if p99s else "-"
        print(
            f"outage {key[0]:<8} {key[1]:<17} att/call {min(att):.3f}-{max(att):.3f}"
            f"  fail p99 {p99_text}  ({len(mine_o)} runs)"
        )


def _skips(names: list[str]) -> dict[str, str]:
    if "litellm Router" not in names:
        return {}
    try:
        import_litellm()
    except ClientUnavailable as exc:
        return {"litellm Router": str(exc)}
    return {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--threads", type=int, default=30, help="threads of the sync clients")
    parser.add_argument("--tasks", type=int, default=30, help="asyncio tasks of the async one")
    parser.add_argument("--deadline", type=float, default=10.0, help="seconds per call")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--error-rate", type=float, default=0.5, help="of the erroring replica")
    parser.add_argument("--runs", type=int, default=1, help="repeats of everything")
    parser.add_argument("--only", action="append", choices=list(CLIENTS), help="repeatable")
    parser.add_argument("--outage-calls", type=int, default=300)
    parser.add_argument("--no-outage", action="store_true", help="skip the full outage")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args(argv)
    names = args.only or list(CLIENTS)
    skipped = _skips(names)
    log_dir = Path(tempfile.mkdtemp(prefix="bench-partial-"))
    servers = ServerFleet(log_dir, EngineSpec(args=()))
    print(
        f"partial outage: #0 refuses connections, #1 --error-rate {args.error_rate:g},"
        f" #2 healthy; {args.calls} calls from {args.threads} threads (async: {args.tasks}"
        f" tasks), max_tokens {args.max_tokens}, deadline {args.deadline:g} s,"
        f" {args.runs} run(s); logs in {log_dir}\n"
    )
    print(_HEADER)
    for name, reason in skipped.items():
        print(f"{name:<27} skipped: {reason}", flush=True)
    results: list[PartialResult] = []
    outages: list[OutageResult] = []
    outage_clients = [n for n in ("stormguard", "stormguard async") if n in names]
    try:
        for run in range(1, args.runs + 1):
            for name in (n for n in names if n not in skipped):
                results.append(run_partial(name, run, servers, args))
                print(_row(results[-1]), flush=True)
        if not args.no_outage and outage_clients:
            print(
                f"\nfull outage: every replica dead, {args.outage_calls} calls\n"
                f"{'outage':<8} {'client':<17} {'run':>3} {'att/call':>8}"
                f" {'fail p50':>9} {'fail p99':>9}  errors"
            )
            for run in range(1, args.runs + 1):
                for outage in OUTAGES:
                    for name in outage_clients:
                        outages.append(run_outage(outage, name, run, args))
                        print(_outage_row(outages[-1]), flush=True)
    finally:
        servers.stop_all()
    if args.runs > 1:
        _spread(results, outages)
    _verdict(results, outages)
    if args.json is not None:
        payload = {
            "partial": [asdict(r) for r in results],
            "outage": [asdict(r) for r in outages],
            "argv": sys.argv[1:],
        }
        args.json.write_text(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
