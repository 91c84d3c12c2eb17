"""The figures every scenario computes alike, from its results and metric samples:
a percentile, successes per 1 s bin and the recovery they show, a counter's value
between samples, a figure rounded for the JSON. Definitions: docs/benchmarks.md."""

from __future__ import annotations

import math
from collections.abc import Sequence

from stormguard_drill.records import LogicalResult

RECOVERY_RATE = 0.95
RECOVERY_HOLD_BINS = 5
BIN_S = 1.0


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def success_bins(results: Sequence[LogicalResult], until: float) -> list[tuple[int, int]]:
    """(successes, endings) of logical requests per 1 s bin, by when they ended."""
    bins = [(0, 0)] * max(1, math.ceil(until / BIN_S))
    for r in results:
        i = int(r.end_s // BIN_S)
        if 0 <= i < len(bins):
            ok, n = bins[i]
            bins[i] = (ok + int(r.ok), n + 1)
    return bins


def recovered_after(results: Sequence[LogicalResult], since: float, until: float) -> float | None:
    """Seconds from ``since`` until the success rate of the logical requests ending in
    each 1 s bin is >= 95% for 5 bins in a row, bins up to ``until`` (None: never)."""
    bins = success_bins(results, until)
    first_bin = int(since // BIN_S)
    good = [n > 0 and ok / n >= RECOVERY_RATE for ok, n in bins]
    for i in range(first_bin, len(bins) - RECOVERY_HOLD_BINS + 1):
        if all(good[i : i + RECOVERY_HOLD_BINS]):
            return max(0.0, i * BIN_S - since)
    return None


def counter_at(samples: list[tuple[float, dict[str, float]]], name: str, t: float) -> float:
    """A counter's value at ``t``, linearly interpolated between samples."""
    before = [(ts, v.get(name, 0.0)) for ts, v in samples if ts <= t]
    after = [(ts, v.get(name, 0.0)) for ts, v in samples if ts > t]
    if not before:
        return 0.0
    if not after:
        return before[-1][1]
    (t0, v0), (t1, v1) = before[-1], after[0]
    return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def round_or_none(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
