"""What one replicas pairing measured: each call (``CallRecord``) and each replica's
counters over the run (``ReplicasRun``). Records only: the figures (``summary.py``)
import this, never the runner that filled it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stormguard_drill.replicas.clients import ReplicasClientName
from stormguard_drill.replicas.config import Part

#: The replicas' counters read before and after a pairing's run: (key, series).
COUNTERS: tuple[tuple[str, str], ...] = (
    ("requests", "stormguard_attempts_total"),
    ("prefill_tokens", "stormguard_engine_prefill_tokens_total"),
    ("cache_queries", "vllm:prefix_cache_queries_total"),
    ("cache_hits", "vllm:prefix_cache_hits_total"),
    ("output_tokens", "stormguard_engine_output_tokens_total"),
    ("gone_client_tokens", "stormguard_gone_client_tokens_total"),
    ("aborted", "stormguard_engine_requests_aborted_total"),
)


@dataclass
class CallRecord:
    """One call: when it started, how long it took, and how it ended."""

    start_s: float
    latency_s: float
    ttft_s: float | None
    ok: bool
    error: str | None


@dataclass
class ReplicasRun:
    part: Part
    client: ReplicasClientName
    calls: list[CallRecord]
    # Per replica, each of ``COUNTERS`` over the run.
    replicas: list[dict[str, float]]
    client_stats: dict[str, Any] = field(default_factory=dict)
    fault_errors: list[str] = field(default_factory=list)
