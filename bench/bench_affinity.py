"""Prefix-cache affinity on real vLLM: prefill computed, time to first token and
balance, stormguard with and without affinity beside LiteLLM's Router.

    .venv-vllm/bin/python bench/bench_affinity.py [--quick] [--seed 1] [--rounds 2]
        [--clients sg-none,sg-key,...] [--epsilon 0.25] [--slack 2] [--rate 1.5]
        [--replicas 2] [--model-dir DIR] [--json out.json]

Two replicas (``--replicas``) of plain vLLM (the CPU build, ``python -m vllm.entrypoints.openai.
api_server``) serve the tiny random-weight Llama (``stormguard_server.vllm.tiny_model``)
on free loopback ports, automatic prefix caching on (``--enable-prefix-caching``,
blocks of 32 tokens), each bound to a core of its own (``VLLM_CPU_OMP_THREADS_BIND``:
by default all bind to the first core and take turns on it; a third replica on this
2-core machine shares the first core with the first). Each replica's KV cache is
sized from the workload: it holds ``--kv-share`` (0.7) of all the conversations'
distinct prompt tokens, more than the half (or third) a replica holds when each
conversation stays on one replica, less than all of them, which a replica must hold
when the conversations scatter over all. That is the regime where scattering costs
prefill: a replica's least recently used prefixes are evicted before their next turn
comes back.

**The workload** (seeded): ``--conversations`` chats over ``--tenants`` system
prompts of ``--system-words`` words (each tenant's conversations share theirs), each of
``--turns`` turns. A turn sends the whole conversation so far (system prompt, earlier
user messages and replies) plus a new user message of ``--user-words`` words, streamed,
``max_tokens`` 16, temperature 0; the reply kept in the history is the workload's own
fixed text (``--reply-words``), not the model's, so every client sends the very same
prompts. At most ``--in-flight`` turns run at once; the first turns of all conversations
are queued in a seeded order and each finished turn queues its conversation's next at
the back, so every conversation stays live through the run, as chat sessions do.
That closed loop keeps both replicas busy; ``--rate`` runs an open one instead, turns
started at that mean rate (the next queued each time), for a load below what the
replicas can serve, where a turn's time to first token is its own prefill more than
its wait behind others'. ``--model-dir`` takes a larger model built the same way
(``python -m stormguard_server.vllm.tiny_model DIR --hidden-size 512 --layers 4``),
whose prefill costs more than vLLM's per-step overhead; the KV cache is sized from its
config.

**The clients**, each over the same replicas, one after the other, every replica's
prefix cache emptied before each (vLLM's ``POST /reset_prefix_cache``, which needs
``VLLM_SERVER_DEV_MODE=1``) so each client starts cold, in a seeded order per round:

* ``sg-none``: stormguard ``AsyncClient(base_url=[r1, r2], affinity=None)``: power of
  two choices on this client's calls in flight (plain vLLM sends no load headers);
* ``sg-key``: the default ``AffinityPolicy()``, each call with its conversation's
  ``prompt_cache_key``;
* ``sg-derived``: ``AffinityPolicy(derive_from_prompt=True)``, no key;
  (both with ``--epsilon`` and ``--slack``: ``--slack 0`` is the bound of epsilon
  alone, the affinity measured before the slack);
* ``litellm-lb``: LiteLLM ``Router(routing_strategy="least-busy")``, a deployment per
  replica (``hosted_vllm/``);
* ``litellm-pc``: the same with ``optional_pre_call_checks=["prompt_caching"]``, its
  prompt-caching-aware check: it pins a prefix to the deployment that served it only
  when the messages carry ``cache_control`` breakpoints (Anthropic's) and reach 1,024
  tokens; OpenAI-shaped messages to vLLM carry none, so it routes as ``litellm-lb``;
* ``litellm-pc-marked``: that check with a ``cache_control`` breakpoint on each
  request's last message, as Claude Code sends them: LiteLLM pins the prefix to the
  replica that served it (300 s) and sends a later turn that extends it there, with no
  bound on the replica's load;
* ``openai-rr``: openai-python, round-robin by hand, a client per replica.

**The figures**, per client: time to first token (the first streamed chunk, client
side) p50 and p99; prefill tokens computed, the replicas' ``vllm:prompt_tokens`` less
their ``vllm:prefix_cache_hits`` (both read from ``/metrics`` before and after the
client's run), and its reduction against ``sg-none`` of the same round; requests per
replica (``vllm:request_success``) as the busiest replica's share over its fair share;
completed turns per second; turns that moved to another replica than their
conversation's previous turn, where the client says which replica served it; failures.

Targets (affinity against ``sg-none``): prefill computed at least 40 % lower, TTFT p50
at least 30 % lower, no replica above 1.25 times its fair share of requests.
``--quick``: 8 conversations of 3 turns, one round. Not a timed test: the numbers depend
on the machine; vLLM runs niced in its own autogroup as in the vLLM tests, so the
client's clock reads when a chunk arrives, not when the client got the CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from stormguard import AffinityPolicy
from stormguard_drill.replicas.conversations import (
    Conversation,
    build_conversations,
    distinct_tokens,
)
from stormguard_drill.replicas.conversations import ConversationShape as Shape
from vllm_bench import (
    BLOCK_SIZE,
    MODEL,
    Column,
    Replica,
    client_list,
    delta,
    litellm_router,
    metric,
    ms,
    parser_for,
    percentile,
    print_verdicts,
    prompt_ids,
    shape_from,
    table,
    tiny_model,
    vllm_replicas,
)

#: AffinityPolicy's default: at most 1.25 times an endpoint's share of calls in flight.
DEFAULT_EPSILON = AffinityPolicy().epsilon
DEFAULT_SLACK = AffinityPolicy().slack
TARGET_PREFILL_CUT = 0.40
TARGET_TTFT_CUT = 0.30
TARGET_MAX_SHARE = 1.25
MAX_TOKENS = 16
CLIENTS = (
    "sg-none",
    "sg-key",
    "sg-derived",
    "litellm-lb",
    "litellm-pc",
    "litellm-pc-marked",
    "openai-rr",
)
AFFINITY_CLIENTS = ("sg-key", "sg-derived")
BASELINE = "sg-none"


# -- the workload ------------------------------------------------------------------------


QUICK = Shape(conversations=8, tenants=4, turns=3, system_words=400)


# -- the arithmetic ----------------------------------------------------------------------


#: The vLLM counters read before and after each client's run.
COUNTERS = {
    "prompt": ("vllm:prompt_tokens_total", {}),
    "hits": ("vllm:prefix_cache_hits_total", {}),
    "queries": ("vllm:prefix_cache_queries_total", {}),
    "computed": ("vllm:prompt_tokens_by_source_total", {"source": "local_compute"}),
    "requests": ("vllm:request_success_total", {}),
    "preempted": ("vllm:num_preemptions_total", {}),
}


def counters(text: str) -> dict[str, float]:
    return {key: metric(text, name, **labels) for key, (name, labels) in COUNTERS.items()}


def max_share(per_replica: Sequence[float]) -> float | None:
    """The busiest replica's requests over its fair share (1.0: even)."""
    total = sum(per_replica)
    if not per_replica or total <= 0:
        return None
    return max(per_replica) * len(per_replica) / total


