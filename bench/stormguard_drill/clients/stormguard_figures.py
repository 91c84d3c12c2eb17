"""stormguard's own figures (``client.stats()``) as the drill reads them: the gauges
sampled beside the server's metrics, and the counters kept at the end of a pairing.
Both the stormguard client and openai on stormguard's transport report them."""

from __future__ import annotations

import stormguard

# Sampled client gauges (summed over endpoints: the drill has one).
CLIENT_LIMIT = "drill_client_concurrency_limit"
CLIENT_IN_FLIGHT = "drill_client_in_flight"
CLIENT_WAITING = "drill_client_waiting"
CLIENT_PAUSED = "drill_client_paused_s"


def limiter_gauges(snapshot: stormguard.CallStats) -> dict[str, float]:
    """The concurrency limiter's state now (empty without a limiter)."""
    states = snapshot.concurrency
    if not states:
        return {}
    return {
        CLIENT_LIMIT: float(sum(s.limit for s in states)),
        CLIENT_IN_FLIGHT: float(sum(s.in_flight for s in states)),
        CLIENT_WAITING: float(sum(s.waiting for s in states)),
        CLIENT_PAUSED: max(s.paused_for for s in states),
    }


def stormguard_stats(snapshot: stormguard.CallStats) -> dict[str, float]:
    """Calls, attempts, retries, requeues and failovers, the first endpoint's limit, and
    the first quota key's share, 429s and waits."""
    stats: dict[str, float] = {
        "logical_calls": snapshot.logical_calls,
        "attempts": snapshot.attempts,
        "retries": snapshot.retries,
        "retries_refused_by_budget": snapshot.retries_refused_by_budget,
        "retry_amplification": snapshot.retry_amplification,
        "requeues": snapshot.requeues,
        "requeues_refused_by_budget": snapshot.requeues_refused_by_budget,
        "failovers": snapshot.failovers,
    }
    for state in snapshot.concurrency[:1]:
        stats.update(
            concurrency_limit=state.limit,
            concurrency_decreases=state.decreases,
            concurrency_refused=state.refused,
        )
    for quota in snapshot.quota[:1]:
        # The key's quota as this process paced to it, at the end: its share, the 429s
        # it met, the waits, and the mode ("headers", "429s").
        stats.update(
            quota_share_tokens=quota.share_tokens,
            quota_share_requests=quota.share_requests,
            quota_paced_429s=quota.paced_429s,
            quota_waits=quota.waits,
            quota_wait_s=quota.wait_s,
            quota_headers=1.0 if quota.mode == "headers" else 0.0,
        )
    return stats
