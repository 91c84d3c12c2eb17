"""The outage's figures: per window, success within the deadline, latency and time to
first token, the secondary's share and the attempts per call at each provider; when
traffic is back on the primary, its peak over the calls offered; the targets checked
on stormguard's row."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from stormguard_drill.outage.config import (
    WINDOWS,
    OutageConfig,
    Window,
)
from stormguard_drill.outage.records import CallRecord, OutageRun

ATTEMPTS = "stormguard_attempts_total"
# The bin of the return to the primary: its share is judged per bin of call starts.
_BACK_BIN_S = 5.0
# The stretch over which the primary's attempts are compared with the calls offered.
_PEAK_SPAN_S = 2.0
_PEAK_MIN_CALLS = 5


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