def moves(served: Mapping[str, Sequence[str | None]]) -> tuple[int, int]:
    """(turns on another replica than their conversation's previous turn, turns after a
    first whose replica and previous replica are known)."""
    moved = known = 0
    for replicas in served.values():
        for before, now in itertools.pairwise(replicas):
            if before is not None and now is not None:
                known += 1
                moved += before != now
    return moved, known


@dataclass
class Run:
    """One client's run over one workload."""

    client: str
    round: int
    seed: int
    turns: int = 0
    failures: int = 0
    wall_s: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    served: dict[str, list[str | None]] = field(default_factory=dict)
    overflows: int = 0
    replicas: list[dict[str, float]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def total(self, key: str) -> float:
        return sum(r[key] for r in self.replicas)

    @property
    def computed(self) -> float:
        """Prefill tokens computed: prompt tokens less prefix-cache hits."""
        return self.total("prompt") - self.total("hits")

    def figures(self, baseline: Run | None) -> dict[str, Any]:
        done = self.turns - self.failures
        moved, known = moves(self.served)
        figures: dict[str, Any] = {
            "client": self.client,
            "round": self.round,
            "seed": self.seed,
            "turns": self.turns,
            "failures": self.failures,
            "ttft_p50_ms": ms(percentile(self.ttfts, 50)),
            "ttft_p99_ms": ms(percentile(self.ttfts, 99)),
            "turns_per_s": done / self.wall_s if self.wall_s > 0 else None,
            "prompt_tokens": self.total("prompt"),
            "computed_tokens": self.computed,
            "hit_rate": self.total("hits") / self.total("prompt") if self.total("prompt") else None,
            "requests": [r["requests"] for r in self.replicas],
            "max_share": max_share([r["requests"] for r in self.replicas]),
            "moved": moved if known else None,
            "moved_of": known or None,
            "overflows": self.overflows if self.client.startswith("sg-") else None,
            "preempted": self.total("preempted"),
        }
        if baseline is not None:
            figures["prefill_cut"] = _cut(self.computed, baseline.computed)
            figures["ttft_p50_cut"] = _cut(
                figures["ttft_p50_ms"], baseline.figures(None)["ttft_p50_ms"]
            )
        return figures


def _cut(value: float | None, baseline: float | None) -> float | None:
    """How much lower ``value`` is than ``baseline`` (0.4: 40 % lower)."""
    if value is None or not baseline:
        return None
    return 1.0 - value / baseline


def verdicts(figures: Mapping[str, Any]) -> dict[str, bool | None]:
    """The targets an affinity client's figures meet (None: not measured)."""
    share = figures.get("max_share")
    return {
        "prefill": _at_least(figures.get("prefill_cut"), TARGET_PREFILL_CUT),
        "ttft_p50": _at_least(figures.get("ttft_p50_cut"), TARGET_TTFT_CUT),
        "balance": None if share is None else share <= TARGET_MAX_SHARE + 1e-9,
    }


def _at_least(value: float | None, target: float) -> bool | None:
    return None if value is None else value >= target - 1e-9


# -- the replicas ------------------------------------------------------------------------


# -- the clients -------------------------------------------------------------------------

#: One turn: (conversation, turn, messages) -> (seconds to the first chunk, the replica
#: that served it or None, whether stormguard's affinity sent it past its home).
TurnCall = Callable[
    [Conversation, int, list[dict[str, Any]]], Awaitable[tuple[float | None, str | None, bool]]
]


def _replica_of(text: str | None, replicas: Sequence[Replica]) -> str | None:
    if text is None:
        return None
    for replica in replicas:
        if f":{replica.port}" in text:
            return str(replica.port)
    return None


def sg_affinity(name: str, epsilon: float, slack: int) -> AffinityPolicy | None:
    """The ``affinity`` option of stormguard's client ``name``."""
    return {
        "sg-none": None,
        "sg-key": AffinityPolicy(epsilon=epsilon, slack=slack),
        "sg-derived": AffinityPolicy(epsilon=epsilon, slack=slack, derive_from_prompt=True),
    }[name]


@contextlib.asynccontextmanager
async def client_for(
    name: str, replicas: Sequence[Replica], epsilon: float, slack: int = DEFAULT_SLACK
) -> Any:
    urls = [r.base_url for r in replicas]
    if name.startswith("sg-"):
        import stormguard

        affinity = sg_affinity(name, epsilon, slack)
        client = stormguard.AsyncClient(base_url=urls, model=MODEL, timeout=120, affinity=affinity)

        async def sg_call(conv: Conversation, turn: int, messages: list[dict[str, Any]]) -> Any:
            key = {"prompt_cache_key": conv.id} if name == "sg-key" else None
            started = time.monotonic()
            first = None
            stream = await client.chat.completions.create(
                messages=messages,
                max_tokens=MAX_TOKENS,
                temperature=0,
                stream=True,
                extra_body=key,
            )
            async with stream:
                async for _ in stream:
                    if first is None:
                        first = time.monotonic() - started
            attempt = stream.call_info.attempt_history[-1]
            replica = _replica_of(attempt.endpoint, replicas)
            return first, replica, attempt.affinity == "overflow"

        try:
            yield sg_call
        finally:
            await client.close()
    elif name.startswith("litellm-"):
        options: dict[str, Any] = {"routing_strategy": "least-busy", "num_retries": 0}
        if name != "litellm-lb":
            options["optional_pre_call_checks"] = ["prompt_caching"]
        router = litellm_router(replicas, **options)
        marked = name == "litellm-pc-marked"

        async def litellm_call(
            conv: Conversation, turn: int, messages: list[dict[str, Any]]
        ) -> Any:
            if marked:
                messages = [
                    *messages[:-1],
                    {**messages[-1], "cache_control": {"type": "ephemeral"}},
                ]
            started = time.monotonic()
            first = None
            stream = await router.acompletion(
                model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True
            )
            async for _ in stream:
                if first is None:
                    first = time.monotonic() - started
            hidden = getattr(stream, "_hidden_params", {}) or {}
            replica = hidden.get("model_id") or hidden.get("api_base")
            return first, _replica_of(f":{replica}" if replica else None, replicas), False

        yield litellm_call
    elif name == "openai-rr":
        import openai

        clients = [openai.AsyncOpenAI(base_url=u, api_key="none", max_retries=0) for u in urls]
        sent = 0

        async def openai_call(conv: Conversation, turn: int, messages: list[dict[str, Any]]) -> Any:
            nonlocal sent
            index, sent = sent % len(clients), sent + 1
            started = time.monotonic()
            first = None
            stream: Any = await clients[index].chat.completions.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
                max_tokens=MAX_TOKENS,
                temperature=0,
                stream=True,
            )
            async for _ in stream:
                if first is None:
                    first = time.monotonic() - started
            return first, str(replicas[index].port), False

        try:
            yield openai_call
        finally:
            for c in clients:
                await c.close()
    else:
        raise ValueError(f"unknown client {name!r}; one of {', '.join(CLIENTS)}")


