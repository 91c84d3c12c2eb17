"""What the fleet's client processes recorded, read per replica: their attempts (where
each went, and when) and stormguard's ejections.

The attempts are ``FleetRun.attempts``: by arrival index, (seconds from the pairing's
start, "host:port") of each attempt the clients sent, refused connections included
(``attempt_log``). Definitions of the figures: ``fleet/summary.py``.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from stormguard_drill.figures import BIN_S
from stormguard_drill.fleet.records import FleetRun
from stormguard_drill.records import LogicalResult

REJOIN_SHARE = 0.5  # of the fair share: the dead replica has rejoined the fleet


def sick_share(
    results: Sequence[LogicalResult],
    attempts: dict[int, list[tuple[float, str]]],
    address: str,
    since: float,
    until: float,
) -> tuple[int, int]:
    """(calls started in [since, until), those of them with an attempt to ``address``
    before ``until``)."""
    calls = [r for r in results if since <= r.start_s < until]
    touched = sum(
        1
        for r in calls
        if any(where == address and t < until for t, where in attempts.get(r.index, ()))
    )
    return len(calls), touched


def attempts_by_replica(
    attempts: dict[int, list[tuple[float, str]]], addresses: Sequence[str]
) -> Counter[str]:
    """The clients' recorded attempts per replica address (others under "other")."""
    known = set(addresses)
    return Counter(
        where if where in known else "other" for record in attempts.values() for _, where in record
    )


def rejoin_s(
    attempts: dict[int, list[tuple[float, str]]],
    addresses: Sequence[str],
    replica: int,
    back_s: float,
    until: float,
) -> float | None:
    """Seconds from ``back_s`` to the start of the first 1 s bin in which ``replica`` got
    at least REJOIN_SHARE of its fair share of the recorded attempts (None: never
    before ``until``)."""
    bins = max(0, math.ceil((until - back_s) / BIN_S))
    mine, total = [0] * bins, [0] * bins
    for record in attempts.values():
        for t, where in record:
            i = int((t - back_s) // BIN_S)
            if 0 <= i < bins:
                total[i] += 1
                mine[i] += where == addresses[replica]
    fair = REJOIN_SHARE / len(addresses)
    for i in range(bins):
        if total[i] and mine[i] / total[i] >= fair:
            return i * BIN_S
    return None


def attempts_within(
    attempts: dict[int, list[tuple[float, str]]],
    address: str,
    intervals: Sequence[tuple[float, float]],
) -> int:
    """The recorded attempts to ``address`` inside any of ``intervals``."""
    return sum(
        1
        for record in attempts.values()
        for t, where in record
        if where == address and any(a <= t < b for a, b in intervals)
    )


def client_series(
    attempts: dict[int, list[tuple[float, str]]], addresses: Sequence[str], end_s: float
) -> dict[str, list[list[float]]]:
    """Per replica index: [mid-bin time, recorded attempts per second] of each 1 s bin
    over [0, end_s)."""
    bins = max(1, math.ceil(end_s / BIN_S))
    counts = {address: [0] * bins for address in addresses}
    for record in attempts.values():
        for t, where in record:
            i = int(t // BIN_S)
            if where in counts and 0 <= i < bins:
                counts[where][i] += 1
    return {
        str(r): [[(i + 0.5) * BIN_S, n / BIN_S] for i, n in enumerate(counts[address])]
        for r, address in enumerate(addresses)
    }


def ejections_of(run: FleetRun, address: str) -> Counter[str]:
    """The times the client processes took ``address`` out of rotation, by reason (a
    failed connect check that keeps it out is not counted again)."""
    return Counter(
        why
        for _, (_, where, was, to, why) in run.ejections
        if where == address and to == "ejected" and was != "ejected"
    )


def ejected_after(run: FleetRun, address: str, since: float) -> list[float | None]:
    """Per client process: seconds from ``since`` to its first ejection of ``address``
    (None: it never took it out); empty for a client without ejections."""
    if not run.ejections:
        return []
    first: dict[int, float] = {}
    for process, (t, where, _, to, _) in run.ejections:
        if where == address and to == "ejected" and t >= since:
            first[process] = min(first.get(process, t), t)
    return [
        round(first[k] - since, 3) if k in first else None
        for k in sorted(int(str(p["process"])) for p in run.processes)
    ]
