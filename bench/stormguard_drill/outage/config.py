"""The outage scenario's knobs: its phases (``WINDOWS``), its load, the primary's faults
over time (``OutageConfig.faults_at``), the clients' patience and the targets; the
presets, and the seeded schedule every client replays."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from stormguard_drill.config import FleetWorkload, Mode, PromptShape
from stormguard_drill.workload import Arrival, build_schedule

Window = Literal["healthy", "outage", "recovery", "after"]
WINDOWS: tuple[Window, ...] = ("healthy", "outage", "recovery", "after")

#: Short chat calls: 20-60 prompt tokens, 16 out.
OUTAGE_SHAPE = PromptShape(min_prompt_tokens=20, max_prompt_tokens=60, max_tokens=16)


@dataclass(frozen=True, slots=True)
class OutageTargets:
    """The outage's targets, checked on stormguard's row."""

    min_outage_success: float = 0.999
    max_outage_attempts_per_call: float = 1.1
    #: p99 during the outage no worse than LiteLLM Router's, better than openai's.
    p99_vs_litellm_router: bool = True
    p99_vs_openai: bool = True
    #: Of the calls after the recovery, this share on the primary within ``max_back_s``.
    min_primary_share_after: float = 0.9
    max_back_s: float = 60.0
    #: The primary's attempts over the calls offered, at their peak after the outage.
    max_primary_peak_over_offered: float = 1.5


@dataclass(frozen=True, slots=True)
class OutageConfig:
    """One outage drill: its phases, its load, its faults, its clients' patience."""

    mode: Mode
    seed: int = 0
    rate: float = 10.0
    healthy_s: float = 30.0
    outage_s: float = 60.0
    recovery_s: float = 30.0
    after_s: float = 60.0
    deadline_s: float = 10.0
    #: A first token later than this is a failed attempt, for the clients that bound it.
    first_chunk_s: float = 1.0
    primary_latency_s: float = 0.15
    secondary_latency_s: float = 0.4
    error_rate: float = 0.3
    hang_rate: float = 0.2
    ttft_factor: float = 10.0
    concurrency: int = 1
    shape: PromptShape = OUTAGE_SHAPE
    targets: OutageTargets = field(default_factory=OutageTargets)
    scenario: str = "outage"

    @property
    def duration_s(self) -> float:
        return self.healthy_s + self.outage_s + self.recovery_s + self.after_s

    def window_bounds(self) -> dict[Window, tuple[float, float]]:
        """Each window's [start, end) in seconds from the pairing's start."""
        edges = [0.0]
        for span in (self.healthy_s, self.outage_s, self.recovery_s, self.after_s):
            edges.append(edges[-1] + span)
        return {w: (edges[i], edges[i + 1]) for i, w in enumerate(WINDOWS)}

    def faults_at(self, t: float) -> dict[str, float]:
        """The primary's faults ``t`` seconds into the pairing (its admin body)."""
        bounds = self.window_bounds()
        start, end = bounds["outage"]
        if t < start:
            share = 0.0
        elif t < end:
            share = 1.0
        else:
            ramp_end = bounds["recovery"][1]
            share = max(0.0, (ramp_end - t) / self.recovery_s) if self.recovery_s > 0 else 0.0
        slow = self.primary_latency_s * (1.0 + (self.ttft_factor - 1.0) * share)
        return {
            "error_rate": round(self.error_rate * share, 4),
            "hang_rate": round(self.hang_rate * share, 4),
            "added_latency_ms": round(slow * 1000.0, 1),
        }


def outage_preset(mode: Mode, *, seed: int = 0, concurrency: int | None = None) -> OutageConfig:
    """The full run (a 60 s outage and a 30 s recovery), ``--quick`` (under
    two minutes, its pairings at once) and the e2e test's ``--tiny``."""
    if mode == "full":
        return OutageConfig(mode, seed=seed, concurrency=concurrency or 1)
    if mode == "quick":
        return OutageConfig(
            mode,
            seed=seed,
            rate=4.0,
            healthy_s=5.0,
            outage_s=20.0,
            recovery_s=10.0,
            after_s=25.0,
            deadline_s=5.0,
            concurrency=concurrency or 4,
        )
    return OutageConfig(
        mode,
        seed=seed,
        rate=3.0,
        healthy_s=1.0,
        outage_s=3.0,
        recovery_s=2.0,
        after_s=3.0,
        deadline_s=3.0,
        concurrency=concurrency or 4,
    )


def outage_schedule(config: OutageConfig) -> list[Arrival]:
    """The seeded open-loop schedule of one pairing (every client gets the same)."""
    workload = FleetWorkload(
        duration_s=config.duration_s, rate=config.rate, grace_s=0.0, shape=config.shape
    )
    return build_schedule(workload, config.seed)
