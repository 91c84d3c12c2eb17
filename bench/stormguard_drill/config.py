"""The drill's knobs: the engine every server runs, the workload, the callers' patience.

Three scenarios (``--scenario``), each with its own engine, workload and patience (a
fourth, ``fleet``, has its knobs in ``fleet/config.py``, a fifth, ``quota``, in
``quota/config.py``, a sixth, ``outage``, in ``outage/config.py``):

- ``avalanche`` (the default): the OOM avalanche. One engine for every pairing (only
  ``--admission`` differs), sized so that a few long prompts overflow its KV cache.
- ``burst``: 300 short calls at once against a server that sheds (the engine of
  bench/bench_burst.py), admission on only: see ``BURST_ENGINE_ARGS``.
- ``rebound``: the engine is crashed (admin endpoint) while a backlog of several
  hundred calls waits; what comes back after the cold start must not crash it again.
  See ``REBOUND_ENGINE_ARGS`` and ``REBOUND_SHAPE`` for why they are sized as they are.

The presets change how long the drill runs (and, for the new scenarios, how many calls
the backlog has), never the engine or the prompt shapes, so quick and full runs are
comparable.

Two engines: the simulator (``sim``, the default) and real vLLM (``vllm``, the
CPU build on the tiny local model of docs/vllm.md). The tiny model's context is
1024 tokens and its KV cache 3840, so on vLLM the prompt shapes are scaled down
to press that cache the way the sim shapes press the sim's 8192 tokens; the
arrival schedule (times, rates, counts) is the same on both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

Mode = Literal["full", "quick", "tiny"]
Engine = Literal["sim", "vllm"]
ENGINES: tuple[Engine, ...] = ("sim", "vllm")
Scenario = Literal["avalanche", "burst", "rebound", "fleet", "quota", "outage", "replicas"]
SCENARIOS: tuple[Scenario, ...] = (
    "avalanche",
    "burst",
    "rebound",
    "fleet",
    "quota",
    "outage",
    "replicas",
)
Kind = Literal["short", "medium", "long"]

# Engine flags passed to every `python -m stormguard_server`. The KV cache holds
# 8192 tokens: two long prompts fit, three do not. Steps are slower than the
# server's defaults so that the token stream (one SSE event per token) leaves
# CPU for the load generator on a 2-core machine.
# Without the prefix cache (the server's default is on, as vLLM V1's), as when these
# scenarios' figures were measured: their prompts share no leading block, but a
# retried call would hit its first attempt's blocks. The replicas scenario turns it on.
NO_PREFIX_CACHING = "--no-prefix-caching"
# The engine's shape and step costs, the same in every scenario of the sim drill.
ENGINE_STEPS: tuple[str, ...] = (
    "--block-size",
    "16",
    "--max-model-len",
    "4096",
    "--max-num-seqs",
    "32",
    "--max-num-batched-tokens",
    "1024",
    "--step-base-ms",
    "8",
    "--decode-seq-us",
    "400",
)
ENGINE_ARGS: tuple[str, ...] = (
    NO_PREFIX_CACHING,
    "--num-kv-blocks",
    "512",
    *ENGINE_STEPS,
    "--restart-s",
    "3",
    "--slow-start-s",
    "2",
)
# Seconds of a cold start: --restart-s (the warm-up probe adds ~0.1 s).
COLD_START_S = 3.0

# vLLM flags of every `python -m stormguard_server --engine vllm` (besides --model):
# docs/vllm.md's tiny setup. A 4 MB KV cache is 3840 tokens of the tiny model
# (budget 0.9 x 3840 = 3456 behind admission); eager mode starts in ~20 s instead
# of ~50 s; at most 32 sequences in a batch, as in the sim engine.
# Where vLLM puts the ZMQ sockets between its API server and engine core (the temp
# directory unless set); it leaves them when killed, so each server gets its own.
VLLM_IPC_ENV = "VLLM_RPC_BASE_PATH"
VLLM_ENGINE_ARGS: tuple[str, ...] = (
    "--max-model-len",
    "1024",
    "--kv-cache-memory-bytes",
    "4000000",
    "--enforce-eager",
    "--max-num-seqs",
    "32",
)


@dataclass(frozen=True, slots=True)
class PromptShape:
    """Prompt length range (server tokens) and max_tokens of one kind of request."""

    min_prompt_tokens: int
    max_prompt_tokens: int
    max_tokens: int


SHORT = PromptShape(min_prompt_tokens=30, max_prompt_tokens=90, max_tokens=64)
# "A few very long inputs" (the OOM-avalanche write-up): ~3000-token prompts, 3 of them
# overflow the cache.
LONG = PromptShape(min_prompt_tokens=2800, max_prompt_tokens=3300, max_tokens=128)

# The vLLM workload shape (max_model_len 1024, KV cache 3840 tokens): short prompts
# as in the sim; long ones of 600-800 tokens, +128 generated: ~750-920 tokens of KV
# each, so four fit in the admission budget (3456), the burst's eight ask for ~1.7x
# the whole cache, and each stays under max_model_len with the chat template.
VLLM_SHORT = SHORT
VLLM_LONG = PromptShape(min_prompt_tokens=600, max_prompt_tokens=800, max_tokens=128)
# The drill's prompt words are one token each for the sim tokenizer; the tiny model's
# byte-level BPE splits some of them (batch, window, kernel, decode, client, admit)
# into 4-5 tokens: 2.0 tokens a word on average. Measured with the tiny model's
# tokenizer and chat template on seed 0's schedules: long prompts 611-789 tokens,
# short ones 29-120 (90% within 41-103; short prompts have few words to average over).
VLLM_TOKENS_PER_WORD = 2.0


@dataclass(frozen=True, slots=True)
class Workload:
    """When requests arrive. Times are seconds from the start of a pairing."""

    duration_s: float
    short_rate: float  # Poisson arrivals per second of short prompts, the whole time
    burst_start_s: float
    burst_end_s: float
    long_count: int  # long prompts, evenly spread over the burst window
    grace_s: float  # after the last arrival, how long unfinished calls may still run
    short: PromptShape = SHORT
    long: PromptShape = LONG
    tokens_per_word: float = 1.0  # server tokens per prompt word (1: the sim tokenizer)


@dataclass(frozen=True, slots=True)
class Wave:
    """``count`` requests of one shape, evenly spread over [start_s, end_s) (all at
    ``start_s`` when the window is empty): a fixed count, never left to chance."""

    count: int
    start_s: float
    end_s: float
    shape: PromptShape
    kind: Kind


@dataclass(frozen=True, slots=True)
class BacklogWorkload:
    """The burst and the rebound: waves of calls, and for the rebound an engine crash
    (``POST /admin/crash``) at ``crash_at_s``. Times are seconds from the start of a
    pairing."""

    waves: tuple[Wave, ...]
    grace_s: float  # after the last arrival, how long unfinished calls may still run
    crash_at_s: float | None = None
    tokens_per_word: float = 1.0

    @property
    def duration_s(self) -> float:
        """When the last call arrives."""
        return max(max(w.start_s, w.end_s) for w in self.waves)

    @property
    def calls(self) -> int:
        return sum(w.count for w in self.waves)


@dataclass(frozen=True, slots=True)
class FleetWorkload:
    """Poisson arrivals of one prompt shape over ``duration_s``: the fleet's (shared out
    between its client processes, arrival ``i`` to process ``i % processes``) and the
    outage's."""

    duration_s: float
    rate: float  # arrivals per second, the whole fleet
    grace_s: float  # after the last arrival, how long unfinished calls may still run
    shape: PromptShape
    tokens_per_word: float = 1.0


