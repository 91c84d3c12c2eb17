"""The fleet's figures for one pairing, from its calls' records and the replicas' metrics.

Definitions (docs/benchmarks.md repeats them):

- attempts per call, **at the replicas**: ``stormguard_attempts_total`` summed over the
  replicas (over every process a replica had) / logical requests; a dead replica
  counts nothing, so this is the load on the live ones. Per replica: its own count /
  logical requests;
- attempts per call, **at the clients**: every attempt the client processes recorded
  (``attempt_log``), refused connections included, / logical requests;
- **sick share** of a fault: of the logical requests that started between one second
  after the fault began and the recovery, the share that sent at least one attempt to
  the sick replica before the recovery (the clients' own records);
- success, p50/p99 latency and TTFT: as in the other scenarios (success within the
  caller's patience, the app's second call included);
- **recovery**: from the recovery (faults cleared, the dead replica restarting) until
  the success rate of the logical requests ending in each 1 s bin is >= 95% for 5
  bins in a row (``summary.recovered_after``); 0 when it never dropped;
- **rejoin**: from the dead replica's new process being ready until the first 1 s bin
  in which it got at least half of its fair share (1 / replicas) of the attempts the
  clients sent;
- **ejections** (stormguard's only): per replica, the times a client process took it
  out of rotation, by reason; for the dead replica, how long after the kill each
  process took it out; for the looping one, the attempts the clients sent it while its
  engine said it was not ready (sampled at the replica, ``sample_hz``); every
  transition in ``ejection_log``;
- the attempts per replica over time: 1 s bins of its counter (at the replica), with
  a gap while it was dead; the clients' records in 1 s bins beside them.
- targets (``FleetTargets``): success, attempts per call at the replicas, the dead
  replica's sick share, and p99 against LiteLLM Router's in the same run
  (``compare_with_router``, once every pairing is summarized).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from stormguard_drill.app import LogicalResult
from stormguard_drill.fleet_config import FaultKind, FleetConfig, FleetTargets
from stormguard_drill.fleet_faults import Samples
from stormguard_drill.fleet_runner import FleetRun
from stormguard_drill.summary import (
    BIN_S,
    counter_at,
    percentile,
    recovered_after,
    round_or_none,
    success_bins,
)

ATTEMPTS = "stormguard_attempts_total"
_READY = "stormguard_engine_ready"
REJOIN_SHARE = 0.5  # of the fair share: the dead replica has rejoined the fleet
ROUTER = "litellm-router"


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


def _down_intervals(samples: Samples) -> list[tuple[float, float]]:
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
        marks += [(a, b, "restarting") for a, b in _down_intervals(samples)]
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


def _final(samples: Samples, name: str) -> float:
    return samples[-1][1].get(name, 0.0) if samples else 0.0


def _client_series(
    attempts: dict[int, list[tuple[float, str]]], addresses: Sequence[str], end_s: float
) -> dict[str, list[list[float]]]:
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


def summarize_fleet(run: FleetRun, config: FleetConfig) -> dict[str, Any]:
    """Every figure of one pairing (the JSON entry; the table shows a subset)."""
    results, log, timeline = run.results, run.faults, config.timeline
    logical = len(results)
    ok = [r for r in results if r.ok]
    end_s = max([config.workload.duration_s, *(r.end_s for r in results)])
    recover = log.recovered_s if log.recovered_s is not None else timeline.recover_at_s
    recorded = attempts_by_replica(run.attempts, run.addresses)
    client_attempts = sum(recorded.values())
    per_replica_server = [int(_final(s, ATTEMPTS)) for s in run.replica_samples]
    server_attempts = sum(per_replica_server)
    kinds: dict[int, FaultKind] = {f.replica: f.kind for f in timeline.faults}
    replicas = []
    for index, samples in enumerate(run.replica_samples):
        replicas.append(
            {
                "replica": index,
                "address": run.addresses[index],
                "fault": kinds.get(index),
                "server_attempts": per_replica_server[index],
                "server_attempts_per_call": round_or_none(
                    per_replica_server[index] / logical if logical else None
                ),
                "client_attempts": recorded.get(run.addresses[index], 0),
                "crashes": int(_final(samples, "stormguard_engine_crashes_total")),
                "restart_loops": int(_final(samples, "stormguard_engine_oom_restart_loops_total")),
                "ejections": dict(ejections_of(run, run.addresses[index]).most_common()),
            }
        )
    shares: dict[str, dict[str, Any]] = {}
    for fault in timeline.faults:
        address = run.addresses[fault.replica]
        since = fault.start_s + 1.0
        calls, touched = sick_share(results, run.attempts, address, since, recover)
        samples = run.replica_samples[fault.replica]
        served = counter_at(samples, ATTEMPTS, recover) - counter_at(samples, ATTEMPTS, since)
        shares[fault.kind] = {
            "replica": fault.replica,
            "from_s": since,
            "to_s": recover,
            "calls": calls,
            "touched": touched,
            "share": round_or_none(touched / calls if calls else None, 4),
            "server_attempts": round(served),
        }
    dead = timeline.fault("dead")
    dead_figures: dict[str, Any] | None = None
    rejoin = None
    if dead is not None:
        samples = run.replica_samples[dead.replica]
        killed, back = log.killed_s, log.restarted_s
        address = run.addresses[dead.replica]
        while_dead = sent_while_dead = answered_while_dead = None
        if killed is not None:
            until = log.restart_begun_s if log.restart_begun_s is not None else end_s
            while_dead = round(
                counter_at(samples, ATTEMPTS, until) - counter_at(samples, ATTEMPTS, killed)
            )
            sent_while_dead = sum(
                1
                for record in run.attempts.values()
                for t, where in record
                if where == address and killed <= t < until
            )
            # A successful call's last attempt is the one that answered.
            answered_while_dead = sum(
                1
                for r in ok
                if (last := run.attempts.get(r.index))
                and last[-1][1] == address
                and killed <= last[-1][0] < until
            )
        if back is not None:
            rejoin = rejoin_s(run.attempts, run.addresses, dead.replica, back, end_s)
        dead_figures = {
            "replica": dead.replica,
            "killed_s": killed,
            "back_s": back,
            "port_refused": log.dead_port_refused,
            "server_attempts_while_dead": while_dead,
            "client_attempts_while_dead": sent_while_dead,
            "answered_while_dead": answered_while_dead,
            "ejected_after_s": [] if killed is None else ejected_after(run, address, killed),
        }
    loop = timeline.fault("crash_loop")
    loop_figures = None
    if loop is not None:
        down = _down_intervals(run.replica_samples[loop.replica])
        loop_address = run.addresses[loop.replica]
        loop_figures = {
            "replica": loop.replica,
            "crashes_sent": len(log.crashes_sent_s),
            "crashes_sent_s": log.crashes_sent_s,
            "back_s": log.loop_back_s,
            "crashes_counted": replicas[loop.replica]["crashes"],
            "restart_loops": replicas[loop.replica]["restart_loops"],
            "down_s": round(sum(b - a for a, b in down), 2),
            "client_attempts_while_down": attempts_within(run.attempts, loop_address, down),
        }
    slow = timeline.fault("slow")
    slow_figures = None
    if slow is not None:
        slow_figures = {
            "replica": slow.replica,
            "added_latency_ms": timeline.slow_latency_ms,
            "set_s": log.slow_set_s,
            "cleared_s": log.slow_cleared_s,
        }
    latencies = [r.latency_s for r in ok]
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    successes = success_bins(results, end_s)
    figures: dict[str, Any] = {
        "client": run.client,
        "admission": run.admission,
        "logical_requests": logical,
        "app_calls": sum(r.app_calls for r in results),
        "success_rate": round_or_none(len(ok) / logical if logical else None, 4),
        "errors": dict(Counter(r.error or "?" for r in results if not r.ok).most_common()),
        "server_attempts": server_attempts,
        "retry_amplification_server": round_or_none(server_attempts / logical if logical else None),
        "client_attempts": client_attempts,
        "retry_amplification_client": round_or_none(client_attempts / logical if logical else None),
        "replicas": replicas,
        "sick_share": shares,
        "dead_replica": dead_figures,
        "crash_loop": loop_figures,
        "slow_replica": slow_figures,
        "latency_p50_s": round_or_none(percentile(latencies, 50)),
        "latency_p99_s": round_or_none(percentile(latencies, 99)),
        "ttft_p50_s": round_or_none(percentile(ttfts, 50)),
        "ttft_p99_s": round_or_none(percentile(ttfts, 99)),
        "recovered_s": log.recovered_s,
        "recovery_s": round_or_none(recovered_after(results, recover, end_s), 2),
        "rejoin_s": round_or_none(rejoin, 2),
        "fault_errors": log.errors,
        "processes": run.processes,
        # [process, s from the start, "host:port", status before, after, why]
        "ejection_log": [[process, *e] for process, e in sorted(run.ejections)],
        "client_cpu_s": round(sum(float(str(p.get("cpu_s") or 0)) for p in run.processes), 2),
        "timeseries": {
            "attempts_per_s_by_replica": {
                str(i): binned_rates(s, ATTEMPTS, end_s) for i, s in enumerate(run.replica_samples)
            },
            "client_attempts_per_s_by_replica": _client_series(run.attempts, run.addresses, end_s),
            "successes_per_s": [
                [(i + 0.5) * BIN_S, n_ok / BIN_S] for i, (n_ok, _) in enumerate(successes)
            ],
            "replica_states": {
                str(i): segments for i, segments in enumerate(replica_states(run, config, end_s))
            },
        },
    }
    checks = check_fleet_targets(figures, config.targets)
    return {**figures, "targets": checks, "missed": _missed(checks)}


def _missed(checks: dict[str, dict[str, Any]]) -> list[str]:
    return [name for name, check in checks.items() if not check["met"]]


def check_fleet_targets(figures: dict[str, Any], targets: FleetTargets) -> dict[str, Any]:
    """Each target's bound, the measured figure, and whether it was met (a figure not
    measured does not meet its target); the p99 target waits for the Router's row."""
    dead = figures["sick_share"].get("dead") or {}
    bounds: list[tuple[str, str, float | None, float, bool]] = [
        ("success", "success_rate", figures["success_rate"], targets.min_success, True),
        (
            "attempts/call",
            "retry_amplification_server",
            figures["retry_amplification_server"],
            targets.max_attempts_per_call,
            False,
        ),
        ("dead share", "sick_share.dead.share", dead.get("share"), targets.max_dead_share, False),
    ]
    checks: dict[str, Any] = {}
    for name, key, value, bound, at_least in bounds:
        met = value is not None and (value >= bound if at_least else value <= bound)
        checks[name] = {"figure": key, "bound": bound, "measured": value, "met": met}
    checks["p99 vs router"] = {
        "figure": "latency_p99_s / litellm-router's",
        "bound": targets.max_p99_over_router,
        "measured": None,
        "met": False,
    }
    return checks


def compare_with_router(pairings: list[dict[str, Any]]) -> None:
    """Fill in each pairing's p99 target against LiteLLM Router's p99 of the same server
    mode (no Router row: not measured, not met), and its ``missed`` list."""
    router_p99 = {p["admission"]: p["latency_p99_s"] for p in pairings if p["client"] == ROUTER}
    for p in pairings:
        check = p["targets"]["p99 vs router"]
        theirs, mine = router_p99.get(p["admission"]), p["latency_p99_s"]
        ratio = None if not theirs or mine is None else round(mine / theirs, 3)
        check["measured"] = ratio
        check["met"] = ratio is not None and ratio <= check["bound"]
        p["missed"] = _missed(p["targets"])


def fleet_document_config(config: FleetConfig) -> dict[str, Any]:
    """The run's knobs as the JSON shows them."""
    return {
        "replicas": config.replicas,
        "processes": config.processes,
        "workload": asdict(config.workload),
        "timeline": asdict(config.timeline),
        "patience": asdict(config.patience),
        "targets": asdict(config.targets),
        "engine_args": list(config.engine_args),
    }
