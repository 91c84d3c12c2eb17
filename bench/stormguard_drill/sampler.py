"""Polls a server's /metrics a few times a second: the gauges and counters over time.

Parsed with prometheus-client's own text parser. A scrape that fails (the server is
busy) is skipped, not fatal: the plots show a gap rather than the drill stopping.

Each engine has its parser (``Parse``): the sim server exports the drill's
``stormguard_*`` series itself; for vLLM, ``vllm.py`` maps vLLM's own gauges and
the admission layer's load headers onto the same names. Every sample also holds
the client's own attempt count (``CLIENT_ATTEMPTS``), which is the only attempt
count there is where the server exports none (a client that counts none, LiteLLM,
leaves it out), and the client's own gauges (stormguard: its concurrency limit).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

# Series the drill reads: gauges as they are, counters summed over their labels.
SERIES = (
    "stormguard_attempts_total",
    "stormguard_queue_depth",
    "stormguard_kv_cache_usage_ratio",
    "stormguard_running_requests",
    "stormguard_engine_ready",
    "stormguard_engine_oom_total",
    "stormguard_engine_restarts_total",
    "stormguard_engine_crashes_total",
    "stormguard_engine_oom_restart_loops_total",
    "stormguard_gone_client_tokens_total",
    "stormguard_engine_output_tokens_total",
    "stormguard_output_tokens_total",
)
# What only the sim engine exports: a vLLM server has no OOM fault, no restarts of its
# own and no count of tokens for gone callers; the admission middleware exports no
# Prometheus metrics. Reported as not available (None) on other engines, never 0.
SIM_ONLY_SERIES = frozenset(
    {
        "stormguard_attempts_total",
        "stormguard_engine_ready",
        "stormguard_engine_oom_total",
        "stormguard_engine_restarts_total",
        "stormguard_engine_crashes_total",
        "stormguard_engine_oom_restart_loops_total",
        "stormguard_gone_client_tokens_total",
        "stormguard_output_tokens_total",
    }
)
# The client's attempts sent so far (the drill's own count, not the server's).
CLIENT_ATTEMPTS = "drill_client_attempts_total"

Parse = Callable[[httpx.Response], dict[str, float]]


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name -> value, summed over labels (``stormguard_attempts_total`` = all
    attempt numbers); plus ``attempt=N`` entries for the attempt counter."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
            if sample.name == "stormguard_attempts_total":
                key = f"stormguard_attempts_total{{attempt={sample.labels.get('attempt')}}}"
                values[key] = sample.value
    return values


def parse_sim(response: httpx.Response) -> dict[str, float]:
    """The sim server's /metrics: the drill's series by their own names."""
    return parse_metrics(response.text)


@dataclass
class MetricsSampler:
    """Background poller of one server; ``samples`` is [(t, values)]."""

    root: str
    t0: float
    hz: float
    parse: Parse = parse_sim
    client_attempts: Callable[[], int | None] | None = None
    client_gauges: Callable[[], dict[str, float]] | None = None
    samples: list[tuple[float, dict[str, float]]] = field(default_factory=list)

    async def scrape(self, http: httpx.AsyncClient) -> dict[str, float] | None:
        # The client's count is read when the scrape starts, the time a sample is filed
        # under: a busy vLLM can take seconds to answer /metrics, and a count read after
        # the answer would put attempts seconds too early.
        attempts = None if self.client_attempts is None else self.client_attempts()
        client = {} if self.client_gauges is None else self.client_gauges()
        with contextlib.suppress(httpx.HTTPError):
            response = await http.get(f"{self.root}/metrics")
            if response.status_code == 200:
                values = self.parse(response)
                if attempts is not None:
                    values[CLIENT_ATTEMPTS] = float(attempts)
                values.update(client)
                return values
        return None

    async def run(self) -> None:
        """Scrape until cancelled."""
        period = 1.0 / self.hz
        async with httpx.AsyncClient(timeout=2.0) as http:
            while True:
                started = time.monotonic()
                values = await self.scrape(http)
                if values is not None:
                    self.samples.append((started - self.t0, values))
                await asyncio.sleep(max(0.0, period - (time.monotonic() - started)))

    async def final(self) -> dict[str, float]:
        """One last scrape, retried briefly: the counters at the end of the pairing.

        Kept as the last sample too (call it once ``run`` is stopped): a counter read
        at a time after the last periodic sample, such as the end of the incident
        window, would otherwise miss what happened after it (periodic scrapes can be
        seconds apart on a busy machine)."""
        async with httpx.AsyncClient(timeout=5.0) as http:
            for _ in range(5):
                started = time.monotonic()
                values = await self.scrape(http)
                if values is not None:
                    self.samples.append((started - self.t0, values))
                    return values
                await asyncio.sleep(0.2)
        return self.samples[-1][1] if self.samples else {}