AnyWorkload = Workload | BacklogWorkload


@dataclass(frozen=True, slots=True)
class Patience:
    """How the application behind every client behaves (the same for all clients)."""

    timeout_s: float = 10.0  # the caller's timeout, given to the client
    app_retry_pause_s: float = 1.0  # after a final failure the app waits, then calls once more
    app_retries: int = 1
    # The caller's deadline: it gives up on a logical request this long after issuing
    # it, app retries included (None: only the client's own timeout bounds a call).
    deadline_s: float | None = None


@dataclass(frozen=True, slots=True)
class Targets:
    """What the default stormguard client should reach in a backlog scenario (every
    pairing is checked against them; the ``missed`` column names the misses)."""

    min_success: float = 0.99
    max_attempts_per_call: float = 1.15
    min_goodput_ratio: float | None = None  # goodput / calibrated capacity
    max_p99_over_drain: float | None = None  # p99 latency / the backlog's drain time
    max_extra_crashes: int | None = None  # crashes beyond the drill's own (admin) crash


@dataclass(frozen=True, slots=True)
class DrillConfig:
    mode: Mode
    seed: int
    workload: AnyWorkload
    calibration_s: float
    calibration_concurrency: int = 32  # = --max-num-seqs: a full batch of admissible work
    patience: Patience = field(default_factory=Patience)
    sample_hz: float = 4.0
    engine: Engine = "sim"
    concurrency: int = 1  # pairings run at once (1: one after another, no CPU contention)
    scenario: Scenario = "avalanche"
    targets: Targets | None = None


