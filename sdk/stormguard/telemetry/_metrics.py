"""The client's metric instruments: GenAI histograms and stormguard counters.

Retry amplification is ``sum(stormguard.client.attempts) / sum(stormguard.client.calls)``
over any window, per model or endpoint; ``stormguard.client.attempts`` by
``stormguard.attempt.outcome`` says why each attempt ended (``retry``, ``ok``,
``budget``, ``max_attempts``...).
"""

from __future__ import annotations

from collections.abc import Iterable

from opentelemetry.metrics import CallbackOptions, Meter, Observation

from .._core.fork import fork_safe_lock
from . import _names as n

__all__ = ["BREAKER_STATE_VALUES", "ENDPOINT_STATUS_VALUES", "MAX_SERIES", "ClientMetrics"]

#: ``stormguard.client.breaker.state``: 0 closed, 1 half open, 2 open (higher is worse).
BREAKER_STATE_VALUES = {"closed": 0, "half_open": 1, "open": 2}
#: ``stormguard.client.endpoint.status``: 0 active, 1 probation, 2 ejected (the same order).
ENDPOINT_STATUS_VALUES = {"active": 0, "probation": 1, "ejected": 2}
#: Series each gauge keeps.
MAX_SERIES = 1024


class ClientMetrics:
    """Instruments made once per meter; thread-safe (the SDK's instruments are)."""

    def __init__(self, meter: Meter) -> None:
        self.duration = meter.create_histogram(
            n.METRIC_OPERATION_DURATION,
            unit="s",
            description="GenAI operation duration.",
            explicit_bucket_boundaries_advisory=list(n.DURATION_BUCKETS),
        )
        self.token_usage = meter.create_histogram(
            n.METRIC_TOKEN_USAGE,
            unit="{token}",
            description="Number of input and output tokens used.",
            explicit_bucket_boundaries_advisory=[float(b) for b in n.TOKEN_BUCKETS],
        )
        self.time_to_first_chunk = meter.create_histogram(
            n.METRIC_TIME_TO_FIRST_CHUNK,
            unit="s",
            description="Time to receive the first chunk of a streamed response.",
            explicit_bucket_boundaries_advisory=list(n.DURATION_BUCKETS),
        )
        self.calls = meter.create_counter(
            n.METRIC_CALLS, unit="{call}", description="Logical calls, by outcome."
        )
        self.attempts = meter.create_counter(
            n.METRIC_ATTEMPTS,
            unit="{attempt}",
            description="HTTP attempts, by why each ended (retry amplification = attempts/calls).",
        )
        self.budget_refusals = meter.create_counter(
            n.METRIC_BUDGET_REFUSALS,
            unit="{retry}",
            description="Retries the retry budget refused.",
        )
        self.breaker_transitions = meter.create_counter(
            n.METRIC_BREAKER_TRANSITIONS,
            unit="{transition}",
            description="Circuit breaker state changes, by breaker and new state.",
        )
        self.endpoint_transitions = meter.create_counter(
            n.METRIC_ENDPOINT_TRANSITIONS,
            unit="{transition}",
            description="Endpoint ejections, probations and returns, by endpoint, status, reason.",
        )
        self.discovery_changes = meter.create_counter(
            n.METRIC_DISCOVERY_CHANGES,
            unit="{change}",
            description="Changes of a DNS name's set of endpoints, by name.",
        )
        self.queue_duration = meter.create_histogram(
            n.METRIC_QUEUE_DURATION,
            unit="s",
            description="Time an attempt waited in the local queue for a concurrency slot.",
            explicit_bucket_boundaries_advisory=[0.0, *n.DURATION_BUCKETS],
        )
        self.quota_wait = meter.create_histogram(
            n.METRIC_QUOTA_WAIT,
            unit="s",
            description="Time an attempt waited for its share of its API key's quota.",
            explicit_bucket_boundaries_advisory=[0.0, *n.DURATION_BUCKETS],
        )
        self.paced_429s = meter.create_counter(
            n.METRIC_QUOTA_PACED_429S,
            unit="{response}",
            description="Quota 429s after which a call went back to its key's pacer.",
        )
        self._breaker_states: dict[str, int] = {}
        self._endpoint_statuses: dict[str, int] = {}
        self._limits: dict[str, int] = {}
        self._discovered: dict[str, int] = {}
        self._lock = fork_safe_lock()
        meter.create_observable_gauge(
            n.METRIC_CONCURRENCY_LIMIT,
            callbacks=[self._observe_limits],
            unit="{call}",
            description="Each endpoint's adaptive concurrency limit, as last granted.",
        )
        meter.create_observable_gauge(
            n.METRIC_BREAKER_STATE,
            callbacks=[self._observe_breakers],
            unit="1",
            description="Breaker state per (endpoint, model): 0 closed, 1 half open, 2 open.",
        )
        meter.create_observable_gauge(
            n.METRIC_ENDPOINT_STATUS,
            callbacks=[self._observe_endpoints],
            unit="1",
            description="Endpoint status in rotation: 0 active, 1 probation, 2 ejected.",
        )
        meter.create_observable_gauge(
            n.METRIC_DISCOVERY_ENDPOINTS,
            callbacks=[self._observe_discovered],
            unit="{endpoint}",
            description="Endpoints each DNS name resolved to, at its last good look.",
        )

    # The gauges' last values, one series per endpoint, breaker or name: kept for at
    # most MAX_SERIES keys each (the least recently set goes first), and dropped for
    # the endpoints that leave a DNS name (``forget_endpoints``). One Telemetry serves
    # every client by default, so nothing here may grow with the names that pass.

    def breaker_state(self, name: str, state: str) -> None:
        self._set(self._breaker_states, name, BREAKER_STATE_VALUES.get(state, 0))

    def endpoint_status(self, endpoint: str, status: str) -> None:
        self._set(self._endpoint_statuses, endpoint, ENDPOINT_STATUS_VALUES.get(status, 0))

    def discovered(self, name: str, endpoints: int) -> None:
        self._set(self._discovered, name, endpoints)

    def concurrency_limit(self, endpoint: str, limit: int) -> None:
        self._set(self._limits, endpoint, limit)

    def forget_endpoints(self, endpoints: Iterable[str]) -> None:
        """These endpoints left: their series (limit, status, every model's breaker) end."""
        gone = set(endpoints)
        with self._lock:
            for name in gone:
                self._limits.pop(name, None)
                self._endpoint_statuses.pop(name, None)
            for key in [k for k in self._breaker_states if k.rpartition("@")[2] in gone]:
                del self._breaker_states[key]

    def _set(self, table: dict[str, int], key: str, value: int) -> None:
        with self._lock:
            table.pop(key, None)  # to the end: the most recently set
            table[key] = value
            if len(table) > MAX_SERIES:
                del table[next(iter(table))]

    def _observe_limits(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = list(self._limits.items())
        return [Observation(value, {n.ATTEMPT_ENDPOINT: name}) for name, value in items]

    def _observe_breakers(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = list(self._breaker_states.items())
        return [Observation(value, {n.BREAKER_NAME: name}) for name, value in items]

    def _observe_endpoints(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = list(self._endpoint_statuses.items())
        return [Observation(value, {n.ATTEMPT_ENDPOINT: name}) for name, value in items]

    def _observe_discovered(self, options: CallbackOptions) -> Iterable[Observation]:
        with self._lock:
            items = list(self._discovered.items())
        return [Observation(value, {n.DISCOVERY_NAME: name}) for name, value in items]
