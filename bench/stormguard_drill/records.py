"""What a pairing measured, as the summaries, the report and the plots read it:
``LogicalResult`` (how one logical request ended, every scenario's), ``PairingRun`` (one
client x server pairing of the avalanche, the burst or the rebound), ``Calibration``
(the engine's capacity) and the server's ``Admission`` setting. Records only: whoever
computes a figure from them imports this, never the runner that filled them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from stormguard_drill.clients.drill_client import ClientName
from stormguard_drill.config import Kind

Admission = Literal["off", "on"]
ADMISSIONS: tuple[Admission, ...] = ("off", "on")


@dataclass(frozen=True, slots=True)
class LogicalResult:
    """How one logical request ended; times in seconds from the pairing's start."""

    index: int
    kind: Kind
    start_s: float
    end_s: float
    ok: bool
    completion_tokens: int
    first_token_s: float | None  # when its successful call's first chunk came
    app_calls: int
    error: str | None  # the last failure's exception class

    @property
    def latency_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.start_s


@dataclass
class PairingRun:
    """Everything measured in one client x server pairing."""

    client: ClientName
    admission: Admission
    engine: str
    results: list[LogicalResult]
    client_attempts: int | None  # None: the client counts none (LiteLLM)
    samples: list[tuple[float, dict[str, float]]]
    final_metrics: dict[str, float]
    max_in_flight: int
    client_stats: dict[str, float] = field(default_factory=dict)
    # Mid-run actions, seconds from the start: {"crash_sent_s": ...} in the rebound.
    events: dict[str, float] = field(default_factory=dict)
    # CPU seconds of the drill's process while the pairing ran: the client's cost (the
    # sampler's too; with --concurrency > 1, every pairing running meanwhile).
    client_cpu_s: float | None = None

    @property
    def name(self) -> str:
        return f"{self.client} / admission {self.admission}"


@dataclass(frozen=True, slots=True)
class Calibration:
    """The engine's capacity: completion tokens/s under a full batch of admissible work."""

    capacity_tps: float
    calls: int
    window_s: float
    concurrency: int
