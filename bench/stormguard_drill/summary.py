"""The figures of one pairing, computed from its results and metric samples.

Definitions (docs/benchmarks.md repeats them):

- retry amplification = attempts / logical requests (the incident write-up's measure),
  at the server from ``stormguard_attempts_total`` and at the client from its own count;
- goodput = completion tokens of successful logical requests per second; a call's
  tokens are spread evenly from its first chunk to its end, so a window counts the
  tokens that were streamed inside it;
- incident retry amplification = the same ratio over the incident window only (the
  burst plus ``INCIDENT_TAIL_S``): the whole-run figure dilutes a storm with calm;
- burst demand = completion tokens/s asked for by the requests arriving in the burst
  (counted on those that succeeded: where all succeed, the demand itself), the most
  goodput the burst could show;
- recovery = from the end of the burst until the success rate of logical requests
  ending in each 1 s bin is >= 95% for 5 bins in a row (a bin where nothing ends is
  not a success); ``None`` when that never happens before the load stops.

The burst and the rebound (a ``BacklogWorkload``) have figures of their own instead of
the avalanche's burst-window ones:

- drain = seconds from the pairing's start (the first arrival) until the last logical
  request ended, successful or not; goodput = the successes' completion tokens / drain,
  and ``/cap`` that over the calibrated capacity;
- ideal drain = the successes' completion tokens at the calibrated capacity: the
  shortest drain the engine allows (p99 / ideal drain shows how far the slowest calls
  are from it; p99 / drain, the target's ratio, is at most 1 when every call arrives at
  t = 0);
- the rebound: ``back_s``, when the engine was ready again after the drill's crash (the
  first sample of ``stormguard_engine_ready`` = 1 after a 0: an engine that is back for
  less than a sampling period, 0.25 s, before the next OOM is not seen back until
  later), goodput from then to the drain, and ``extra_crashes`` = crashes beyond the
  drill's own (any OOM of what came back; ``stormguard_engine_crashes_total`` counts
  both);
- targets: each one's bound, the measured value and whether it was met; ``missed``
  lists the names of those that were not.

Every scenario also reports ``client_cpu_s``, the CPU seconds of the drill's process
while the pairing ran: what the client cost on a machine whose two cores it shares
with the server (with ``--concurrency`` > 1 it mixes the pairings running at once).

A figure the engine does not export (on vLLM: OOMs, restarts, loops, gone-client
tokens, server-side attempts) is ``None``, not 0: 0 would claim it was measured.
Where the server counts no attempts, amplification over the incident window and
attempts/s come from the client's own count, and ``attempts_source`` says so.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Any

from stormguard_drill.clients.stormguard_figures import CLIENT_LIMIT
from stormguard_drill.config import AnyWorkload, BacklogWorkload, Targets, Workload
from stormguard_drill.figures import (
    BIN_S,
    counter_at,
    percentile,
    recovered_after,
    round_or_none,
    success_bins,
)
from stormguard_drill.records import LogicalResult, PairingRun
from stormguard_drill.sampler import CLIENT_ATTEMPTS, SIM_ONLY_SERIES
from stormguard_drill.vllm import ADMITTED, WARMUP_REQUESTS

_SERVER_ATTEMPTS = "stormguard_attempts_total"

INCIDENT_TAIL_S = 10.0


def streamed_tokens(results: Sequence[LogicalResult], start: float, end: float) -> float:
    """Completion tokens of successful requests streamed inside [start, end)."""
    total = 0.0
    for r in results:
        if not r.ok or r.completion_tokens == 0:
            continue
        first = r.first_token_s if r.first_token_s is not None else r.end_s
        span = r.end_s - first
        if span <= 0:
            total += r.completion_tokens if start <= r.end_s < end else 0
            continue
        overlap = max(0.0, min(end, r.end_s) - max(start, first))
        total += r.completion_tokens * overlap / span
    return total


def recovery_s(results: Sequence[LogicalResult], workload: Workload) -> float | None:
    """Seconds from the end of the burst until success >= 95% for 5 s (see module doc)."""
    return recovered_after(results, workload.burst_end_s, workload.duration_s)


def exported(run: PairingRun, name: str) -> bool:
    """Whether the pairing's server exports series ``name`` at all."""
    return run.engine == "sim" or name not in SIM_ONLY_SERIES


def _attempts_series(run: PairingRun) -> str:
    """The server's attempt counter, or the client's own where the server has none."""
    return _SERVER_ATTEMPTS if exported(run, _SERVER_ATTEMPTS) else CLIENT_ATTEMPTS


_READY = "stormguard_engine_ready"


def _count(run: PairingRun, name: str) -> int | None:
    """A counter's final value; None where the engine does not export it."""
    return int(run.final_metrics.get(name, 0.0)) if exported(run, name) else None


