"""Prometheus metrics of the server; docs/server.md lists every name.

Each app gets its own registry (tests build many apps in one process). Live
values (queue, budget, KV usage, batch) and the engine's lifetime counters
are read at scrape time by a collector, so the hot path only touches the
per-request counters and histograms defined here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stormguard.protocol import ServerLoad
from stormguard_server.engine.base import EngineLoad, EngineStats
from stormguard_server.telemetry.records import RequestRecord

PREFIX = "stormguard"


# Latency buckets from 10 ms to 2 min: TTFT under load and long completions both fit.
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120)
_MAX_ATTEMPT_LABEL = 10


def attempt_label(attempt: int | None) -> str:
    """Attempt number as a bounded label: "1".."9", then "10+" (no header means 1)."""
    value = attempt or 1
    return str(value) if value < _MAX_ATTEMPT_LABEL else f"{_MAX_ATTEMPT_LABEL}+"


# Engine counters exported from EngineStats: (field, metric name without _total, help).
_ENGINE_COUNTERS = (
    ("requests_started", "engine_requests", "Requests that reached the engine."),
    ("requests_finished", "engine_requests_finished", "Requests the engine completed."),
    ("requests_aborted", "engine_requests_aborted", "Requests aborted inside the engine."),
    (
        "requests_deadline_exceeded",
        "engine_requests_deadline_exceeded",
        "Requests the engine aborted because the caller's deadline passed.",
    ),
    ("requests_failed", "engine_requests_failed", "Requests failed by an engine crash."),
    ("prompt_tokens_computed", "engine_prefill_tokens", "Prompt tokens prefilled (recompute too)."),
    (
        "prefix_cache_queries",
        "engine_prefix_cache_queries",
        "Prompt tokens looked up in the prefix cache as requests entered the batch.",
    ),
    (
        "prefix_cache_hits",
        "engine_prefix_cache_hits",
        "Prompt tokens found in the prefix cache (not prefilled).",
    ),
    ("output_tokens", "engine_output_tokens", "Tokens the engine generated."),
    ("steps", "engine_steps", "Engine steps run."),
    ("preemptions", "engine_preemptions", "Sequences preempted for lack of KV blocks."),
    ("ooms", "engine_oom", "Engine crashes from running out of KV cache."),
    ("crashes", "engine_crashes", "Engine crashes of any cause (OOM and crash fault)."),
    ("restarts", "engine_restarts", "Cold restarts completed."),
    ("oom_restart_loops", "engine_oom_restart_loops", "Crashes soon after a restart."),
    ("injected_errors", "engine_injected_errors", "Requests failed by the error-rate fault."),
)

# The same counts under vLLM's own names (vllm/v1/metrics/loggers.py), so that what
# reads a vLLM replica's /metrics reads the simulated engine's the same way.
_VLLM_COUNTERS = (
    (
        "prefix_cache_queries",
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
    ),
    (
        "prefix_cache_hits",
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
    ),
)


class _LiveCollector(Collector):
    """Gauges and engine counters read at scrape time."""

    def __init__(
        self,
        engine_load: Callable[[], EngineLoad],
        engine_stats: Callable[[], EngineStats],
        server_load: Callable[[], ServerLoad | None],
    ) -> None:
        self._engine_load = engine_load
        self._engine_stats = engine_stats
        self._server_load = server_load

    def collect(self) -> Iterator[Metric]:
        load = self._engine_load()
        admission = self._server_load()
        queue = admission or ServerLoad(queue_depth=load.waiting, queue_tokens=None)
        yield _gauge(
            "queue_depth",
            "Requests waiting (admission queue, or engine queue when off).",
            queue.queue_depth or 0,
        )
        yield _gauge("queue_tokens", "Token cost of queued requests.", queue.queue_tokens or 0)
        yield _gauge(
            "inflight_tokens", "Token cost of admitted requests.", queue.inflight_tokens or 0
        )
        yield _gauge(
            "token_capacity",
            "Admission budget in tokens now (0 when admission is off).",
            queue.token_capacity or 0,
        )
        yield _gauge("kv_cache_usage_ratio", "Engine KV-cache usage, 0..1.", load.kv_cache_usage)
        yield _gauge(
            "kv_capacity_tokens", "Engine KV-cache size in tokens.", load.kv_capacity_tokens
        )
        yield _gauge("running_requests", "Sequences in the engine's running batch.", load.running)
        yield _gauge(
            "engine_waiting_requests", "Sequences waiting inside the engine.", load.waiting
        )
        yield _gauge("engine_ready", "1 when the engine accepts work.", 1.0 if load.ready else 0.0)
        yield _gauge(
            "engine_capacity_factor", "Slow-start ramp after a restart, 0..1.", load.capacity_factor
        )
        stats = self._engine_stats()
        for field_name, name, doc in _ENGINE_COUNTERS:
            family = CounterMetricFamily(f"{PREFIX}_{name}", doc)
            family.add_metric([], float(getattr(stats, field_name)))
            yield family
        for field_name, name, doc in _VLLM_COUNTERS:
            family = CounterMetricFamily(name, doc)
            family.add_metric([], float(getattr(stats, field_name)))
            yield family


class _RegistryWithoutCreated(CollectorRegistry):
    """A registry whose metrics come without their ``*_created`` samples: they double
    the output and no dashboard here reads them. prometheus_client's
    ``disable_created_metrics()`` would drop them from every registry of the
    process, vLLM's own included when the admission layer runs inside it; this
    drops them from the server's own registry only."""

    def collect(self) -> Iterator[Metric]:
        for metric in super().collect():
            samples = [s for s in metric.samples if not s.name.endswith("_created")]
            if len(samples) != len(metric.samples):
                trimmed = Metric(metric.name, metric.documentation, metric.type, metric.unit)
                trimmed.samples = samples
                metric = trimmed
            yield metric


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"{PREFIX}_{name}", doc, value=float(value))


