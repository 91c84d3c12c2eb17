"""Every knob of the reference server in one place, as plain frozen dataclasses.

The CLI builds these from flags (cli/); tests build them directly with small
sizes and fast speeds. Defaults are chosen so that the OOM avalanche shows
within seconds on a 2-core laptop: a KV cache of 8192 tokens fills with a
handful of 2k-token prompts, a step takes milliseconds, a cold restart takes
a few seconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True, slots=True)
class SimEngineConfig:
    """Sizes and speeds of the simulated continuous-batching engine."""

    model: str = "stormguard-sim"
    max_model_len: int = 4096
    # KV cache: num_kv_blocks blocks of block_size tokens (vLLM's paged layout).
    block_size: int = 16
    num_kv_blocks: int = 512
    # Running batch bounds, as vLLM's --max-num-seqs and --max-num-batched-tokens.
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 1024
    # Step time = step_base_s + prefill_token_s * prefill tokens + decode_seq_s * decoding seqs.
    step_base_s: float = 0.004
    prefill_token_s: float = 0.00002
    decode_seq_s: float = 0.0002
    # When a running sequence needs a KV block and none is free: True = the
    # engine "OOMs" and crashes (the OOM avalanche); False = vLLM's
    # recompute preemption of the newest running sequence.
    oom_crash: bool = True
    # Automatic prefix caching (kv_cache.py): a prompt's full blocks already in the KV
    # cache are not prefilled again. On, as in vLLM V1; a workload whose prompts share
    # no leading block (every drill's but the replicas') computes exactly as without.
    prefix_caching: bool = True
    # Cold restart after a crash, then a warm-up probe, then a slow-start ramp
    # during which the engine's batch (and the admission budget) grow linearly.
    restart_s: float = 3.0
    warmup_probe_tokens: int = 8
    slow_start_s: float = 2.0
    slow_start_floor: float = 0.25
    # An OOM within this long after the engine became ready again counts as a
    # restart loop (the engine never really recovered).
    restart_loop_period_s: float = 10.0
    # Natural completion length when ignore_eos is false: deterministic per
    # prompt, between half and 1.5x this.
    natural_output_tokens: int = 64
    seed: int = 0

    @property
    def kv_capacity_tokens(self) -> int:
        """Tokens the whole KV cache holds."""
        return self.block_size * self.num_kv_blocks


@dataclass(frozen=True, slots=True)
class FaultConfig:
    """Faults active at start; the admin endpoint changes them at run time."""

    error_rate: float = 0.0
    added_latency_s: float = 0.0
    stall_s: float = 0.0
    #: Fraction of requests that hang: no answer until the request's deadline, or
    #: ``HANG_LIMIT_S``, unless the client goes first (a provider in partial outage).
    hang_rate: float = 0.0
    seed: int = 0


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Token-weighted admission in front of the engine."""

    enabled: bool = True
    # Budget = engine KV capacity (tokens) x watermark. Costs are counted in
    # whole KV blocks, so admitted work fits even at 1.0; the headroom is for
    # engines that need memory beyond the KV cache.
    kv_watermark: float = 0.9
    max_queue_requests: int = 256
    max_queue_tokens: int = 65_536
    max_queue_wait_s: float = 10.0
    # During overload a retry is shed at once (x-load-shed: retry_shed,
    # x-should-retry: false) when it would queue behind more than this
    # fraction of the queue's request limit: retries feed the storm.
    retry_queue_fraction: float = 0.5
    # Retry-After bounds: never tell a client "0" nor "come back in an hour".
    min_retry_after_s: float = 0.05
    max_retry_after_s: float = 30.0
    # Hold times behind Retry-After are measured on the requests released in the
    # last this many seconds.
    drain_period_s: float = 5.0