_WORKLOADS: dict[Mode, Workload] = {
    "full": Workload(
        duration_s=50.0,
        short_rate=14.0,
        burst_start_s=15.0,
        burst_end_s=19.0,
        long_count=8,
        grace_s=12.0,
    ),
    "quick": Workload(
        duration_s=13.0,
        short_rate=14.0,
        burst_start_s=3.0,
        burst_end_s=5.0,
        long_count=6,
        grace_s=3.0,
    ),
    # For the end-to-end test only: proves the machinery, shows nothing.
    "tiny": Workload(
        duration_s=3.0,
        short_rate=6.0,
        burst_start_s=1.0,
        burst_end_s=1.5,
        long_count=2,
        grace_s=2.0,
    ),
}
_CALIBRATION_S: dict[Mode, float] = {"full": 12.0, "quick": 5.0, "tiny": 1.5}

# -- burst: a burst against a server that sheds -----------------------------------------

# bench/bench_burst.py's server (the baseline of docs/benchmarks.md): a KV cache of
# 256 x 16 = 4096 tokens (budget 0.9 x 4096 = 3686), at most 16 sequences running and
# 8 waiting for admission; the rest of the server's defaults (4 ms steps, OOM mode on:
# admission keeps it from ever happening). A call costs its prompt + max_tokens in whole
# blocks, ~80-150 tokens, so the budget admits ~32 of the 300 (the engine runs 16 of
# them, the others wait inside it), 8 more wait in the admission queue, the rest are
# shed at once with a Retry-After: a server that sheds ~85 % of a burst it drains in ~6 s.
# Admission off makes no sense here: the scenario is a server that sheds, and without
# admission nothing is shed (the engine's FIFO queues all 300 and simply drains them).
BURST_ENGINE_ARGS: tuple[str, ...] = (
    NO_PREFIX_CACHING,
    "--num-kv-blocks",
    "256",
    "--max-num-seqs",
    "16",
    "--max-queue-requests",
    "8",
)
BURST_SKIP_OFF_REASON = (
    "admission-off pairings skipped in the burst: the scenario is a server that sheds, and"
    " without admission nothing is shed (the engine's queue takes all 300 calls)"
)
# Short chat calls with max_tokens 32, as bench_burst's (the sim's natural output
# length, 32-96 tokens, then stops nearly every one at 32).
BURST_SHAPE = PromptShape(min_prompt_tokens=30, max_prompt_tokens=90, max_tokens=32)
_BURST_CALLS: dict[Mode, int] = {"full": 300, "quick": 150, "tiny": 40}
_BURST_CALIBRATION_S: dict[Mode, float] = {"full": 8.0, "quick": 5.0, "tiny": 1.5}
# 60 s for each call (the caller's deadline, also the client's timeout); no app-level
# second call, as in bench_burst: the client alone decides what a shed becomes.
BACKLOG_DEADLINE_S = 60.0
BURST_PATIENCE = Patience(timeout_s=BACKLOG_DEADLINE_S, app_retries=0, deadline_s=60.0)
BURST_TARGETS = Targets(min_goodput_ratio=0.90, max_p99_over_drain=1.2)

# -- rebound: a cold start, then the backlog's rebound ----------------------------------