def incident_amplification(run: PairingRun, workload: Workload) -> float | None:
    """Attempts / logical requests arriving, over the burst + INCIDENT_TAIL_S (attempts at
    the server, or at the client where the server counts none)."""
    start, end = workload.burst_start_s, workload.burst_end_s + INCIDENT_TAIL_S
    name = _attempts_series(run)
    attempts = counter_at(run.samples, name, end) - counter_at(run.samples, name, start)
    arrivals = sum(1 for r in run.results if start <= r.start_s < end)
    return attempts / arrivals if arrivals else None


def counter_rates(
    samples: list[tuple[float, dict[str, float]]], name: str
) -> list[tuple[float, float]]:
    """Per-second rate of a counter between consecutive samples."""
    out = []
    for (t0, a), (t1, b) in itertools.pairwise(samples):
        if t1 > t0:
            out.append((t1, max(0.0, b.get(name, 0.0) - a.get(name, 0.0)) / (t1 - t0)))
    return out


def timeseries(run: PairingRun) -> dict[str, list[list[float]]]:
    """The plotted series: [[t, value], ...] each."""
    samples = run.samples
    successes = success_bins(run.results, max((r.end_s for r in run.results), default=1.0))
    restarts = "stormguard_engine_restarts_total"
    restart_series = [[t, v.get(restarts, 0.0)] for t, v in samples]
    return {
        "attempts_per_s": [[t, v] for t, v in counter_rates(samples, _attempts_series(run))],
        "successes_per_s": [[(i + 0.5) * BIN_S, ok / BIN_S] for i, (ok, _) in enumerate(successes)],
        "queue_depth": [[t, v.get("stormguard_queue_depth", 0.0)] for t, v in samples],
        "kv_cache_usage": [[t, v.get("stormguard_kv_cache_usage_ratio", 0.0)] for t, v in samples],
        "restarts": restart_series if exported(run, restarts) else [],
        # The client's own concurrency limit (stormguard's clients only).
        "client_limit": [[t, v[CLIENT_LIMIT]] for t, v in samples if CLIENT_LIMIT in v],
    }


def summarize(
    run: PairingRun, workload: AnyWorkload, capacity_tps: float, targets: Targets | None = None
) -> dict[str, Any]:
    """Every figure of one pairing (the JSON entry; the table shows a subset)."""
    if isinstance(workload, BacklogWorkload):
        return _summarize_backlog(run, workload, capacity_tps, targets or Targets())
    return _summarize_avalanche(run, workload, capacity_tps)


def _attempts(run: PairingRun) -> tuple[int | None, int | None]:
    """(server's attempts or None, the best count there is: the server's, else the
    client's, None where neither counts)."""
    server_attempts = _count(run, _SERVER_ATTEMPTS)
    return server_attempts, server_attempts if server_attempts is not None else run.client_attempts


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def _common(run: PairingRun) -> dict[str, Any]:
    """The figures every scenario has."""
    results = run.results
    logical = len(results)
    ok = [r for r in results if r.ok]
    final = run.final_metrics
    server_attempts, attempts = _attempts(run)
    by_attempt = {
        key.split("attempt=")[1].rstrip("}"): value
        for key, value in final.items()
        if key.startswith("stormguard_attempts_total{")
    }
    return {
        "client": run.client,
        "admission": run.admission,
        "logical_requests": logical,
        "client_attempts": run.client_attempts,
        "server_attempts": server_attempts,
        "attempts": attempts,
        "attempts_source": "server" if server_attempts is not None else "client",
        "admitted_requests": int(final[ADMITTED]) - WARMUP_REQUESTS if ADMITTED in final else None,
        "server_attempts_by_number": by_attempt if server_attempts is not None else None,
        "retry_amplification_server": round_or_none(_ratio(server_attempts, logical)),
        "retry_amplification_client": round_or_none(_ratio(run.client_attempts, logical)),
        "app_calls": sum(r.app_calls for r in results),
        "success_rate": round_or_none(len(ok) / logical if logical else None, 4),
        "latency_p50_s": round_or_none(percentile([r.latency_s for r in ok], 50)),
        "latency_p99_s": round_or_none(percentile([r.latency_s for r in ok], 99)),
        "ttft_p50_s": round_or_none(percentile([r.ttft_s for r in ok if r.ttft_s is not None], 50)),
        "ttft_p99_s": round_or_none(percentile([r.ttft_s for r in ok if r.ttft_s is not None], 99)),
        "oom_count": _count(run, "stormguard_engine_oom_total"),
        "restart_count": _count(run, "stormguard_engine_restarts_total"),
        "crash_count": _count(run, "stormguard_engine_crashes_total"),
        "oom_restart_loop_count": _count(run, "stormguard_engine_oom_restart_loops_total"),
        "gone_client_tokens": _count(run, "stormguard_gone_client_tokens_total"),
        "engine_output_tokens": _count(run, "stormguard_engine_output_tokens_total"),
        "max_in_flight": run.max_in_flight,
        "client_cpu_s": run.client_cpu_s,
        "errors": dict(Counter(r.error or "?" for r in results if not r.ok).most_common()),
        "client_stats": run.client_stats,
        "timeseries": timeseries(run),
    }


