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
  bins in a row (``figures.recovered_after``); 0 when it never dropped;
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

This module puts one pairing's entry together. The figures come from
``client_records`` (what the client processes recorded), ``replica_series`` (each
replica over time, from its samples), ``fault_figures`` (each fault's) and ``targets``
(the targets checked), beside it in ``fleet/``; import each name from its own module.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict
from typing import Any

from stormguard_drill.figures import (
    BIN_S,
    percentile,
    recovered_after,
    round_or_none,
    success_bins,
)
from stormguard_drill.fleet.client_records import (
    attempts_by_replica,
    client_series,
    ejections_of,
    rejoin_s,
)
from stormguard_drill.fleet.config import FaultKind, FleetConfig
from stormguard_drill.fleet.fault_figures import (
    crash_loop_figures,
    dead_replica_figures,
    sick_shares,
    slow_replica_figures,
)
from stormguard_drill.fleet.records import FleetRun
from stormguard_drill.fleet.replica_series import (
    ATTEMPTS,
    binned_rates,
    final_value,
    replica_states,
)
from stormguard_drill.fleet.targets import check_fleet_targets, missed


def summarize_fleet(run: FleetRun, config: FleetConfig) -> dict[str, Any]:
    """Every figure of one pairing (the JSON entry; the table shows a subset)."""
    results, log, timeline = run.results, run.faults, config.timeline
    logical = len(results)
    ok = [r for r in results if r.ok]
    end_s = max([config.workload.duration_s, *(r.end_s for r in results)])
    recover = log.recovered_s if log.recovered_s is not None else timeline.recover_at_s
    recorded = attempts_by_replica(run.attempts, run.addresses)
    client_attempts = sum(recorded.values())
    per_replica_server = [int(final_value(s, ATTEMPTS)) for s in run.replica_samples]
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
                "crashes": int(final_value(samples, "stormguard_engine_crashes_total")),
                "restart_loops": int(
                    final_value(samples, "stormguard_engine_oom_restart_loops_total")
                ),
                "ejections": dict(ejections_of(run, run.addresses[index]).most_common()),
            }
        )
    dead = timeline.fault("dead")
    rejoin = None
    if dead is not None and log.restarted_s is not None:
        rejoin = rejoin_s(run.attempts, run.addresses, dead.replica, log.restarted_s, end_s)
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
        "sick_share": sick_shares(run, timeline, recover),
        "dead_replica": dead_replica_figures(run, timeline, ok, end_s),
        "crash_loop": crash_loop_figures(run, timeline, replicas),
        "slow_replica": slow_replica_figures(run, timeline),
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
            "client_attempts_per_s_by_replica": client_series(run.attempts, run.addresses, end_s),
            "successes_per_s": [
                [(i + 0.5) * BIN_S, n_ok / BIN_S] for i, (n_ok, _) in enumerate(successes)
            ],
            "replica_states": {
                str(i): segments for i, segments in enumerate(replica_states(run, config, end_s))
            },
        },
    }
    checks = check_fleet_targets(figures, config.targets)
    return {**figures, "targets": checks, "missed": missed(checks)}


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