# The avalanche's engine (8192 KV tokens, 32 sequences, 8 ms steps, --restart-s 3) with
# the server's own slow start off: the client's ramp must hold even when the server
# does no slow start of its own. The admin endpoint is on (the drill crashes the engine).
REBOUND_ENGINE_ARGS: tuple[str, ...] = (
    *ENGINE_ARGS[: ENGINE_ARGS.index("--slow-start-s")],
    "--slow-start-s",
    "0",
)
# Why this prompt shape: prompts of 240-320 words (253-333 server tokens with the
# chat template) and max_tokens 64 hold up to 253-397 tokens of KV each, ~330 on
# average while they run, so the 8192-token cache holds ~24 of them at once, while the
# engine starts up to --max-num-seqs 32 of them (as vLLM does, it trusts its memory
# profile: OOM mode). With admission off, then, a client that sends its whole backlog
# when the engine is back fills the batch to 32 and OOMs it again (32 x ~330 > 8192),
# and one that comes back at about the concurrency it had before the crash (~18) does
# not: the cache holds more than that and than stormguard's initial limit (20), fewer
# than a full batch. It tests the ramp, not only where it starts: a limit that grows
# by one per round trip while nothing is shed passes ~24 some ten round trips after
# its slow start ends, before a backlog of this size has drained.
# Behind admission a call costs its prompt + max_tokens in whole blocks (320-400), the
# budget (0.9 x 8192) admits ~20 at once, and nothing can OOM.
REBOUND_SHAPE = PromptShape(min_prompt_tokens=240, max_prompt_tokens=320, max_tokens=64)
# (steady calls over [0, crash), backlog over [crash, 2 s)): a steady load that the
# engine holds until the drill crashes it at 1 s (~18 running, KV ~0.7), then the
# backlog: the calls that keep arriving during the first second of the 3 s cold start,
# to wait through it (sent by an impatient client, refused while the engine is down).
# The steady calls are few because they must not OOM the admission-off engine before
# its crash, whatever the client: all 20 fit the cache even at their longest at once
# (20 x 25 blocks <= 512), so the only crash before the rebound is the drill's own;
# and the replay releases the backlog only once the crash is sent (runner.py).
_REBOUND_WAVES: dict[Mode, tuple[int, int]] = {
    "full": (20, 330),
    "quick": (12, 188),
    "tiny": (4, 36),
}
REBOUND_CRASH_AT_S = 1.0
REBOUND_BACKLOG_END_S = 2.0
_REBOUND_CALIBRATION_S: dict[Mode, float] = {"full": 8.0, "quick": 5.0, "tiny": 1.5}
# The same 60 s deadline; one app-level second call (as in the avalanche, after 1 s),
# because the crash cuts the ~18 streams running at 1 s: no client resumes a
# half-streamed answer, the application asks again (without it ~5 % of the calls would
# fail by construction, and the 99 % target could not be met).
REBOUND_PATIENCE = Patience(timeout_s=BACKLOG_DEADLINE_S, app_retries=1, deadline_s=60.0)
REBOUND_TARGETS = Targets(max_extra_crashes=0)


def _backlog_grace(patience: Patience) -> float:
    # The app gives up at its deadline; 2 s more for the last answers to come in.
    return (patience.deadline_s or patience.timeout_s) + 2.0


def _burst_workload(mode: Mode) -> BacklogWorkload:
    wave = Wave(_BURST_CALLS[mode], 0.0, 0.0, BURST_SHAPE, "short")
    return BacklogWorkload(waves=(wave,), grace_s=_backlog_grace(BURST_PATIENCE))


def _rebound_workload(mode: Mode) -> BacklogWorkload:
    steady, backlog = _REBOUND_WAVES[mode]
    crash, end = REBOUND_CRASH_AT_S, REBOUND_BACKLOG_END_S
    waves = (
        Wave(steady, 0.0, crash, REBOUND_SHAPE, "medium"),
        Wave(backlog, crash, end, REBOUND_SHAPE, "medium"),
    )
    return BacklogWorkload(waves=waves, grace_s=_backlog_grace(REBOUND_PATIENCE), crash_at_s=crash)


def preset(
    mode: Mode,
    *,
    seed: int = 0,
    concurrency: int = 1,
    engine: Engine = "sim",
    scenario: Scenario = "avalanche",
) -> DrillConfig:
    """The configuration of one mode of one scenario on one engine."""
    if scenario == "burst":
        return DrillConfig(
            mode=mode,
            seed=seed,
            workload=_burst_workload(mode),
            calibration_s=_BURST_CALIBRATION_S[mode],
            # As many callers as admission holds without shedding (its budget takes ~32
            # of these calls, the queue 8 more): the 16-sequence batch never empties
            # while a caller turns around, so the figure is the engine's, saturated.
            calibration_concurrency=32,
            patience=BURST_PATIENCE,
            engine=engine,
            concurrency=concurrency,
            scenario=scenario,
            targets=BURST_TARGETS,
        )
    if scenario == "rebound":
        return DrillConfig(
            mode=mode,
            seed=seed,
            workload=_rebound_workload(mode),
            calibration_s=_REBOUND_CALIBRATION_S[mode],
            patience=REBOUND_PATIENCE,
            engine=engine,
            concurrency=concurrency,
            scenario=scenario,
            targets=REBOUND_TARGETS,
        )
    workload = _WORKLOADS[mode]
    if engine == "vllm":
        workload = replace(
            workload, short=VLLM_SHORT, long=VLLM_LONG, tokens_per_word=VLLM_TOKENS_PER_WORD
        )
    config = DrillConfig(
        mode=mode, seed=seed, workload=workload, calibration_s=_CALIBRATION_S[mode]
    )
    return replace(config, concurrency=concurrency, engine=engine)


def engine_args(engine: Engine, scenario: Scenario = "avalanche") -> tuple[str, ...]:
    """The engine flags of every server (vLLM's --model comes from the run's tiny model)."""
    if engine == "vllm":
        return VLLM_ENGINE_ARGS
    return {"burst": BURST_ENGINE_ARGS, "rebound": REBOUND_ENGINE_ARGS}.get(scenario, ENGINE_ARGS)