class ServerMetrics:
    """Per-request metrics of one app (a ``RequestObserver``), plus the live collector."""

    def __init__(
        self,
        engine_load: Callable[[], EngineLoad],
        engine_stats: Callable[[], EngineStats],
        server_load: Callable[[], ServerLoad | None],
    ) -> None:
        self.registry: CollectorRegistry = _RegistryWithoutCreated()
        reg = self.registry
        self.responses = Counter(
            f"{PREFIX}_responses",
            "HTTP responses by route and status.",
            ["route", "status"],
            registry=reg,
        )
        self.attempts = Counter(
            f"{PREFIX}_attempts",
            "Generation requests by attempt number (retry amplification).",
            ["attempt"],
            registry=reg,
        )
        self.admitted = Counter(
            f"{PREFIX}_admitted", "Requests admitted to the engine.", ["priority"], registry=reg
        )
        self.shed = Counter(
            f"{PREFIX}_shed",
            "Requests refused by admission.",
            ["reason", "priority"],
            registry=reg,
        )
        self.disconnects = Counter(
            f"{PREFIX}_client_disconnects",
            "Clients that went away before their answer.",
            ["stage"],
            registry=reg,
        )
        self.gone_client_tokens = Counter(
            f"{PREFIX}_gone_client_tokens",
            "Output tokens generated for requests whose client had gone.",
            registry=reg,
        )
        self.prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens", "Prompt tokens of served requests.", registry=reg
        )
        self.output_tokens = Counter(
            f"{PREFIX}_output_tokens", "Output tokens delivered to clients.", registry=reg
        )
        self.priority_claims_ignored = Counter(
            f"{PREFIX}_priority_claims_ignored",
            "x-priority above standard from callers not trusted to send it (served as standard).",
            registry=reg,
        )
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Arrival to first token.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.e2e_latency = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds",
            "Arrival to last token.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        self.queue_wait = Histogram(
            f"{PREFIX}_queue_wait_seconds",
            "Time admitted requests waited in the queue.",
            buckets=_LATENCY_BUCKETS,
            registry=reg,
        )
        reg.register(_LiveCollector(engine_load, engine_stats, server_load))

    def request_arrived(self, record: RequestRecord) -> None:
        """Attempts are counted on arrival, so retry amplification shows at once."""
        self.attempts.labels(attempt_label(record.attempt)).inc()

    def request_done(self, record: RequestRecord) -> None:
        priority = record.priority.value
        if record.shed_reason is not None:
            self.shed.labels(record.shed_reason.value, priority).inc()
        if record.admitted_at is not None:
            self.admitted.labels(priority).inc()
            self.queue_wait.observe(record.admitted_at - record.arrival)
        if record.started:
            self.prompt_tokens.inc(record.prompt_tokens)
        if record.ttft_s is not None:
            self.ttft.observe(record.ttft_s)
        if record.gone_stage is not None:
            self.disconnects.labels(record.gone_stage).inc()
            self.gone_client_tokens.inc(record.output_tokens)
        if record.outcome == "ok":
            self.output_tokens.inc(record.output_tokens)
            if record.latency_s is not None:
                self.e2e_latency.observe(record.latency_s)