# -- the run -----------------------------------------------------------------------------


async def drive(
    call: TurnCall,
    conversations: Sequence[Conversation],
    *,
    in_flight: int,
    seed: int,
    run: Run,
    rate: float | None = None,
) -> None:
    """Every turn of every conversation through ``call``, at most ``in_flight`` at once:
    the first turns in a seeded order, each conversation's next turn queued at the back
    when its turn ends (failed or not: the history is the workload's own). With
    ``rate``, an open loop instead: turns start at seeded exponential intervals of
    mean ``1 / rate`` s, each the next queued one (or, with none queued, the next to
    be), however many are in flight."""
    queue: asyncio.Queue[tuple[Conversation, int] | None] = asyncio.Queue()
    order = list(conversations)
    random.Random(seed).shuffle(order)
    for conv in order:
        queue.put_nowait((conv, 0))
        run.served[conv.id] = []
    left = sum(len(c.users) for c in conversations)
    workers = in_flight if rate is None else 1

    async def one(conv: Conversation, turn: int) -> None:
        nonlocal left
        run.turns += 1
        try:
            first, replica, overflow = await call(conv, turn, conv.messages(turn))
        except Exception as exc:  # counted and shown: a benchmark reports, never stops
            run.failures += 1
            run.errors.append(f"{type(exc).__name__}: {exc}"[:300])
            run.served[conv.id].append(None)
        else:
            if first is None:
                run.failures += 1
                run.errors.append("a stream without a chunk")
            else:
                run.ttfts.append(first)
            run.served[conv.id].append(replica)
            run.overflows += overflow
        left -= 1
        if turn + 1 < len(conv.users):
            queue.put_nowait((conv, turn + 1))
        if left == 0:
            for _ in range(workers):
                queue.put_nowait(None)

    async def worker() -> None:
        while (job := await queue.get()) is not None:
            await one(*job)

    async def arrivals(rate: float) -> None:
        rng = random.Random(seed + 1)
        running: set[asyncio.Task[None]] = set()
        while (job := await queue.get()) is not None:
            task = asyncio.create_task(one(*job))
            running.add(task)
            task.add_done_callback(running.discard)
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*running)

    started = time.monotonic()
    if rate is None:
        await asyncio.gather(*(worker() for _ in range(in_flight)))
    else:
        await arrivals(rate)
    run.wall_s = time.monotonic() - started


