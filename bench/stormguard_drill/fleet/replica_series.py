"""Each fleet replica over time, from the metrics sampled at it: its state (dead,
restarting, slow, healthy) as segments, a counter's rate in 1 s bins, a counter's
last value.

The samples (``fleet/records.py``: ``Samples``) span every process a replica had, its counters
made continuous across restarts; a dead replica goes unsampled, which shows as a gap.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

from stormguard_drill.figures import BIN_S, counter_at
from stormguard_drill.fleet.config import FleetConfig
from stormguard_drill.fleet.records import FleetRun, Samples

ATTEMPTS = "stormguard_attempts_total"
_READY = "stormguard_engine_ready"


def down_intervals(samples: Samples) -> list[tuple[float, float]]:
    """Where the replica's engine said it was not ready (restarting, warming)."""
    out: list[tuple[float, float]] = []
    start: float | None = None
    for t, values in samples:
        if _READY not in values:
            continue
        if values[_READY] < 1.0 and start is None:
            start = t
        elif values[_READY] >= 1.0 and start is not None:
            out.append((start, t))
            start = None
    if start is not None and samples:
        out.append((start, samples[-1][0]))
    return out


def replica_states(run: FleetRun, config: FleetConfig, end_s: float) -> list[list[list[Any]]]:
    """Per replica, [start, end, state] segments over [0, end_s): ``dead`` (killed until
    its new process was ready), ``restarting`` (its engine not ready), ``slow``
    (latency added), ``healthy``; the first of these that holds."""
    log = run.faults
    states = []
    for index, samples in enumerate(run.replica_samples):
        marks: list[tuple[float, float, str]] = []
        dead = config.timeline.fault("dead")
        if dead is not None and dead.replica == index and log.killed_s is not None:
            marks.append((log.killed_s, log.restarted_s or end_s, "dead"))
        marks += [(a, b, "restarting") for a, b in down_intervals(samples)]
        slow = config.timeline.fault("slow")
        if slow is not None and slow.replica == index and log.slow_set_s is not None:
            marks.append((log.slow_set_s, log.slow_cleared_s or end_s, "slow"))
        states.append(_segments(marks, end_s))
    return states


_PRIORITY = {"dead": 0, "restarting": 1, "slow": 2}


def _segments(marks: list[tuple[float, float, str]], end_s: float) -> list[list[Any]]:
    """Cut [0, end_s) at every mark's ends; each piece takes the first state (by
    _PRIORITY) of the marks covering it, else ``healthy``; equal neighbours merged."""
    cuts = sorted({0.0, end_s, *(x for a, b, _ in marks for x in (a, b) if 0 <= x <= end_s)})
    out: list[list[Any]] = []
    for a, b in itertools.pairwise(cuts):
        covering = [s for lo, hi, s in marks if lo <= a and b <= hi]
        state = min(covering, key=_PRIORITY.__getitem__) if covering else "healthy"
        if out and out[-1][2] == state:
            out[-1][1] = round(b, 3)
        else:
            out.append([round(a, 3), round(b, 3), state])
    return out


def binned_rates(
    samples: Samples, name: str, end_s: float, max_gap_s: float = 1.0
) -> list[list[float | None]]:
    """Per 1 s bin over [0, end_s): [mid-bin time, the counter's increase per second];
    None where the replica went unsampled for over ``max_gap_s`` (its process dead):
    a gap in the plot, not a rate made up across it."""
    times = [t for t, _ in samples]
    gaps = [(a, b) for a, b in itertools.pairwise(times) if b - a > max_gap_s]
    out: list[list[float | None]] = []
    for i in range(max(1, math.ceil(end_s / BIN_S))):
        a, b = i * BIN_S, (i + 1) * BIN_S
        mid = (i + 0.5) * BIN_S
        if (
            not times
            or b <= times[0]
            or a >= times[-1]
            or any(g0 < b and g1 > a for g0, g1 in gaps)
        ):
            out.append([mid, None])
            continue
        rise = counter_at(samples, name, b) - counter_at(samples, name, a)
        out.append([mid, round(max(0.0, rise) / BIN_S, 3)])
    return out


def final_value(samples: Samples, name: str) -> float:
    """The metric's last sampled value (0 when never sampled)."""
    return samples[-1][1].get(name, 0.0) if samples else 0.0
