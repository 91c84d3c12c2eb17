"""The figures of one quota pairing, from its calls and the server's counts.

Definitions (docs/benchmarks.md, "A hosted API's quota", repeats them):

- success = calls that returned a whole answer within their deadline / calls (a call
  the batch never started is a failure);
- requests per call at the server = requests the server saw on the chat route, every
  status (200s, quota 429s, anything else) / calls; at the client, where the client
  counts its attempts (LiteLLM does not: ``None``). A LiteLLM refusal of its own ("No
  deployments available") reaches no server and is counted nowhere but in the errors;
- 429s = the server's 429 answers on the chat route (each a quota refusal: the drill's
  server sheds nothing else), by reason in ``quota_refused_by_reason``;
- wall = from the batch's start to the end of its last call, successful or not;
- ideal = the shortest batch the quota allows (``QuotaWorkload.ideal_wall_s``): the
  demand beyond the initial bucket at the refill rate, plus one answer; the demand is
  the batch's own cost at the server (every call's prompt tokens + max_tokens, once),
  the same for every client, so that the ratio compares them; ``tokens_charged`` is
  what the server charged in the pairing (more than the demand when a call was
  admitted twice, less when calls failed);
- p50/p99 = latency of the successful calls, from when a worker started each.

Every pairing is checked against the targets (``QuotaTargets``, for stormguard);
``missed`` names the ones it did not meet.
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

from stormguard_drill.figures import percentile, round_or_none, success_bins
from stormguard_drill.quota.client_names import QUOTA_CLIENT_TITLES, THREADED_CLIENTS
from stormguard_drill.quota.config import QuotaRunConfig, QuotaTargets
from stormguard_drill.quota.records import NOT_STARTED, QuotaRun

_ADMITTED = "stormguard_quota_admitted_total"
_REFUSED = "stormguard_quota_refused_total"


def _rates(samples: list[tuple[float, dict[str, float]]], name: str) -> list[list[float]]:
    out = []
    for (t0, a), (t1, b) in itertools.pairwise(samples):
        if t1 > t0:
            rate = max(0.0, b.get(name, 0.0) - a.get(name, 0.0)) / (t1 - t0)
            out.append([round(t1, 3), round(rate, 3)])
    return out


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return numerator / denominator


def summarize_quota(run: QuotaRun, config: QuotaRunConfig, demand_tokens: int) -> dict[str, Any]:
    """Every figure of one pairing (the JSON entry; the table shows a subset)."""
    workload, variant = config.workload, run.variant
    results = run.results
    calls = len(results)
    ok = [r for r in results if r.ok]
    server = run.server
    wall = max((r.end_s for r in results), default=0.0)
    ideal = workload.ideal_wall_s(variant, demand_tokens)
    limits = workload.limits(variant.bound)
    client_attempts = run.client_attempts
    latencies = [r.latency_s for r in ok]
    figures: dict[str, Any] = {
        "variant": variant.name,
        "processes": variant.processes,
        "bound": variant.bound,
        "retry_after": variant.retry_after,
        "headers": variant.headers,
        "tpm": limits.tpm,
        "rpm": limits.rpm,
        "client": run.client,
        "client_title": QUOTA_CLIENT_TITLES.get(run.client, run.client),
        "runs_in": "threads" if run.client in THREADED_CLIENTS else "tasks",
        "workers_per_process": workload.workers,
        "calls": calls,
        "succeeded": len(ok),
        "success_rate": round_or_none(_ratio(len(ok), calls), 4),
        "not_started": sum(1 for r in results if r.error == NOT_STARTED),
        "server_requests": server["requests"],
        "requests_per_call_server": round_or_none(_ratio(server["requests"], calls)),
        "client_attempts": client_attempts,
        "requests_per_call_client": round_or_none(_ratio(client_attempts, calls)),
        "server_429s": server["responses_by_status"].get("429", 0),
        "responses_by_status": server["responses_by_status"],
        "quota_admitted": server["quota_admitted"],
        "quota_refused_by_reason": server["quota_refused_by_reason"],
        "tokens_charged": server["quota_tokens_charged"],
        "demand_tokens": demand_tokens,
        "wall_s": round_or_none(wall, 2),
        "ideal_wall_s": round_or_none(ideal, 2),
        "wall_over_ideal": round_or_none(_ratio(wall, ideal)),
        "latency_p50_s": round_or_none(percentile(latencies, 50)),
        "latency_p99_s": round_or_none(percentile(latencies, 99)),
        # LiteLLM counts usage per calendar minute: where in its minute the batch began.
        "started_at_second_of_minute": round(run.started_at_unix % 60, 1),
        "client_cpu_s": round(sum(float(p["cpu_s"]) for p in run.processes), 2),
        "errors": dict(Counter(r.error or "?" for r in results if not r.ok).most_common()),
        "processes_detail": run.processes,
        "timeseries": {
            "admitted_per_s": _rates(run.samples, _ADMITTED),
            "refused_per_s": _rates(run.samples, _REFUSED),
            "successes_per_s": [
                [i + 0.5, float(n_ok)] for i, (n_ok, _) in enumerate(success_bins(results, wall))
            ],
        },
    }
    checks = check_quota_targets(figures, config.targets)
    return {**figures, "targets": checks, "missed": [k for k, c in checks.items() if not c["met"]]}


def check_quota_targets(figures: dict[str, Any], targets: QuotaTargets) -> dict[str, Any]:
    """Each target's bound, the measured figure, and whether it was met (a figure not
    measured does not meet its target)."""
    bounds: list[tuple[str, str, float, bool]] = [
        ("success", "success_rate", targets.min_success, True),
        ("req/call", "requests_per_call_server", targets.max_requests_per_call, False),
        ("wall/ideal", "wall_over_ideal", targets.max_wall_over_ideal, False),
    ]
    checks: dict[str, Any] = {}
    for name, key, bound, at_least in bounds:
        value = figures.get(key)
        met = value is not None and (value >= bound if at_least else value <= bound)
        checks[name] = {"figure": key, "bound": bound, "measured": value, "met": met}
    return checks


def quota_targets_line(targets: QuotaTargets) -> str:
    return (
        f"success >= {targets.min_success:.1%}; requests/call at the server <= "
        f"{targets.max_requests_per_call}; wall <= {targets.max_wall_over_ideal} x ideal "
        "(for stormguard; every row is checked)"
    )
