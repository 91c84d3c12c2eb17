"""The drill's knobs: the engine every server runs, the workload, the callers' patience.

One engine for every pairing (only ``--admission`` differs), sized so that a few
long prompts overflow its KV cache. The presets change how long the drill runs,
never the engine or the prompt shapes, so quick and full runs are comparable.

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

# Engine flags passed to every `python -m stormguard_server`. The KV cache holds
# 8192 tokens: two long prompts fit, three do not. Steps are slower than the
# server's defaults so that the token stream (one SSE event per token) leaves
# CPU for the load generator on a 2-core machine.
ENGINE_ARGS: tuple[str, ...] = (
    "--num-kv-blocks",
    "512",
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
class Patience:
    """How the application behind every client behaves (the same for all clients)."""

    timeout_s: float = 10.0  # the caller's timeout, given to the client
    app_retry_pause_s: float = 1.0  # after a final failure the app waits, then calls once more
    app_retries: int = 1


@dataclass(frozen=True, slots=True)
class DrillConfig:
    mode: Mode
    seed: int
    workload: Workload
    calibration_s: float
    calibration_concurrency: int = 32  # = --max-num-seqs: a full batch of admissible work
    patience: Patience = field(default_factory=Patience)
    sample_hz: float = 4.0
    engine: Engine = "sim"
    concurrency: int = 1  # pairings run at once (1: one after another, no CPU contention)


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


def preset(
    mode: Mode, *, seed: int = 0, concurrency: int = 1, engine: Engine = "sim"
) -> DrillConfig:
    """The configuration of one mode on one engine."""
    workload = _WORKLOADS[mode]
    if engine == "vllm":
        workload = replace(
            workload, short=VLLM_SHORT, long=VLLM_LONG, tokens_per_word=VLLM_TOKENS_PER_WORD
        )
    config = DrillConfig(
        mode=mode, seed=seed, workload=workload, calibration_s=_CALIBRATION_S[mode]
    )
    return replace(config, concurrency=concurrency, engine=engine)


def engine_args(engine: Engine) -> tuple[str, ...]:
    """The engine flags of every server (vLLM's --model comes from the run's tiny model)."""
    return VLLM_ENGINE_ARGS if engine == "vllm" else ENGINE_ARGS