def back_at(samples: list[tuple[float, dict[str, float]]], after: float) -> float | None:
    """When the engine was ready again after ``after``: the first sample reading ready
    that follows one reading not ready (None: it never went down, or never came back)."""
    down = False
    for t, values in samples:
        if t < after or _READY not in values:
            continue
        if values[_READY] < 1.0:
            down = True
        elif down:
            return t
    return None


def _summarize_backlog(
    run: PairingRun, workload: BacklogWorkload, capacity_tps: float, targets: Targets
) -> dict[str, Any]:
    results = run.results
    common = _common(run)
    ok = [r for r in results if r.ok]
    tokens = sum(r.completion_tokens for r in ok)
    drain = max((r.end_s for r in results), default=0.0)
    goodput = tokens / drain if drain > 0 else None
    ideal = tokens / capacity_tps if capacity_tps else None
    p99 = common["latency_p99_s"]
    crash_sent = run.events.get("crash_sent_s")
    crashes = common["crash_count"]
    extra_crashes = None
    if crashes is not None:
        extra_crashes = max(0, crashes - (1 if crash_sent is not None else 0))
    back = None if crash_sent is None else back_at(run.samples, crash_sent)
    after_restart = None
    if back is not None and drain > back:
        after_restart = streamed_tokens(results, back, drain) / (drain - back)
    figures: dict[str, Any] = {
        **common,
        "drain_s": round_or_none(drain),
        "goodput_tps": round_or_none(goodput, 1),
        "goodput_ratio": round_or_none(_ratio(goodput, capacity_tps)),
        "ideal_drain_s": round_or_none(ideal),
        "p99_over_drain": round_or_none(_ratio(p99, drain)),
        "p99_over_ideal_drain": round_or_none(_ratio(p99, ideal)),
        "crash_sent_s": crash_sent,
        "back_s": round_or_none(back, 2),
        "goodput_after_restart_tps": round_or_none(after_restart, 1),
        "goodput_after_restart_ratio": round_or_none(_ratio(after_restart, capacity_tps)),
        "extra_crashes": extra_crashes,
    }
    checks = check_targets(figures, targets)
    return {**figures, "targets": checks, "missed": [k for k, c in checks.items() if not c["met"]]}


def check_targets(figures: dict[str, Any], targets: Targets) -> dict[str, dict[str, Any]]:
    """Each target of the scenario: its bound, the measured figure, and whether it was
    met (a figure that could not be measured does not meet its target)."""
    bounds: list[tuple[str, str, float | int | None, bool]] = [
        # (target name, figure, bound, True: the figure must be at least the bound)
        ("success", "success_rate", targets.min_success, True),
        ("attempts/call", "retry_amplification_server", targets.max_attempts_per_call, False),
        ("goodput/cap", "goodput_ratio", targets.min_goodput_ratio, True),
        ("p99/drain", "p99_over_drain", targets.max_p99_over_drain, False),
        ("no 2nd crash", "extra_crashes", targets.max_extra_crashes, False),
    ]
    checks: dict[str, dict[str, Any]] = {}
    for name, key, bound, at_least in bounds:
        if bound is None:
            continue
        value = figures.get(key)
        if key == "retry_amplification_server" and value is None:
            value = figures.get("retry_amplification_client")  # vLLM: the client's count
        met = value is not None and (value >= bound if at_least else value <= bound)
        checks[name] = {"figure": key, "bound": bound, "measured": value, "met": met}
    return checks


def _summarize_avalanche(
    run: PairingRun, workload: Workload, capacity_tps: float
) -> dict[str, Any]:
    results = run.results
    ok = [r for r in results if r.ok]
    load_window = workload.duration_s
    burst_window = workload.burst_end_s - workload.burst_start_s
    goodput = streamed_tokens(results, 0.0, load_window) / load_window
    burst_goodput = (
        streamed_tokens(results, workload.burst_start_s, workload.burst_end_s) / burst_window
    )
    in_burst = [r for r in ok if workload.burst_start_s <= r.start_s < workload.burst_end_s]
    burst_demand = sum(r.completion_tokens for r in in_burst) / burst_window
    long_results = [r for r in results if r.kind == "long"]
    return {
        **_common(run),
        "incident_retry_amplification_server": round_or_none(incident_amplification(run, workload)),
        "long_success_rate": round_or_none(
            sum(r.ok for r in long_results) / len(long_results) if long_results else None, 4
        ),
        "goodput_tps": round_or_none(goodput, 1),
        "goodput_ratio": round_or_none(goodput / capacity_tps if capacity_tps else None),
        "burst_goodput_tps": round_or_none(burst_goodput, 1),
        "burst_goodput_ratio": round_or_none(
            burst_goodput / capacity_tps if capacity_tps else None
        ),
        "burst_demand_tps": round_or_none(burst_demand, 1),
        "recovery_s": round_or_none(recovery_s(results, workload), 2),
    }