#: Where a quota 429 says when to come back (quota/buckets.py): nowhere, ``retry-after`` in
#: whole seconds rounded up, ``retry-after-ms``, or Azure's ``x-ms-retry-after-ms``.
RetryAfterMode = Literal["none", "seconds", "ms", "azure"]
RETRY_AFTER_MODES: tuple[RetryAfterMode, ...] = ("none", "seconds", "ms", "azure")


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    """A hosted API's quota per API key (quota/buckets.py): off unless a limit is set."""

    tokens_per_minute: int | None = None
    requests_per_minute: int | None = None
    # Tokens one key may be charged in a day; past it, 429 insufficient_quota.
    tokens_per_day: int | None = None
    # Output tokens charged for a request that sends no max_tokens (OpenAI does not
    # say what it charges then).
    default_max_tokens: int = 256
    retry_after: RetryAfterMode = "seconds"
    # The x-ratelimit-* headers on every response of a keyed route.
    headers: bool = True
    # Refuse every keyed request with 429 insufficient_quota (out of credit).
    insufficient_quota: bool = False
    # Keys tracked at once; the least recently used is dropped past it.
    max_keys: int = 1024

    @property
    def enabled(self) -> bool:
        """Whether any limit (or the forced insufficient_quota) is set."""
        limits = (self.tokens_per_minute, self.requests_per_minute, self.tokens_per_day)
        return self.insufficient_quota or any(limit is not None for limit in limits)


# The networks trusted by default to raise a request's priority: this host's own.
LOOPBACK_NETWORKS: tuple[str, ...] = ("127.0.0.0/8", "::1/128")


@dataclass(frozen=True, slots=True)
class PriorityTrustConfig:
    """Whose ``x-priority: critical`` is believed (priority_trust.py): callers in
    ``networks`` (CIDRs), or sending ``token`` in ``x-priority-token``. The client's
    address is the peer's, or what ``X-Forwarded-For`` says when the peer is one of
    the proxies in ``forwarded_from``."""

    networks: tuple[str, ...] = LOOPBACK_NETWORKS
    # Out of repr, so that printing a config does not print it.
    token: str | None = field(default=None, repr=False)
    forwarded_from: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The whole server: HTTP side plus the engine, faults and admission."""

    host: str = "127.0.0.1"
    port: int = 8000
    admin_port: int | None = None
    # Bearer token of the admin endpoint (None: a random one, logged once at
    # start). Out of repr, so that printing a config does not print it.
    admin_token: str | None = field(default=None, repr=False)
    # Once listening, the ports bound (JSON: port, admin_port) are written here,
    # so that a harness may ask for port 0 and learn which one it got.
    port_file: str | None = None
    max_body_bytes: int = 1_048_576
    # Slow and hostile clients (connections.py, request_limits.py): a connection
    # must send its request headers within header_timeout_s (of connecting, or of
    # its previous response) and its body within body_timeout_s of the headers;
    # at most max_connections are open (past that the one idle longest is
    # closed), max_concurrent_requests are served, and their bodies hold at
    # most max_buffered_body_bytes (past either: 503 + Retry-After).
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 4096
    max_concurrent_requests: int = 2048
    max_buffered_body_bytes: int = 64 * 1_048_576
    # A request's head (request line to blank line) and its header lines; past
    # either, 431 and the connection closed (connections.py).
    max_header_bytes: int = 16 * 1024
    max_header_count: int = 100
    priority_trust: PriorityTrustConfig = field(default_factory=PriorityTrustConfig)
    # Further model names served by the same engine (listed in /v1/models).
    model_aliases: tuple[str, ...] = ()
    # Length of the vectors /v1/embeddings returns (openai's text-embedding-3-small's);
    # a request's ``dimensions`` may ask for fewer.
    embedding_dimensions: int = 1536
    # How often queued requests are expired and re-checked for admission.
    admission_tick_s: float = 0.02
    access_log: bool = False
    log_level: str = "info"
    # OTLP/HTTP collector base URL for server spans (None: no tracing).
    otlp_endpoint: str | None = None
    engine: SimEngineConfig = field(default_factory=SimEngineConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    quota: QuotaConfig = field(default_factory=QuotaConfig)
