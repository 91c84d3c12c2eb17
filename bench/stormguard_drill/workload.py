"""The seeded schedule of requests: every pairing replays exactly the same one.

One builder per kind of workload, all behind ``build_schedule``. The avalanche:
short prompts arrive as a Poisson process the whole time; a fixed number of long
prompts arrive evenly spread over the burst window (a fixed count, so that a short
window does not leave the burst to chance). The burst and the rebound
(``BacklogWorkload``): waves of a fixed count each, evenly spread over their window
(all at its start when the window is empty). The fleet (``FleetWorkload``): Poisson
arrivals of one shape the whole time. Prompt lengths are drawn per request; the
text is built from one-token words of the sim tokenizer, so a prompt of n words
costs about n tokens at the server. Tokenizers that split those words (vLLM's tiny
model: ~2.1 tokens a word) get ``tokens / tokens_per_word`` words, so the shapes
stay in server tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from stormguard_drill.config import (
    AnyWorkload,
    BacklogWorkload,
    FleetWorkload,
    Kind,
    PromptShape,
    Wave,
    Workload,
)

# One token each for the sim tokenizer (words of up to 8 characters, space included).
_WORDS = (
    *("the", "cache", "queue", "token", "batch", "model", "server", "retry", "budget"),
    *("prompt", "window", "kernel", "stream", "block", "decode", "memory", "restart"),
    *("engine", "client", "load", "shed", "admit"),
)


@dataclass(frozen=True, slots=True)
class Arrival:
    """One logical request: when the application issues it and what it asks."""

    index: int
    at_s: float
    kind: Kind
    prompt: str
    max_tokens: int

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.prompt}]


def _poisson_times(rng: random.Random, rate: float, start: float, end: float) -> list[float]:
    times: list[float] = []
    if rate <= 0:
        return times
    t = start + rng.expovariate(rate)
    while t < end:
        times.append(t)
        t += rng.expovariate(rate)
    return times


def _prompt(rng: random.Random, shape: PromptShape, index: int, tokens_per_word: float) -> str:
    tokens = rng.randint(shape.min_prompt_tokens, shape.max_prompt_tokens)
    words = max(1, round(tokens / tokens_per_word))
    # The request number first: every prompt differs, so output lengths (a hash of
    # the prompt in the sim engine) differ too.
    body = " ".join(rng.choice(_WORDS) for _ in range(words))
    return f"request {index}: {body}"


def build_schedule(workload: AnyWorkload | FleetWorkload, seed: int) -> list[Arrival]:
    """Every arrival of one pairing, sorted by time."""
    if isinstance(workload, FleetWorkload):
        return _fleet_schedule(workload, seed)
    if isinstance(workload, BacklogWorkload):
        return _backlog_schedule(workload, seed)
    return _avalanche_schedule(workload, seed)


def calibration_pool(workload: AnyWorkload, seed: int) -> list[Arrival]:
    """Prompts for the calibration, drawn (with another seed) from the shapes that the
    scenario's steady work has: the avalanche's short prompts, every backlog call."""
    pool = build_schedule(workload, seed)
    if isinstance(workload, Workload):
        pool = [a for a in pool if a.kind == "short"]
    return pool


def _wave_times(wave: Wave) -> list[float]:
    window = wave.end_s - wave.start_s
    return [wave.start_s + window * i / wave.count for i in range(wave.count)]


def _backlog_schedule(workload: BacklogWorkload, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    timed = sorted(
        ((t, n, wave) for n, wave in enumerate(workload.waves) for t in _wave_times(wave)),
        key=lambda item: (item[0], item[1]),
    )
    return [
        Arrival(
            index=index,
            at_s=at,
            kind=wave.kind,
            prompt=_prompt(rng, wave.shape, index, workload.tokens_per_word),
            max_tokens=wave.shape.max_tokens,
        )
        for index, (at, _, wave) in enumerate(timed)
    ]


def _avalanche_schedule(workload: Workload, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    timed: list[tuple[float, Kind]] = [
        (t, "short") for t in _poisson_times(rng, workload.short_rate, 0.0, workload.duration_s)
    ]
    window = workload.burst_end_s - workload.burst_start_s
    timed += [
        (workload.burst_start_s + window * i / workload.long_count, "long")
        for i in range(workload.long_count)
    ]
    timed.sort()
    arrivals = []
    for index, (at, kind) in enumerate(timed):
        shape = workload.short if kind == "short" else workload.long
        arrivals.append(
            Arrival(
                index=index,
                at_s=at,
                kind=kind,
                prompt=_prompt(rng, shape, index, workload.tokens_per_word),
                max_tokens=shape.max_tokens,
            )
        )
    return arrivals


def _fleet_schedule(workload: FleetWorkload, seed: int) -> list[Arrival]:
    rng = random.Random(seed)
    times = _poisson_times(rng, workload.rate, 0.0, workload.duration_s)
    shape = workload.shape
    return [
        Arrival(
            index=index,
            at_s=at,
            kind="short",
            prompt=_prompt(rng, shape, index, workload.tokens_per_word),
            max_tokens=shape.max_tokens,
        )
        for index, at in enumerate(times)
    ]