def run_client(
    name: str,
    replicas: Sequence[Replica],
    conversations: Sequence[Conversation],
    *,
    in_flight: int,
    seed: int,
    round_: int,
    epsilon: float = DEFAULT_EPSILON,
    slack: int = DEFAULT_SLACK,
    rate: float | None = None,
) -> Run:
    for replica in replicas:
        replica.reset_prefix_cache()
    before = [counters(r.metrics()) for r in replicas]
    run = Run(client=name, round=round_, seed=seed)

    async def main() -> None:
        async with client_for(name, replicas, epsilon, slack) as call:
            await drive(call, conversations, in_flight=in_flight, seed=seed, run=run, rate=rate)

    asyncio.run(main())
    done = run.turns - run.failures
    deadline = time.monotonic() + 30  # vLLM counts a request just after answering it
    while True:
        after = [counters(r.metrics()) for r in replicas]
        counted = sum(a["requests"] - b["requests"] for a, b in zip(after, before, strict=True))
        if counted >= done or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    run.replicas = [delta(a, b) for a, b in zip(after, before, strict=True)]
    return run


def prefix_cache_floor(requests: Iterable[tuple[int, Sequence[int]]], block: int) -> int:
    """Prefill tokens computed by replicas whose prefix caches never evict, for
    ``requests`` (replica, prompt token ids) in order: each prompt less its longest run
    of full blocks that an earlier prompt on the same replica began with (vLLM's
    automatic prefix caching: a chain of block hashes), never the whole prompt (vLLM
    computes at least its last token)."""
    seen: dict[int, set[int]] = {}
    computed = 0
    for replica, tokens in requests:
        cache = seen.setdefault(replica, set())
        chain, hit, matching = 0, 0, True
        for end in range(block, len(tokens) + 1, block):
            chain = hash((chain, tuple(tokens[end - block : end])))
            if matching and chain in cache and end <= len(tokens) - 1:
                hit = end
            else:
                matching = False
            cache.add(chain)
        computed += len(tokens) - hit
    return computed


