"""The replicas scenario's figures per pairing, and its claims checked on stormguard's
rows: affinity computes fewer prefill tokens than the default client; hedging's TTFT
p99 is below the default client's with at most 1.1 requests at the replicas a call;
every client completes its calls within their deadline."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from stormguard_drill.figures import percentile, round_or_none
from stormguard_drill.replicas.config import ReplicasConfig
from stormguard_drill.replicas.records import ReplicasRun


def _total(run: ReplicasRun, key: str) -> float:
    return sum(replica[key] for replica in run.replicas)


def max_share(per_replica: Sequence[float]) -> float | None:
    """The busiest replica's requests over its fair share (1.0: even)."""
    total = sum(per_replica)
    if not per_replica or total <= 0:
        return None
    return max(per_replica) * len(per_replica) / total


def _ratio(part: float, whole: float) -> float | None:
    return None if whole <= 0 else part / whole


def summarize_replicas(run: ReplicasRun, config: ReplicasConfig) -> dict[str, Any]:
    """One pairing's figures (times in seconds)."""
    calls = run.calls
    served = [c for c in calls if c.ok]
    ttfts = [c.ttft_s for c in served if c.ttft_s is not None]
    slow = [
        c.ttft_s
        for c in served
        if c.ttft_s is not None and config.slow_from_s <= c.start_s < config.slow_until_s
    ]
    requests = [replica["requests"] for replica in run.replicas]
    attempts = run.client_stats.get("attempts")
    figures: dict[str, Any] = {
        "part": run.part,
        "client": run.client,
        "calls": len(calls),
        "success_rate": round_or_none(_ratio(len(served), len(calls)), 4),
        "ttft_p50_s": round_or_none(percentile(ttfts, 50)),
        "ttft_p99_s": round_or_none(percentile(ttfts, 99)),
        "requests_per_call": round_or_none(_ratio(sum(requests), len(calls))),
        "client_attempts_per_call": round_or_none(
            None if attempts is None else _ratio(attempts, len(calls))
        ),
        "replica_requests": [int(n) for n in requests],
        "max_over_fair": round_or_none(max_share(requests), 2),
        "prefill_tokens": int(_total(run, "prefill_tokens")),
        "cache_hit_rate": round_or_none(
            _ratio(_total(run, "cache_hits"), _total(run, "cache_queries"))
        ),
        "loser_tokens": int(_total(run, "gone_client_tokens")),
        "output_tokens": int(_total(run, "output_tokens")),
        "aborted": int(_total(run, "aborted")),
        "hedges_sent": run.client_stats.get("hedges_sent"),
        "hedges_won": run.client_stats.get("hedges_won"),
        "errors": dict(Counter(c.error or "?" for c in calls if not c.ok)),
        "fault_errors": run.fault_errors,
    }
    if run.part == "hedging":
        figures["slow_window_ttft_p99_s"] = round_or_none(percentile(slow, 99))
    return figures


def check_targets(pairings: Sequence[dict[str, Any]], config: ReplicasConfig) -> dict[str, Any]:
    """Each claim: ``{name: {"value": ..., "bound": ..., "met": bool | None}}`` (None:
    a row it needs did not run)."""
    by = {(p["part"], p["client"]): p for p in pairings}
    t = config.targets
    checks: dict[str, Any] = {}

    def check(name: str, value: Any, bound: Any, met: bool | None) -> None:
        checks[name] = {"value": value, "bound": bound, "met": met}

    default, keyed = by.get(("affinity", "stormguard")), by.get(("affinity", "stormguard-affinity"))
    if default is not None and keyed is not None:
        ratio = _ratio(keyed["prefill_tokens"], default["prefill_tokens"])
        bound = t.max_affinity_prefill_ratio
        check(
            "affinity_prefill_vs_default",
            round_or_none(ratio),
            bound,
            None if ratio is None else ratio < bound,
        )
    default = by.get(("hedging", "stormguard"))
    for client, prefix in (
        ("stormguard-hedge", "hedge"),
        ("stormguard-hedge-latency", "hedge_latency"),
    ):
        hedged = by.get(("hedging", client))
        if hedged is None:
            continue
        if default is not None:
            ours, theirs = hedged["ttft_p99_s"], default["ttft_p99_s"]
            p99_bound = None if theirs is None else round(theirs * t.max_hedge_p99_ratio, 3)
            met = None if ours is None or p99_bound is None else ours < p99_bound
            check(f"{prefix}_ttft_p99_vs_default", ours, p99_bound, met)
        per_call = hedged["requests_per_call"]
        bound = t.max_hedge_attempts_per_call
        met = None if per_call is None else per_call <= bound
        check(f"{prefix}_requests_per_call", per_call, bound, met)
    for pairing in pairings:
        rate = pairing["success_rate"]
        name = f"success_{pairing['part']}_{pairing['client']}"
        check(name, rate, t.min_success, None if rate is None else rate >= t.min_success)
    return checks


def targets_line(checks: dict[str, Any]) -> str:
    """The claims and whether each was met."""
    if not checks:
        return "no claim checked"
    parts = []
    for name, check in checks.items():
        mark = {True: "met", False: "MISSED", None: "not measured"}[check["met"]]
        parts.append(f"{name} {check['value']} (bound {check['bound']}): {mark}")
    return "; ".join(parts)
