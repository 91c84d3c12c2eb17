"""What one pairing of the quota scenario measured (``QuotaRun``), and how a call the
batch never started ends (``NOT_STARTED``). Records only: the figures (``quota/summary.py``)
import this, never the runner that filled it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from stormguard_drill.quota.client_names import QuotaClientName
from stormguard_drill.quota.config import QuotaVariant
from stormguard_drill.records import LogicalResult

NOT_STARTED = "not started"  # the error of a call the batch gave up on before starting it


@dataclass
class QuotaRun:
    """Everything measured in one pairing of the quota scenario."""

    client: QuotaClientName
    variant: QuotaVariant
    results: list[LogicalResult]  # every process's, by call index
    server: dict[str, Any]  # server_counts() at the end
    samples: list[tuple[float, dict[str, float]]]
    started_at_unix: float  # the wall clock at t0 (LiteLLM's usage windows are its minutes)
    processes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def client_attempts(self) -> int | None:
        counts = [p["client_attempts"] for p in self.processes]
        return None if any(c is None for c in counts) else sum(counts)
