"""What one outage pairing measured: each call (``CallRecord``) and both providers'
attempt counts over time (``OutageRun``). Records only: the figures (``outage/summary.py``)
import this, never the runner that filled it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stormguard_drill.outage.clients import (
    OutageClientName,
)


@dataclass
class CallRecord:
    """One call: when it started, how long it took, and how it ended."""

    start_s: float
    latency_s: float
    ttft_s: float | None
    ok: bool
    provider: str | None
    error: str | None


@dataclass
class OutageRun:
    client: OutageClientName
    calls: list[CallRecord]
    primary: list[tuple[float, dict[str, float]]]
    secondary: list[tuple[float, dict[str, float]]]
    client_stats: dict[str, Any]
    fault_errors: list[str]
