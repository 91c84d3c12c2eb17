"""Hedged requests on real vLLM: time to first token, attempts per call and the
tokens spent on losers, stormguard with and without hedging beside LiteLLM's Router.

    .venv-vllm/bin/python bench/bench_hedging.py [--quick] [--seed 1] [--rounds 1]
        [--clients sg-default,sg-hedge,...] [--fixed-delay S] [--json out.json]

Two replicas of plain vLLM (the CPU build) serve the tiny random-weight Llama on free
loopback ports, each bound to a core of its own: ``vllm_bench.vllm_replicas``, the
same start, core binding and teardown as the affinity benchmark.

**The slow replica** is made slow the way an LLM replica gets slow: during the middle
third of each client's run a background client floods the second replica, straight to
its port, with ``--flood`` concurrent requests whose prompts are near the context
length (``--flood-tokens``, each distinct so that no prefix cache serves it,
``max_tokens`` 1), one after the other for the whole window. The benchmark's own
calls that land there queue behind those prefills.

**The workload** (seeded, the same for every client of a round): ``--calls`` streamed
chat calls with a short prompt (``--prompt-words``), ``max_tokens`` 16, temperature 0,
started at ``--rate`` calls a second with at most ``--in-flight`` at once, each call
bounded by a 60 s timeout and the run by its length plus 120 s.

**The clients**, one after the other over the same two replicas, each after the
replicas have drained (nothing running or waiting) and their prefix caches emptied,
in a seeded order per round:

* ``sg-default``: stormguard ``AsyncClient(base_url=[r1, r2])``, no hedging (the
  default);
* ``sg-hedge``: ``HedgePolicy()``: the delay is the p95 of the client's recent times
  to first chunk once 20 are known, at most 5 % of calls hedged;
* ``sg-hedge-fixed``: ``HedgePolicy(delay=D)``, D from ``--fixed-delay`` or, by
  default, the calibration: the p95 time to first chunk of 40 calls through
  ``sg-default`` with no flood, before the first round;
* ``sg-ewma``: ``LatencyRouting()``, no hedging: the two choices compare ``(load +
  1) * the endpoint's peak-EWMA time to first chunk``, so the flooded replica is
  avoided once one of its first chunks was slow (and tried again as its estimate
  decays);
* ``sg-ewma-hedge``: ``LatencyRouting()`` and ``HedgePolicy()``: the probes that
  still reach the flooded replica are what hedging is left to rescue;
* ``litellm-lb``: LiteLLM ``Router(routing_strategy="least-busy", num_retries=0)``,
  a deployment per replica; LiteLLM has no hedged requests.

**The figures**, per client: TTFT (the first streamed chunk, client side) p50 and p99;
attempts per call, the requests the replicas' HTTP servers counted
(``http_requests_total`` of ``/v1/chat/completions``: vLLM leaves an aborted request
out of ``vllm:request_success``) less the flood's, over the calls made; the loser tokens' share, the
tokens the replicas generated (``vllm:generation_tokens``) less those of the answers
the client used (each stream's ``usage``) and the flood's, over all generated; hedges
sent and won (stormguard's ``client.stats()``); failures.

Targets (hedging and latency-aware choice against ``sg-default``): TTFT p99 at most
half, at most 1.05 attempts per call, at most 2 % of generated tokens on losers.
``--quick``: 60 calls, one round.
Not a timed test: the numbers depend on the machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

import vllm_bench as vb
from vllm_bench import MODEL, Column, Replica

TARGET_P99_RATIO = 0.5
TARGET_ATTEMPTS = 1.05
TARGET_LOSER_SHARE = 0.02
MAX_TOKENS = 16
MAX_MODEL_LEN = 4096  # the tiny model's max_position_embeddings
CLIENTS = ("sg-default", "sg-hedge", "sg-hedge-fixed", "sg-ewma", "sg-ewma-hedge", "litellm-lb")
#: The clients judged against the targets.
HEDGE_CLIENTS = ("sg-hedge", "sg-hedge-fixed", "sg-ewma", "sg-ewma-hedge")
BASELINE = "sg-default"
CALIBRATION_CALLS = 40


@dataclass(frozen=True)
class Shape:
    calls: int = 240
    rate: float = 6.0
    in_flight: int = 8
    prompt_words: int = 24
    flood: int = 4
    flood_tokens: int = 3600


QUICK = Shape(calls=60, rate=6.0)


def prompts(shape: Shape, seed: int) -> list[str]:
    """The calls' prompts of ``seed``: the same for every client of a round."""
    from stormguard_server.vllm.tiny_model import _WORDS

    rng = random.Random(seed)
    return [
        f"call {n}: " + " ".join(rng.choice(_WORDS) for _ in range(shape.prompt_words))
        for n in range(shape.calls)
    ]


