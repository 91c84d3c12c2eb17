"""The quota scenario's knobs: one API key's quota, a batch of calls, and the variants.

A batch job meets a hosted API's quota: P worker processes x W threads (or tasks) each
share N chat calls, all on ONE API key, each call with its deadline. The reference
server emulates the quota (docs/server.md, "Hosted-API quota": token and request
buckets that refill continuously, OpenAI's 429s and ``x-ratelimit-*`` headers) and
answers every call in about half a second, as a hosted model does
(``--added-latency-ms 500`` with the engine's own step times set to 0).

A variant is one setting of what differs between providers and jobs: the number of
worker processes; which limit binds (TPM: tokens; RPM: requests; the other is set too,
high enough never to bind, as a provider sets both); where a 429 says when to come
back (``retry-after`` in seconds, or nowhere); and whether the ``x-ratelimit-*``
headers come at all. The default matrix is a base variant and one change of it at a
time; the CLI's flags ask for the cross product of any values instead.

The ideal wall time of a batch (``ideal_wall_s``) is what the quota allows: the tokens
(or requests) beyond the initial bucket at the refill rate, plus one answer for the
last call admitted, and never less than the workers need to answer every call one
after another (``ceil(N / (P x W))`` answers).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal

from stormguard_drill.config import NO_PREFIX_CACHING, Mode, PromptShape
from stormguard_server.config import RetryAfterMode

__all__ = [
    "BOUNDS",
    "QUOTA_ENGINE_ARGS",
    "Bound",
    "QuotaLimits",
    "QuotaRunConfig",
    "QuotaTargets",
    "QuotaVariant",
    "QuotaWorkload",
    "default_variants",
    "quota_preset",
]

Bound = Literal["tpm", "rpm"]
BOUNDS: tuple[Bound, ...] = ("tpm", "rpm")

# The server's half-second answers (docs/server.md, "A hosted API's answer time"), and
# room for every worker's call at once: 16 processes x 8 workers x ~330 tokens of KV is
# ~42,000 tokens, well inside 8192 blocks x 16 = 131,072 (admission never queues a
# call), at most 256 sequences in the batch.
ANSWER_S = 0.5
QUOTA_ENGINE_ARGS: tuple[str, ...] = (
    NO_PREFIX_CACHING,
    "--added-latency-ms",
    str(int(ANSWER_S * 1000)),
    "--step-base-ms",
    "0",
    "--prefill-token-us",
    "0",
    "--decode-seq-us",
    "0",
    "--num-kv-blocks",
    "8192",
    "--block-size",
    "16",
    "--max-num-seqs",
    "256",
    "--max-num-batched-tokens",
    "8192",
)

# ~315 tokens a call at the server (prompt + max_tokens): prompts of 212-252 words (one
# token each for the sim tokenizer, plus the request number and the chat template).
QUOTA_SHAPE = PromptShape(min_prompt_tokens=212, max_prompt_tokens=252, max_tokens=64)


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """The key's per-minute limits: both are set, as a provider sets both."""

    tpm: int
    rpm: int


@dataclass(frozen=True, slots=True)
class QuotaVariant:
    """One setting of the job and of the provider."""

    processes: int
    bound: Bound = "tpm"
    retry_after: RetryAfterMode = "seconds"
    headers: bool = True  # the x-ratelimit-* headers on every answer

    @property
    def name(self) -> str:
        """``P4 tpm ra=seconds hdr``: the table's variant column."""
        return f"P{self.processes} {self.bound} ra={self.retry_after} " + (
            "hdr" if self.headers else "no-hdr"
        )

    @property
    def slug(self) -> str:
        """The variant in a file name."""
        return self.name.replace(" ", "-").replace("=", "-")


@dataclass(frozen=True, slots=True)
class QuotaWorkload:
    """The batch: ``calls`` chat calls of one shape, all there at the start, shared out
    between the processes (call ``i`` to process ``i % P``), ``workers`` threads (or
    tasks) per process taking the next one as each finishes."""

    calls: int
    workers: int
    deadline_s: float  # each call's, from when a worker starts it (the client's timeout too)
    tpm_bound: QuotaLimits  # the limits of a TPM-bound variant
    rpm_bound: QuotaLimits  # and of an RPM-bound one
    # The batch stops starting calls this long after its start (each call still running
    # then has its own deadline): a client that waits minutes per call cannot hold the
    # drill for hours. Calls never started are failures ("not started").
    give_up_after_s: float
    shape: PromptShape = QUOTA_SHAPE
    answer_s: float = ANSWER_S

    def limits(self, bound: Bound) -> QuotaLimits:
        return self.tpm_bound if bound == "tpm" else self.rpm_bound

    def ideal_wall_s(self, variant: QuotaVariant, demand_tokens: int) -> float:
        """The shortest batch the quota and the workers allow (see the module doc)."""
        limits = self.limits(variant.bound)
        beyond_tokens = max(0, demand_tokens - limits.tpm) / (limits.tpm / 60)
        beyond_requests = max(0, self.calls - limits.rpm) / (limits.rpm / 60)
        quota = max(beyond_tokens, beyond_requests) + self.answer_s
        rounds = math.ceil(self.calls / (variant.processes * self.workers)) * self.answer_s
        return max(quota, rounds)