def affinity_floor(
    conversations: Sequence[Conversation],
    ids: Callable[[list[Any]], list[int]],
    seed: int,
    replicas: int = 2,
) -> int:
    """The least prefill ``replicas`` replicas can compute for the workload: each
    conversation on one replica for all its turns (a seeded random split), nothing ever
    evicted, the turns in the driver's order (every first turn, then every second, ...)."""
    rng = random.Random(seed)
    home = {c.id: rng.randrange(replicas) for c in conversations}
    turns = max(len(c.users) for c in conversations)
    requests = (
        (home[c.id], ids(c.messages(turn)))
        for turn in range(turns)
        for c in conversations
        if turn < len(c.users)
    )
    return prefix_cache_floor(requests, BLOCK_SIZE)


def sizing(
    shape: Shape,
    seeds: Sequence[int],
    model_dir: str,
    kv_share: float,
    in_flight: int,
    replicas: int = 2,
) -> dict[str, Any]:
    """The cache and context the workload needs: ``kv_share`` of the largest working set
    over the seeds, and never less than ``in_flight`` of the longest prompts at once (a
    replica that cannot hold the turns it runs preempts them, which is another test);
    and each seed's ``affinity_floor``."""
    ids = prompt_ids(model_dir)

    def count(messages: list[Any]) -> int:
        return len(ids(messages))

    working, longest, floors = 0, 0, {}
    for seed in seeds:
        conversations = build_conversations(shape, seed)
        working = max(working, distinct_tokens(conversations, count))
        longest = max(longest, max(count(c.messages(len(c.users) - 1)) for c in conversations))
        floors[seed] = affinity_floor(conversations, ids, seed, replicas)
    max_model_len = -(-(longest + MAX_TOKENS) // 256) * 256
    # A turn holds whole blocks, and one more as it decodes past its last: ``in_flight``
    # of the longest at once on one replica (affinity may put them all there) fit.
    per_turn = (-(-(longest + MAX_TOKENS) // BLOCK_SIZE) + 1) * BLOCK_SIZE
    kv_tokens = max(int(working * kv_share), in_flight * per_turn, max_model_len)
    return {
        "working_set": working,
        "longest": longest,
        "max_model_len": max_model_len,
        "kv_tokens": kv_tokens,
        "floor": floors,
    }


# -- the report --------------------------------------------------------------------------


#: The columns of the report.
COLUMNS = (
    Column("TTFT p50 ms", 20, lambda f: f["ttft_p50_ms"], ".0f"),
    Column("TTFT p99 ms", 20, lambda f: f["ttft_p99_ms"], ".0f"),
    Column("computed tok", 24, lambda f: f["computed_tokens"], ".0f"),
    Column("cut vs none", 20, lambda f: f.get("prefill_cut"), ".0%"),
    Column("p50 cut", 20, lambda f: f.get("ttft_p50_cut"), ".0%"),
    Column("max/fair", 18, lambda f: f["max_share"], ".2f"),
    Column("turns/s", 18, lambda f: f["turns_per_s"], ".1f"),
    Column("moved", 12, lambda f: f["moved"] / f["moved_of"] if f["moved_of"] else None, ".0%"),
    Column("fail", 5, lambda f: f["failures"], "d", total=True),
)


def main(argv: list[str] | None = None) -> int:
    parser = parser_for(
        __doc__, quick="8 conversations of 3 turns, 1 round", clients=CLIENTS, shape=Shape,
        rounds=None,
    )  # fmt: skip
    parser.add_argument("--in-flight", type=int, default=None, help="default 6 (quick: 4)")
    parser.add_argument("--kv-share", type=float, default=0.7)
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="an open loop: turns started at this mean rate a second (seeded exponential"
        " gaps), however many are in flight; default: --in-flight at once, a closed loop",
    )
    parser.add_argument(
        "--epsilon",
        type=float,
        default=DEFAULT_EPSILON,
        help="AffinityPolicy.epsilon of sg-key and sg-derived (default 0.25)",
    )
    parser.add_argument(
        "--slack",
        type=int,
        default=DEFAULT_SLACK,
        help=f"AffinityPolicy.slack of sg-key and sg-derived (default {DEFAULT_SLACK};"
        " 0: epsilon's bound alone)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        choices=(2, 3),
        default=2,
        help="vLLM replicas (default 2; a third shares the first core)",
    )
    args = parser.parse_args(argv)

    shape = shape_from(args, QUICK if args.quick else Shape())
    rounds = args.rounds or (1 if args.quick else 2)
    in_flight = args.in_flight or (4 if args.quick else 6)
    clients = client_list(parser, args.clients, CLIENTS)
    seeds = [args.seed * 1000 + r for r in range(rounds)]

    with tempfile.TemporaryDirectory(prefix="bench-affinity-") as scratch:
        model_dir = tiny_model(args.model_dir, scratch)
        sized = sizing(shape, seeds, model_dir, args.kv_share, in_flight, args.replicas)
        print(
            f"workload: {asdict(shape)},"
            f" {f'{args.rate} turns/s' if args.rate else f'{in_flight} in flight'},"
            f" {args.replicas} replicas, {rounds} round(s), seeds {seeds},"
            f" affinity epsilon {args.epsilon}, slack {args.slack}"
        )
        print(
            f"tokens: all conversations' distinct prompt {sized['working_set']}, the longest"
            f" prompt {sized['longest']}; per replica: KV cache {sized['kv_tokens']} tokens"
            f" ({args.kv_share:.0%} of all), max-model-len {sized['max_model_len']}"
        )
        print(f"load average at start: {os.getloadavg()}", flush=True)
        results: list[dict[str, Any]] = []
        with vllm_replicas(
            model_dir,
            max_model_len=sized["max_model_len"],
            kv_tokens=sized["kv_tokens"],
            count=args.replicas,
        ) as replicas:
            capacity = [r.capacity_tokens() for r in replicas]
            print(f"replicas: {[r.root for r in replicas]}, KV capacity (tokens): {capacity}")
            # Warm-up: a turn on each replica (round-robin).
            warm = build_conversations(Shape(conversations=len(replicas), turns=1), seed=-1)
            run_client("openai-rr", replicas, warm, in_flight=len(replicas), seed=0, round_=-1)
            for round_, seed in enumerate(seeds):
                conversations = build_conversations(shape, seed)
                order = list(clients)
                random.Random(seed).shuffle(order)
                runs: dict[str, Run] = {}
                for name in order:
                    runs[name] = run_client(
                        name,
                        replicas,
                        conversations,
                        in_flight=in_flight,
                        seed=seed,
                        round_=round_,
                        epsilon=args.epsilon,
                        slack=args.slack,
                        rate=args.rate,
                    )
                    figures = runs[name].figures(None)
                    print(
                        f"  round {round_} {name}: {figures['turns']} turns in"
                        f" {runs[name].wall_s:.1f} s, {figures['failures']} failed,"
                        f" computed {figures['computed_tokens']:.0f}"
                        f" of {figures['prompt_tokens']:.0f},"
                        f" requests {figures['requests']}, load {os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
                    for error in runs[name].errors[:3]:
                        print(f"    {error}")
                baseline = runs.get(BASELINE)
                floor = sized["floor"][seed]
                print(
                    f"  round {round_}: the floor (each conversation on one replica, no eviction)"
                    f" computes {floor} tokens"
                )
                for name in clients:
                    figures = runs[name].figures(baseline)
                    figures["floor_tokens"] = floor
                    if baseline is not None:
                        figures["floor_cut"] = _cut(floor, baseline.computed)
                    results.append(figures)
        print()
        print(table(results, clients, COLUMNS))
        print()
        print_verdicts(results, AFFINITY_CLIENTS, verdicts)
        print(f"load average at end: {os.getloadavg()}")
        if args.json:
            Path(args.json).write_text(
                json.dumps({"shape": asdict(shape), "sizing": sized, "runs": results}, indent=1)
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