def flood_prompt(rng: random.Random, words: int) -> str:
    from stormguard_server.vllm.tiny_model import _WORDS

    return " ".join(rng.choice(_WORDS) for _ in range(words))


def flood_words(model_dir: str, tokens: int) -> int:
    """Words of a flood prompt that make about ``tokens`` prompt tokens."""
    ids = vb.prompt_ids(model_dir)
    sample = flood_prompt(random.Random(0), 1000)
    per_word = len(ids([{"role": "user", "content": sample}])) / 1000
    return int(tokens / per_word)


# -- the arithmetic ----------------------------------------------------------------------

#: The vLLM counters read before and after each client's run.
COUNTERS = {
    "generated": ("vllm:generation_tokens_total", {}),
    #: Every request the HTTP server answered or saw cut (an aborted loser is not
    #: among vLLM's finished requests).
    "requests": ("http_requests_total", {"handler": "/v1/chat/completions"}),
    "finished": ("vllm:request_success_total", {}),
    "aborted": ("vllm:request_success_total", {"finished_reason": "abort"}),
    "prompt": ("vllm:prompt_tokens_total", {}),
}


def counters(text: str) -> dict[str, float]:
    return {key: vb.metric(text, name, **labels) for key, (name, labels) in COUNTERS.items()}


def scrape(replica: Replica) -> dict[str, float]:
    return counters(replica.metrics())


def busy(replica: Replica) -> float:
    """Requests running or waiting on ``replica``."""
    text = replica.metrics()
    return vb.metric(text, "vllm:num_requests_running") + vb.metric(
        text, "vllm:num_requests_waiting"
    )


