"""``stormguard-drill --scenario outage``: a provider in partial outage, then recovering.

The second incident: a hosted LLM service in partial outage ("service busy, switch to
another LLM API for now"): calls timed out or got 5xx, the ones that succeeded waited
ten times longer for their first token, and recovery was gradual. Each client under
test has a primary and a secondary provider, two reference servers of its own:

- **healthy** (``healthy_s``): the primary answers its first token after
  ``primary_latency_s``; the secondary, healthy throughout, after the longer
  ``secondary_latency_s``;
- **outage** (``outage_s``, 60 s in the full run): on the primary a share of requests
  fail with a 500 (``error_rate``), a share hang without an answer (``hang_rate``, the
  server's hang fault), and the rest wait ten times longer for their first token;
- **recovery** (``recovery_s``, 30 s): the three faults fall linearly to nothing, one
  step a second;
- **after** (``after_s``): the primary healthy again; how soon calls are back on it.

Open-loop Poisson arrivals at ``rate`` calls per second, the same seeded schedule for
every client; each call is streamed and has ``deadline_s``, after which the caller
gives up on it. The pairings run one at a time in the full run and all at once in the
quick one (``concurrency``), each on its own two servers. Per window: success within
the deadline, p50/p99 latency and time to first token, the share of calls served by
the secondary, and the attempts per call at each provider (the servers' own counts,
scraped twice a second); then how long after the recovery traffic is back on the
primary (``back_on_primary_s``), and the primary's attempts over the calls offered at
their peak after the outage (a burst shows above 1). The targets are checked on stormguard's row.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx

from stormguard_drill.clients.litellm_client import import_litellm
from stormguard_drill.config import ENGINE_ARGS, Mode, PromptShape
from stormguard_drill.fleet.config import FleetWorkload
from stormguard_drill.outage.clients import (
    OUTAGE_CLIENT_TITLES,
    PRIMARY_MODEL,
    SECONDARY_MODEL,
    OutageCall,
    OutageClientName,
    make_outage_client,
)
from stormguard_drill.report import load_average, machine, source
from stormguard_drill.sampler import MetricsSampler
from stormguard_drill.servers import EngineSpec, ServerFleet, ServerProcess
from stormguard_drill.workload import Arrival, build_schedule

Window = Literal["healthy", "outage", "recovery", "after"]
WINDOWS: tuple[Window, ...] = ("healthy", "outage", "recovery", "after")
ATTEMPTS = "stormguard_attempts_total"
# The bin of the return to the primary: its share is judged per bin of call starts.
_BACK_BIN_S = 5.0
_SCRAPE_HZ = 2.0
# The stretch over which the primary's attempts are compared with the calls offered.
_PEAK_SPAN_S = 2.0
_PEAK_MIN_CALLS = 5


#: Short chat calls: 20-60 prompt tokens, 16 out.
OUTAGE_SHAPE = PromptShape(min_prompt_tokens=20, max_prompt_tokens=60, max_tokens=16)


@dataclass(frozen=True, slots=True)
class OutageTargets:
    """The task's targets, for stormguard's row."""

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
    """The full run (the task's 60 s outage and 30 s recovery), ``--quick`` (under
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


async def run_outage_pairing(
    fleet: ServerFleet, config: OutageConfig, name: OutageClientName, schedule: list[Arrival]
) -> OutageRun:
    """One client against a fresh primary and secondary, through every phase."""
    primary, secondary = await asyncio.gather(
        fleet.start(
            f"{name}-primary",
            "--model-alias",
            PRIMARY_MODEL,
            "--added-latency-ms",
            str(config.primary_latency_s * 1000.0),
            admin=True,
        ),
        fleet.start(
            f"{name}-secondary",
            "--model-alias",
            SECONDARY_MODEL,
            "--added-latency-ms",
            str(config.secondary_latency_s * 1000.0),
        ),
    )
    try:
        client = make_outage_client(
            name, primary.base_url, secondary.base_url, config.deadline_s, config.first_chunk_s
        )
        try:
            return await _replay(config, name, client, schedule, primary, secondary)
        finally:
            await client.aclose()
    finally:
        fleet.stop(primary)
        fleet.stop(secondary)


async def _replay(
    config: OutageConfig,
    name: OutageClientName,
    client: Any,
    schedule: list[Arrival],
    primary: ServerProcess,
    secondary: ServerProcess,
) -> OutageRun:
    t0 = time.monotonic()
    samplers = [MetricsSampler(s.root, t0, _SCRAPE_HZ) for s in (primary, secondary)]
    tasks = [asyncio.create_task(s.run()) for s in samplers]
    fault_errors: list[str] = []
    faults = asyncio.create_task(_drive_faults(config, primary, t0, fault_errors))
    records: list[CallRecord] = []

    async def one(arrival: Arrival) -> None:
        await asyncio.sleep(max(0.0, t0 + arrival.at_s - time.monotonic()))
        started = time.monotonic()
        outcome: OutageCall
        try:
            outcome = await asyncio.wait_for(client.call(arrival), config.deadline_s)
        except asyncio.TimeoutError:
            outcome = OutageCall(ok=False, error="deadline")
        ended = time.monotonic()
        ttft = None if outcome.first_token_at is None else outcome.first_token_at - started
        records.append(
            CallRecord(
                start_s=started - t0,
                latency_s=ended - started,
                ttft_s=ttft,
                ok=outcome.ok,
                provider=outcome.provider if outcome.ok else None,
                error=outcome.error,
            )
        )

    try:
        await asyncio.gather(*(one(a) for a in schedule))
    finally:
        faults.cancel()
        for task in tasks:
            task.cancel()
        for task in (faults, *tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task
    for sampler in samplers:
        await sampler.final()
    records.sort(key=lambda r: r.start_s)
    return OutageRun(
        name, records, samplers[0].samples, samplers[1].samples, client.stats(), fault_errors
    )


async def _drive_faults(
    config: OutageConfig, primary: ServerProcess, t0: float, errors: list[str]
) -> None:
    """Set the primary's faults at the outage's start and once a second of the recovery."""
    bounds = config.window_bounds()
    start = bounds["outage"][0]
    ramp = [bounds["recovery"][0] + i for i in range(math.ceil(config.recovery_s) + 1)]
    moments = [start, *ramp]
    async with httpx.AsyncClient(timeout=5.0) as http:
        for at in moments:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            body = config.faults_at(time.monotonic() - t0)
            try:
                response = await http.post(
                    primary.admin_url("/admin/faults"), json=body, headers=primary.admin_headers
                )
                response.raise_for_status()
            except httpx.HTTPError as exc:
                errors.append(f"{at:.1f}s: {type(exc).__name__}: {exc}")


# -- figures -------------------------------------------------------------------------


def _quantile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return round(ordered[index], 3)


def _counter_at(samples: list[tuple[float, dict[str, float]]], t: float) -> float:
    """The server's attempt count at ``t`` (the last sample at or before it)."""
    value = 0.0
    for at, values in samples:
        if at > t:
            break
        value = values.get(ATTEMPTS, value)
    return value


def peak_over_offered(
    samples: list[tuple[float, dict[str, float]]], calls: Sequence[CallRecord], start: float
) -> float | None:
    """The most attempts the primary got, after ``start``, over the calls that started in
    the same stretch (``_PEAK_SPAN_S`` or more between two scrapes, at least
    ``_PEAK_MIN_CALLS`` calls): above 1 by as much as the retries and the calls held
    back and released at once add; a burst beyond the offered load shows here."""
    points = [(t, v.get(ATTEMPTS, 0.0)) for t, v in samples if t >= start]
    peak: float | None = None
    for i, (t, v) in enumerate(points):
        for t2, v2 in points[i + 1 :]:
            if t2 - t >= _PEAK_SPAN_S:
                offered = sum(t <= r.start_s < t2 for r in calls)
                if offered >= _PEAK_MIN_CALLS:
                    ratio = (v2 - v) / offered
                    peak = ratio if peak is None else max(peak, ratio)
                break
    return None if peak is None else round(peak, 2)


def _window_figures(
    run: OutageRun, config: OutageConfig, window: Window, bounds: tuple[float, float]
) -> dict[str, Any]:
    start, end = bounds
    calls = [r for r in run.calls if start <= r.start_s < end]
    ok = [r for r in calls if r.ok and r.latency_s <= config.deadline_s]
    served = [r for r in ok if r.provider is not None]
    primary = _counter_at(run.primary, end) - _counter_at(run.primary, start)
    secondary = _counter_at(run.secondary, end) - _counter_at(run.secondary, start)
    n = len(calls)
    return {
        "calls": n,
        "success_rate": None if not n else round(len(ok) / n, 4),
        "latency_p50_s": _quantile([r.latency_s for r in ok], 0.5),
        "latency_p99_s": _quantile([r.latency_s for r in ok], 0.99),
        "ttft_p50_s": _quantile([r.ttft_s for r in ok if r.ttft_s is not None], 0.5),
        "ttft_p99_s": _quantile([r.ttft_s for r in ok if r.ttft_s is not None], 0.99),
        "secondary_share": None
        if not served
        else round(sum(r.provider == "secondary" for r in served) / len(served), 4),
        "attempts_per_call": None if not n else round((primary + secondary) / n, 3),
        "primary_attempts_per_call": None if not n else round(primary / n, 3),
        "secondary_attempts_per_call": None if not n else round(secondary / n, 3),
        "errors": _errors(calls),
    }


def _errors(calls: Sequence[CallRecord]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in calls:
        if not r.ok:
            key = r.error or "error"
            counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def back_on_primary_s(
    calls: Sequence[CallRecord], recovered_at: float, end: float, share: float
) -> float | None:
    """Seconds after ``recovered_at`` from which every bin of call starts (5 s) has at
    least ``share`` of its served calls on the primary; None if that never holds."""
    bins: list[tuple[float, float | None]] = []
    t = recovered_at
    while t < end:
        served = [r for r in calls if t <= r.start_s < t + _BACK_BIN_S and r.provider]
        on = None if not served else sum(r.provider == "primary" for r in served) / len(served)
        bins.append((t, on))
        t += _BACK_BIN_S
    back: float | None = None
    for start, on in bins:
        if on is not None and on < share:
            back = None
        elif back is None and on is not None:
            back = start
    return None if back is None else round(back - recovered_at, 1)


def summarize_outage(run: OutageRun, config: OutageConfig) -> dict[str, Any]:
    """One pairing's JSON entry; its flat keys are the table's columns."""
    bounds = config.window_bounds()
    windows = {w: _window_figures(run, config, w, bounds[w]) for w in WINDOWS}
    recovered_at = bounds["recovery"][1]
    n = len(run.calls)
    ok = [r for r in run.calls if r.ok and r.latency_s <= config.deadline_s]
    outage = windows["outage"]
    after_secondary = [
        r.provider == "secondary" for r in run.calls if r.start_s >= bounds["recovery"][0] and r.ok
    ]
    return {
        "client": run.client,
        "logical_requests": n,
        "success_rate": None if not n else round(len(ok) / n, 4),
        "outage_success_rate": outage["success_rate"],
        "outage_latency_p50_s": outage["latency_p50_s"],
        "outage_latency_p99_s": outage["latency_p99_s"],
        "outage_ttft_p50_s": outage["ttft_p50_s"],
        "outage_ttft_p99_s": outage["ttft_p99_s"],
        "outage_secondary_share": outage["secondary_share"],
        "outage_attempts_per_call": outage["attempts_per_call"],
        "outage_primary_attempts_per_call": outage["primary_attempts_per_call"],
        "outage_secondary_attempts_per_call": outage["secondary_attempts_per_call"],
        "after_secondary_share": None
        if not after_secondary
        else round(sum(after_secondary) / len(after_secondary), 4),
        "back_on_primary_s": back_on_primary_s(
            run.calls, recovered_at, config.duration_s, config.targets.min_primary_share_after
        ),
        "primary_peak_over_offered_after": peak_over_offered(
            run.primary, run.calls, bounds["recovery"][0]
        ),
        "windows": windows,
        "client_stats": run.client_stats,
        "fault_errors": run.fault_errors,
    }


def check_targets(pairings: Sequence[dict[str, Any]], config: OutageConfig) -> dict[str, Any]:
    """Each target on stormguard's row: ``{name: {"value": ..., "met": bool | None}}``
    (None: not measured, or the row compared with did not run)."""
    by = {p["client"]: p for p in pairings}
    ours = by.get("stormguard")
    if ours is None:
        return {}
    t = config.targets

    def at_most(value: Any, bound: float) -> dict[str, Any]:
        return {"value": value, "bound": bound, "met": None if value is None else value <= bound}

    def at_least(value: Any, bound: float) -> dict[str, Any]:
        return {"value": value, "bound": bound, "met": None if value is None else value >= bound}

    p99 = ours["outage_latency_p99_s"]
    checks = {
        "outage_success": at_least(ours["outage_success_rate"], t.min_outage_success),
        "outage_attempts_per_call": at_most(
            ours["outage_attempts_per_call"], t.max_outage_attempts_per_call
        ),
        "back_on_primary_s": at_most(ours["back_on_primary_s"], t.max_back_s),
        "primary_peak_over_offered": at_most(
            ours["primary_peak_over_offered_after"], t.max_primary_peak_over_offered
        ),
    }
    # Against a row with no p99 (it served no call in the outage), any p99 is better.
    router = by.get("litellm-router")
    if t.p99_vs_litellm_router and router is not None:
        bound = router["outage_latency_p99_s"]
        met = None if p99 is None else (bound is None or p99 <= bound)
        checks["p99_vs_litellm_router"] = {"value": p99, "bound": bound, "met": met}
    for name in ("openai", "openai+tenacity"):
        other = by.get(name)
        if t.p99_vs_openai and other is not None:
            bound = other["outage_latency_p99_s"]
            met = None if p99 is None else (bound is None or p99 < bound)
            checks[f"p99_vs_{name}"] = {"value": p99, "bound": bound, "met": met}
    return checks


def targets_line(checks: dict[str, Any]) -> str:
    """The targets and whether stormguard's row met each."""
    if not checks:
        return "stormguard did not run: no target checked"
    parts = []
    for name, check in checks.items():
        mark = {True: "met", False: "MISSED", None: "not measured"}[check["met"]]
        parts.append(f"{name} {check['value']} (bound {check['bound']}): {mark}")
    return "; ".join(parts)


async def outage_drill(
    config: OutageConfig,
    out: Path,
    clients: list[OutageClientName],
    skipped: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The whole outage drill; returns the JSON document."""
    schedule = outage_schedule(config)
    if "litellm-router" in clients:
        import_litellm()  # now: a first import inside a pairing would stall the others
    started = time.monotonic()
    host = machine()
    code = source()
    runs: list[OutageRun] = []
    async with ServerFleet(out / "logs", EngineSpec(args=_engine_args(config))) as fleet:
        gate = asyncio.Semaphore(max(1, config.concurrency))

        async def pairing(name: OutageClientName) -> OutageRun:
            async with gate:
                return await run_outage_pairing(fleet, config, name, schedule)

        runs = list(await asyncio.gather(*(pairing(name) for name in clients)))
    pairings = [summarize_outage(run, config) for run in runs]
    return {
        "scenario": config.scenario,
        "mode": config.mode,
        "seed": config.seed,
        "engine": "sim",
        "config": {k: v for k, v in asdict(config).items() if k not in {"targets", "shape"}},
        "windows": {w: list(b) for w, b in config.window_bounds().items()},
        "clients": {c: OUTAGE_CLIENT_TITLES[c] for c in clients},
        "targets": asdict(config.targets),
        "targets_checked": check_targets(pairings, config),
        "skipped": skipped or {},
        "logical_requests_per_pairing": len(schedule),
        "machine": {**host, "load_average_at_end": load_average()},
        "source": code,
        "wall_time_s": round(time.monotonic() - started, 1),
        "pairings": pairings,
    }


def _engine_args(config: OutageConfig) -> tuple[str, ...]:
    """The drill's sim engine, seeded; without admission's sheds in the way of the faults."""
    return (*ENGINE_ARGS, "--seed", str(config.seed), "--admission", "off")


__all__ = [
    "CallRecord",
    "OutageConfig",
    "OutageTargets",
    "back_on_primary_s",
    "check_targets",
    "outage_drill",
    "outage_preset",
    "outage_schedule",
    "summarize_outage",
    "targets_line",
]
