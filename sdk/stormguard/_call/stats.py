"""Counters of what a client did, for ``client.stats()``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._core.fork import fork_safe_lock

if TYPE_CHECKING:
    from .._policies.breaker.states import BreakerSnapshot
    from .._policies.limiter.endpoint_limit import LimitSnapshot
    from .._policies.quota import QuotaSnapshot
    from .._policies.routing.dns_name import DiscoverySnapshot
    from .._policies.routing.ejection_status import EndpointHealth
    from .._policies.routing.tiers import DeploymentSnapshot

__all__ = [
    "HEDGE_NO_BUDGET",
    "HEDGE_NO_ENDPOINT",
    "HEDGE_SENT",
    "HEDGE_WON",
    "CallStats",
    "StatsRecorder",
]

#: What ``StatsRecorder.hedge`` counts.
HEDGE_SENT, HEDGE_WON, HEDGE_NO_BUDGET, HEDGE_NO_ENDPOINT = range(4)


@dataclass(frozen=True, slots=True)
class CallStats:
    """A snapshot of a client's counters since it was created."""

    logical_calls: int
    attempts: int
    retries: int
    retries_refused_by_budget: int
    #: Times a call moved on to a fallback model.
    fallbacks: int = 0
    #: The state of each (endpoint, model) breaker the client has used.
    breakers: tuple[BreakerSnapshot, ...] = ()
    #: Attempts shed before processing and sent back to the local queue.
    requeues: int = 0
    #: Requeues the requeue budget refused (the call failed with the shed).
    requeues_refused_by_budget: int = 0
    #: Each endpoint's concurrency limit, in flight and waiting (shared limiters:
    #: every client's calls).
    concurrency: tuple[LimitSnapshot, ...] = ()
    #: Retries that went to an endpoint the call had not tried, outside the retry
    #: budget (counted in ``retries`` too).
    failovers: int = 0
    #: Each endpoint's ejection status: active, ejected (why, for how long still) or
    #: on probation.
    endpoints: tuple[EndpointHealth, ...] = ()
    #: The names of the endpoints calls may go to now (discovered ones included).
    endpoint_names: tuple[str, ...] = ()
    #: Each DNS name's endpoints, looks and last failure (DNS discovery).
    discovery: tuple[DiscoverySnapshot, ...] = ()
    #: Quota 429s this client's calls went back to their key's pacer for (paced
    #: retries: counted in ``attempts``, not in ``retries``).
    paced_429s: int = 0
    #: Each key this client's calls used whose quota is paced: its learned limits,
    #: this process's share and rate, the key's last ``remaining``, the waits
    #: (at most ``QuotaPolicy.max_keys``).
    quota: tuple[QuotaSnapshot, ...] = ()
    #: Each ``Deployment``'s attempts, calls served and failovers away from it, with
    #: its tier (docs/providers.md).
    deployments: tuple[DeploymentSnapshot, ...] = ()
    #: ``(model, tier)`` for each model whose calls left their preferred tier (its
    #: deployments all out of rotation) and have not returned yet.
    tiers_left: tuple[tuple[str | None, int], ...] = ()
    #: Attempts that went to their prefix-cache affinity key's home, and attempts
    #: with a key that went elsewhere (its home full, shedding or tried).
    affinity_hits: int = 0
    affinity_overflows: int = 0
    #: Hedges sent (one more attempt of a slow call, to another endpoint), and those
    #: whose answer the call returned; calls past their delay whose hedge was held
    #: back (once a call; it is asked for again while the primary waits, and may go
    #: later): the hedge budget was spent (or the call's key is paced to its quota),
    #: or no other endpoint could take it (in rotation, not shedding or paused).
    hedges_sent: int = 0
    hedges_won: int = 0
    hedges_skipped_budget: int = 0
    hedges_skipped_no_endpoint: int = 0

    @property
    def retry_amplification(self) -> float:
        """Attempts per logical call (1.0 means no retries; 0.0 before any call)."""
        return self.attempts / self.logical_calls if self.logical_calls else 0.0


class StatsRecorder:
    """Thread-safe counters; one per client."""

    def __init__(self) -> None:
        self._lock = fork_safe_lock()
        self._calls = self._attempts = self._retries = self._refused = self._fallbacks = 0
        self._requeues = self._requeues_refused = self._failovers = self._paced = 0
        self._affinity_hits = self._affinity_overflows = 0
        self._hedges = [0, 0, 0, 0]  # sent, won, skipped: budget, no endpoint

    def call(self) -> None:
        with self._lock:
            self._calls += 1

    def attempt(self, *, retry: bool) -> None:
        with self._lock:
            self._attempts += 1
            if retry:
                self._retries += 1

    def budget_refusal(self) -> None:
        with self._lock:
            self._refused += 1

    def fallback(self) -> None:
        with self._lock:
            self._fallbacks += 1

    def requeue(self) -> None:
        with self._lock:
            self._requeues += 1

    def paced(self) -> None:
        with self._lock:
            self._paced += 1

    def failover(self) -> None:
        with self._lock:
            self._failovers += 1

    def affinity(self, *, hit: bool) -> None:
        with self._lock:
            if hit:
                self._affinity_hits += 1
            else:
                self._affinity_overflows += 1

    def hedge(self, what: int) -> None:
        """Count a hedge event: ``HEDGE_SENT``, ``HEDGE_WON``, ``HEDGE_NO_BUDGET``,
        ``HEDGE_NO_ENDPOINT``."""
        with self._lock:
            self._hedges[what] += 1

    def requeue_refusal(self) -> None:
        with self._lock:
            self._requeues_refused += 1

    def snapshot(
        self,
        *,
        breakers: tuple[BreakerSnapshot, ...] = (),
        concurrency: tuple[LimitSnapshot, ...] = (),
        endpoints: tuple[EndpointHealth, ...] = (),
        endpoint_names: tuple[str, ...] = (),
        discovery: tuple[DiscoverySnapshot, ...] = (),
        quota: tuple[QuotaSnapshot, ...] = (),
        deployments: tuple[DeploymentSnapshot, ...] = (),
        tiers_left: tuple[tuple[str | None, int], ...] = (),
    ) -> CallStats:
        with self._lock:
            return CallStats(
                self._calls,
                self._attempts,
                self._retries,
                self._refused,
                self._fallbacks,
                breakers,
                self._requeues,
                self._requeues_refused,
                concurrency,
                self._failovers,
                endpoints,
                endpoint_names,
                discovery,
                self._paced,
                quota,
                deployments,
                tiers_left,
                self._affinity_hits,
                self._affinity_overflows,
                *self._hedges,
            )