@dataclass(frozen=True, slots=True)
class QuotaTargets:
    """What the default stormguard client should reach (every run is checked; the
    ``missed`` column names the misses)."""

    min_success: float = 0.999
    max_requests_per_call: float = 1.05  # counted at the server
    max_wall_over_ideal: float = 1.15


@dataclass(frozen=True, slots=True)
class QuotaRunConfig:
    """The whole quota drill: the batch, the variants, how many runs at once."""

    mode: Mode
    seed: int
    workload: QuotaWorkload
    variants: tuple[QuotaVariant, ...]
    targets: QuotaTargets = QuotaTargets()
    concurrency: int = 1  # runs at once, each on its own server (1: no CPU contention)
    stream: bool = False  # whole answers, as a batch job asks for them (True: streamed)
    sample_hz: float = 2.0
    engine_args: tuple[str, ...] = QUOTA_ENGINE_ARGS
    scenario: Literal["quota"] = "quota"


def server_args(workload: QuotaWorkload, variant: QuotaVariant) -> tuple[str, ...]:
    """The quota flags of one variant's server."""
    limits = workload.limits(variant.bound)
    flags = [
        "--quota-tpm",
        str(limits.tpm),
        "--quota-rpm",
        str(limits.rpm),
        "--quota-retry-after",
        variant.retry_after,
    ]
    if not variant.headers:
        flags.append("--no-quota-headers")
    return tuple(flags)


# The batch at each size. full: the measured stand-in's batch (300 calls of ~315 tokens,
# 94,500 tokens, on 60,000 TPM: ~35 s beyond the first bucket; on 180 RPM, 40 s), 8
# workers a process, 120 s a call. quick and tiny: the same shape with fewer calls, just
# over the bucket, so that the quota binds for seconds, not a minute.
_WORKLOADS: dict[Mode, QuotaWorkload] = {
    "full": QuotaWorkload(
        calls=300,
        workers=8,
        deadline_s=120.0,
        tpm_bound=QuotaLimits(tpm=60_000, rpm=3_000),
        rpm_bound=QuotaLimits(tpm=1_000_000, rpm=180),
        give_up_after_s=300.0,
    ),
    "quick": QuotaWorkload(
        calls=70,
        workers=8,
        deadline_s=30.0,
        tpm_bound=QuotaLimits(tpm=20_000, rpm=1_000),
        rpm_bound=QuotaLimits(tpm=1_000_000, rpm=60),
        give_up_after_s=45.0,
    ),
    # For the end-to-end test only: proves the machinery, shows nothing.
    "tiny": QuotaWorkload(
        calls=20,
        workers=4,
        deadline_s=15.0,
        tpm_bound=QuotaLimits(tpm=6_000, rpm=1_000),
        rpm_bound=QuotaLimits(tpm=1_000_000, rpm=16),
        give_up_after_s=20.0,
    ),
}
# The base variant of each size; the default matrix changes one thing of it at a time.
_BASE: dict[Mode, QuotaVariant] = {
    "full": QuotaVariant(processes=4),
    "quick": QuotaVariant(processes=2),
    "tiny": QuotaVariant(processes=2),
}


def default_variants(mode: Mode) -> tuple[QuotaVariant, ...]:
    """full: the base (4 processes, TPM-bound, retry-after in seconds, headers on), then
    1 and 16 processes, no Retry-After, no x-ratelimit headers, RPM-bound; quick and
    tiny: their base alone."""
    base = _BASE[mode]
    if mode != "full":
        return (base,)
    return (
        base,
        replace(base, processes=1),
        replace(base, processes=16),
        replace(base, retry_after="none"),
        replace(base, headers=False),
        replace(base, bound="rpm"),
    )


def cross_variants(
    mode: Mode,
    processes: tuple[int, ...] | None,
    bounds: tuple[Bound, ...] | None,
    retry_afters: tuple[RetryAfterMode, ...] | None,
    headers: tuple[bool, ...] | None,
) -> tuple[QuotaVariant, ...]:
    """Every combination of the values given, the base variant's for the others."""
    base = _BASE[mode]
    return tuple(
        QuotaVariant(processes=p, bound=b, retry_after=r, headers=h)
        for p in processes or (base.processes,)
        for b in bounds or (base.bound,)
        for r in retry_afters or (base.retry_after,)
        for h in headers or (base.headers,)
    )


def quota_preset(
    mode: Mode,
    *,
    seed: int = 0,
    concurrency: int = 1,
    variants: tuple[QuotaVariant, ...] | None = None,
    calls: int | None = None,
    workers: int | None = None,
    stream: bool = False,
) -> QuotaRunConfig:
    """The quota drill at one size (``variants``: the default matrix when None)."""
    workload = _WORKLOADS[mode]
    if calls is not None:
        workload = replace(workload, calls=calls)
    if workers is not None:
        workload = replace(workload, workers=workers)
    return QuotaRunConfig(
        mode=mode,
        seed=seed,
        workload=workload,
        variants=variants or default_variants(mode),
        concurrency=concurrency,
        stream=stream,
    )