@dataclass
class Run:
    """One client's run over one workload."""

    client: str
    round: int
    seed: int
    calls: int = 0
    failures: int = 0
    wall_s: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    #: Completion tokens of the answers the client used (each stream's usage).
    used_tokens: int = 0
    #: Requests and completion tokens of the flood (not the client's).
    flood_requests: int = 0
    flood_tokens: int = 0
    flood_failures: int = 0
    #: Attempts stormguard's own history counts (None: not stormguard).
    sg_attempts: int | None = None
    hedges_sent: int | None = None
    hedges_won: int | None = None
    replicas: list[dict[str, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def total(self, key: str) -> float:
        return sum(r[key] for r in self.replicas)

    def figures(self, baseline: Run | None) -> dict[str, Any]:
        generated = self.total("generated") - self.flood_tokens
        requests = self.total("requests") - self.flood_requests
        figures: dict[str, Any] = {
            "client": self.client,
            "round": self.round,
            "seed": self.seed,
            "calls": self.calls,
            "failures": self.failures,
            "ttft_p50_ms": vb.ms(vb.percentile(self.ttfts, 50)),
            "ttft_p99_ms": vb.ms(vb.percentile(self.ttfts, 99)),
            "attempts_per_call": attempts_per_call(requests, self.calls),
            "sg_attempts_per_call": attempts_per_call(self.sg_attempts, self.calls),
            "loser_tokens": generated - self.used_tokens,
            "loser_share": loser_share(generated, self.used_tokens),
            "generated": generated,
            "used_tokens": self.used_tokens,
            "requests": [r["requests"] for r in self.replicas],
            "aborted": self.total("aborted"),
            "hedges_sent": self.hedges_sent,
            "hedges_won": self.hedges_won,
            "flood_requests": self.flood_requests,
            "flood_failures": self.flood_failures,
            "wall_s": self.wall_s,
        }
        if baseline is not None:
            base = baseline.figures(None)["ttft_p99_ms"]
            p99 = figures["ttft_p99_ms"]
            figures["p99_ratio"] = None if p99 is None or not base else p99 / base
        return figures


def attempts_per_call(requests: float | None, calls: int) -> float | None:
    """Requests sent over calls made (1.0: one each)."""
    return None if requests is None or calls <= 0 else requests / calls


def loser_share(generated: float, used: float) -> float | None:
    """The share of ``generated`` tokens whose answer was not used."""
    return None if generated <= 0 else max(generated - used, 0.0) / generated


def verdicts(figures: Mapping[str, Any]) -> dict[str, bool | None]:
    """The targets a hedging client's figures meet (None: not measured)."""
    ratio, attempts, share = (
        figures.get("p99_ratio"),
        figures.get("attempts_per_call"),
        figures.get("loser_share"),
    )
    return {
        "ttft_p99": None if ratio is None else ratio <= TARGET_P99_RATIO + 1e-9,
        "attempts": None if attempts is None else attempts <= TARGET_ATTEMPTS + 1e-9,
        "loser_tokens": None if share is None else share <= TARGET_LOSER_SHARE + 1e-9,
    }


def flood_window(calls: int, rate: float) -> tuple[float, float]:
    """When the flood runs, in seconds from the run's start: its middle third."""
    length = calls / rate
    return length / 3, 2 * length / 3


# -- the clients -------------------------------------------------------------------------

#: One call: prompt -> (seconds to the first chunk or None, completion tokens used).
Call = Callable[[str], Awaitable[tuple[float | None, int]]]


async def _read(stream: Any, started: float) -> tuple[float | None, int]:
    """Time to the first chunk with content and the usage's completion tokens (chunks
    with content, when no usage comes)."""
    first, chunks, usage = None, 0, None
    async for chunk in stream:
        if getattr(chunk, "usage", None) is not None:
            usage = chunk.usage.completion_tokens
        if chunk.choices and first is None:
            first = time.monotonic() - started
        chunks += bool(chunk.choices and chunk.choices[0].delta.content)
    return first, usage if usage is not None else chunks


def sg_options(name: str, fixed_delay: float) -> dict[str, Any]:
    """The ``AsyncClient`` options of stormguard's client ``name`` beside its
    endpoints (its hedging and its latency-aware choice)."""
    from stormguard import HedgePolicy, LatencyRouting

    hedge = {
        "sg-default": None,
        "sg-hedge": HedgePolicy(),
        "sg-hedge-fixed": HedgePolicy(delay=fixed_delay),
        "sg-ewma": None,
        "sg-ewma-hedge": HedgePolicy(),
    }[name]
    latency = LatencyRouting() if name.startswith("sg-ewma") else None
    return {"hedge": hedge, "latency_routing": latency}


@contextlib.asynccontextmanager
async def client_for(name: str, replicas: Sequence[Replica], fixed_delay: float, run: Run) -> Any:
    urls = [r.base_url for r in replicas]
    if name.startswith("sg-"):
        import stormguard

        client = stormguard.AsyncClient(
            base_url=urls, model=MODEL, timeout=60, **sg_options(name, fixed_delay)
        )
        attempts = 0

        async def sg_call(prompt: str) -> tuple[float | None, int]:
            nonlocal attempts
            started = time.monotonic()
            try:
                stream = await client.chat.completions.create(
                    messages=[{"role": "user", "content": prompt}],
                    max_tokens=MAX_TOKENS,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                )
            except stormguard.StormguardError as exc:
                attempts += len(getattr(exc, "attempt_history", None) or ()) or 1
                raise
            async with stream:
                result = await _read(stream, started)
            attempts += len(stream.call_info.attempt_history)
            return result

        try:
            yield sg_call
        finally:
            stats = client.stats()
            run.sg_attempts = attempts
            run.hedges_sent, run.hedges_won = stats.hedges_sent, stats.hedges_won
            await client.close()
    elif name == "litellm-lb":
        router = vb.litellm_router(
            replicas, routing_strategy="least-busy", num_retries=0, timeout=60
        )

        async def litellm_call(prompt: str) -> tuple[float | None, int]:
            started = time.monotonic()
            stream = await router.acompletion(
                model=MODEL,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=MAX_TOKENS,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            return await _read(stream, started)

        yield litellm_call
    else:
        raise ValueError(f"unknown client {name!r}; one of {', '.join(CLIENTS)}")


# -- the run -----------------------------------------------------------------------------


async def drive(call: Call, texts: Sequence[str], *, rate: float, in_flight: int, run: Run) -> None:
    """Each prompt through ``call``, started ``1 / rate`` s apart (later when
    ``in_flight`` calls are running), every call awaited."""
    slots = asyncio.Semaphore(in_flight)
    started = time.monotonic()

    async def one(text: str) -> None:
        try:
            first, used = await call(text)
        except Exception as exc:  # counted and shown: a benchmark reports, never stops
            run.failures += 1
            run.errors.append(f"{type(exc).__name__}: {exc}"[:300])
        else:
            if first is None:
                run.failures += 1
                run.errors.append("a stream without a chunk")
            else:
                run.ttfts.append(first)
                run.used_tokens += used
        finally:
            slots.release()

    tasks = []
    for number, text in enumerate(texts):
        await asyncio.sleep(max(0.0, started + number / rate - time.monotonic()))
        await slots.acquire()
        run.calls += 1
        tasks.append(asyncio.create_task(one(text)))
    await asyncio.gather(*tasks)
    run.wall_s = time.monotonic() - started


async def flood(
    replica: Replica, window: tuple[float, float], workers: int, words: int, seed: int, run: Run
) -> None:
    """Long prompts straight to ``replica`` from ``window[0]`` to ``window[1]`` s,
    ``workers`` at once, each a prompt of its own (no prefix cache serves it)."""
    rng = random.Random(seed)
    started = time.monotonic()
    await asyncio.sleep(window[0])
    async with httpx.AsyncClient(base_url=replica.base_url, timeout=300) as http:

        async def worker() -> None:
            while time.monotonic() - started < window[1]:
                body = {
                    "model": MODEL,
                    "messages": [{"role": "user", "content": flood_prompt(rng, words)}],
                    "max_tokens": 1,
                }
                run.flood_requests += 1
                try:
                    reply = await http.post("/chat/completions", json=body)
                    reply.raise_for_status()
                    run.flood_tokens += reply.json()["usage"]["completion_tokens"]
                except (httpx.HTTPError, KeyError, ValueError) as exc:
                    run.flood_failures += 1
                    run.errors.append(f"flood: {type(exc).__name__}: {exc}"[:300])

        await asyncio.gather(*(worker() for _ in range(workers)))


def drain(replicas: Sequence[Replica], limit: float = 120.0) -> None:
    """Wait until no replica has a request running or waiting, then empty their prefix
    caches (each client starts from the same state)."""
    deadline = time.monotonic() + limit
    while any(busy(r) for r in replicas) and time.monotonic() < deadline:
        time.sleep(0.2)
    for replica in replicas:
        replica.reset_prefix_cache()


def run_client(
    name: str,
    replicas: Sequence[Replica],
    texts: Sequence[str],
    shape: Shape,
    *,
    seed: int,
    round_: int,
    fixed_delay: float,
    words: int,
    flooded: bool = True,
) -> Run:
    drain(replicas)
    before = [scrape(r) for r in replicas]
    run = Run(client=name, round=round_, seed=seed)
    window = flood_window(len(texts), shape.rate)
    limit = len(texts) / shape.rate + 120

    async def main() -> None:
        async with client_for(name, replicas, fixed_delay, run) as call:
            jobs = [drive(call, texts, rate=shape.rate, in_flight=shape.in_flight, run=run)]
            if flooded:
                jobs.append(flood(replicas[1], window, shape.flood, words, seed, run))
            await asyncio.wait_for(asyncio.gather(*jobs), limit)

    try:
        asyncio.run(main())
    except TimeoutError:
        run.errors.append(f"the run did not end in {limit:.0f} s")
    drain(replicas)  # losers aborted and counted, the flood done
    run.replicas = [vb.delta(scrape(r), b) for r, b in zip(replicas, before, strict=True)]
    return run


# -- the report --------------------------------------------------------------------------


#: The columns of the report.
COLUMNS = (
    Column("TTFT p50 ms", 16, lambda f: f["ttft_p50_ms"], ".0f"),
    Column("TTFT p99 ms", 20, lambda f: f["ttft_p99_ms"], ".0f"),
    Column("p99/default", 18, lambda f: f.get("p99_ratio"), ".2f"),
    Column("attempts/call", 20, lambda f: f["attempts_per_call"], ".3f"),
    Column("sg att/call", 12, lambda f: f["sg_attempts_per_call"], ".3f"),
    Column("loser tokens", 18, lambda f: f["loser_share"], ".1%"),
    Column("hedges", 7, lambda f: f["hedges_sent"], "d", total=True),
    Column("won", 5, lambda f: f["hedges_won"], "d", total=True),
    Column("fail", 5, lambda f: f["failures"], "d", total=True),
)


def main(argv: list[str] | None = None) -> int:
    parser = vb.parser_for(
        __doc__, quick="60 calls, 1 round", clients=CLIENTS, shape=Shape, rounds=1
    )
    parser.add_argument(
        "--fixed-delay", type=float, help="sg-hedge-fixed's delay, s (default: calibrated)"
    )
    args = parser.parse_args(argv)

    shape = vb.shape_from(args, QUICK if args.quick else Shape())
    clients = vb.client_list(parser, args.clients, CLIENTS)
    seeds = [args.seed * 1000 + r for r in range(args.rounds)]

    with tempfile.TemporaryDirectory(prefix="bench-hedging-") as scratch:
        model_dir = vb.tiny_model(args.model_dir, scratch)
        words = flood_words(model_dir, shape.flood_tokens)
        kv_tokens = (shape.flood + shape.in_flight * 2) * MAX_MODEL_LEN
        print(
            f"workload: {asdict(shape)}, {args.rounds} round(s), seeds {seeds};"
            f" flood of {words} words a prompt, window {flood_window(shape.calls, shape.rate)} s"
        )
        print(f"load average at start: {os.getloadavg()}", flush=True)
        results: list[dict[str, Any]] = []
        with vb.vllm_replicas(
            model_dir, max_model_len=MAX_MODEL_LEN, kv_tokens=kv_tokens
        ) as replicas:
            print(f"replicas: {[r.root for r in replicas]}; flooded: {replicas[1].root}")
            warm = prompts(Shape(calls=4), -2)
            run_client(
                "sg-default", replicas, warm, shape, seed=0, round_=-1, fixed_delay=1.0,
                words=words, flooded=False,
            )  # fmt: skip
            fixed = args.fixed_delay
            if fixed is None:
                calibration = run_client(
                    "sg-default", replicas, prompts(Shape(calls=CALIBRATION_CALLS), -1), shape,
                    seed=-1, round_=-1, fixed_delay=1.0, words=words, flooded=False,
                )  # fmt: skip
                p95 = vb.percentile(calibration.ttfts, 95)
                fixed = round(p95 if p95 is not None else 0.1, 3)
                print(f"calibration: {CALIBRATION_CALLS} calls, no flood: TTFT p95 {fixed} s")
            print(f"sg-hedge-fixed delay: {fixed} s", flush=True)
            for round_, seed in enumerate(seeds):
                texts = prompts(shape, seed)
                order = list(clients)
                random.Random(seed).shuffle(order)
                runs: dict[str, Run] = {}
                for name in order:
                    run = runs[name] = run_client(
                        name, replicas, texts, shape, seed=seed, round_=round_,
                        fixed_delay=fixed, words=words,
                    )  # fmt: skip
                    figures = run.figures(None)
                    print(
                        f"  round {round_} {name}: {run.calls} calls in {run.wall_s:.1f} s,"
                        f" {run.failures} failed, p99 {vb.fmt(figures['ttft_p99_ms'], '.0f')} ms,"
                        f" requests {figures['requests']} (flood {run.flood_requests},"
                        f" {run.flood_failures} failed), generated {figures['generated']:.0f},"
                        f" used {run.used_tokens}, hedges {run.hedges_sent}/{run.hedges_won},"
                        f" load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
                    for error in run.errors[:3]:
                        print(f"    {error}")
                baseline = runs.get(BASELINE)
                for name in clients:
                    figures = runs[name].figures(baseline)
                    figures["fixed_delay_s"] = fixed
                    results.append(figures)
        print()
        print(vb.table(results, clients, COLUMNS, width=15))
        print()
        vb.print_verdicts(results, HEDGE_CLIENTS, verdicts)
        print(f"load average at end: {os.getloadavg()}")
        if args.json:
            Path(args.json).write_text(
                json.dumps({"shape": asdict(shape), "runs": results}, indent=1)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
