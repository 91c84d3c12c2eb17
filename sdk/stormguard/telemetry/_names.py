"""Attribute, event and metric names, pinned here in one place.

GenAI and HTTP names follow OpenTelemetry semantic conventions v1.41.0 (the
GenAI ones are still "Development" there, so they are pinned rather than taken
from ``opentelemetry-semantic-conventions``, which the SDK does not depend on).
Everything stormguard adds lives under the ``stormguard.`` prefix.
"""

from __future__ import annotations

SEMCONV_SCHEMA_URL = "https://opentelemetry.io/schemas/1.41.0"

# -- GenAI (semconv v1.41.0) ---------------------------------------------------------
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_REQUEST_STREAM = "gen_ai.request.stream"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_INPUT_MESSAGES = "gen_ai.input.messages"
GEN_AI_OUTPUT_MESSAGES = "gen_ai.output.messages"
GEN_AI_TOKEN_TYPE = "gen_ai.token.type"

# -- HTTP, server, error (semconv v1.41.0, stable) -----------------------------------
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
HTTP_REQUEST_RESEND_COUNT = "http.request.resend_count"
URL_FULL = "url.full"
URL_TEMPLATE = "url.template"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
ERROR_TYPE = "error.type"

# -- stormguard ----------------------------------------------------------------------
ATTEMPTS = "stormguard.attempts"
ATTEMPT_NUMBER = "stormguard.attempt.number"
ATTEMPT_OUTCOME = "stormguard.attempt.outcome"
ATTEMPT_BACKOFF = "stormguard.attempt.backoff_s"
ATTEMPT_ENDPOINT = "stormguard.attempt.endpoint"
ATTEMPT_QUEUED = "stormguard.attempt.queued_s"
CONCURRENCY_LIMIT = "stormguard.concurrency.limit"
CALL_QUEUED = "stormguard.queue_time_s"
RETRY_STOP_REASON = "stormguard.retry.stop_reason"
BUDGET_CALLS = "stormguard.budget.calls"
BUDGET_RETRIES = "stormguard.budget.retries"
BUDGET_AVAILABLE = "stormguard.budget.available"
BUDGET_REFUSED = "stormguard.budget.refused"
BREAKER_NAME = "stormguard.breaker.name"
BREAKER_STATE = "stormguard.breaker.state"
BREAKER_FROM_STATE = "stormguard.breaker.from_state"
BREAKER_REASON = "stormguard.breaker.reason"
BREAKER_OPEN_FOR = "stormguard.breaker.open_for_s"
BREAKER_RETRY_IN = "stormguard.breaker.retry_in_s"
ATTEMPT_FAILOVER = "stormguard.attempt.failover"
#: The ``Deployment`` an attempt went to, and its tier (docs/providers.md); on the
#: call's span, those of its last attempt.
DEPLOYMENT = "stormguard.deployment"
TIER = "stormguard.tier"
#: ``hit`` or ``overflow``: whether an attempt went to its affinity key's home.
AFFINITY = "stormguard.affinity"
#: True on the span of an attempt that is a hedge (one more attempt of a slow call,
#: to another endpoint); on a call's span, ``won`` or ``lost``: a hedge was sent,
#: and its answer is the call's, or the call's own attempt answered first.
HEDGE = "stormguard.hedge"
HEDGE_OUTCOME = "stormguard.hedge.outcome"
ENDPOINT_STATUS = "stormguard.endpoint.status"
ENDPOINT_FROM_STATUS = "stormguard.endpoint.from_status"
ENDPOINT_REASON = "stormguard.endpoint.reason"
ENDPOINT_EJECTED_FOR = "stormguard.endpoint.ejected_for_s"
#: The DNS name (``host:port``) a discovered endpoint came from.
DISCOVERY_NAME = "stormguard.discovery.name"
TOKENS_PROMPT = "stormguard.tokens.prompt"
TOKENS_MAX = "stormguard.tokens.max_tokens"
TOKENS_CONTEXT_WINDOW = "stormguard.tokens.context_window"
TOKENS_COUNTER = "stormguard.tokens.counter"
TOKENS_RATE_LIMIT_WAIT = "stormguard.tokens.rate_limit_wait_s"
FALLBACK_MODEL = "stormguard.fallback.model"
FALLBACK_FROM = "stormguard.fallback.from_model"
FALLBACK_REASON = "stormguard.fallback.reason"
#: Why the call moved to another model: unavailable, context_window, content_policy.
FALLBACK_KIND = "stormguard.fallback.kind"
DEGRADED = "stormguard.degraded"
CANCELLED = "stormguard.cancelled"
CALL_OUTCOME = "stormguard.call.outcome"
THROTTLE_PROBABILITY = "stormguard.throttle.probability"
# A key's quota (docs/quotas.md): the wait for it, per attempt and per call; the
# process's share of the key and what the key had left when the attempt went out.
ATTEMPT_QUOTA_WAIT = "stormguard.attempt.quota_wait_s"
QUOTA_WAIT = "stormguard.quota.wait_s"
QUOTA_PACED_429S = "stormguard.quota.paced_429s"
QUOTA_SHARE = "stormguard.quota.share"
QUOTA_REMAINING_TOKENS = "stormguard.quota.remaining_tokens"
QUOTA_REMAINING_REQUESTS = "stormguard.quota.remaining_requests"
# The load headers an attempt received (docs/protocol.md).
LOAD_QUEUE_DEPTH = "stormguard.server.queue_depth"
LOAD_QUEUE_TOKENS = "stormguard.server.queue_tokens"
LOAD_INFLIGHT_TOKENS = "stormguard.server.inflight_tokens"
LOAD_TOKEN_CAPACITY = "stormguard.server.token_capacity"
LOAD_KV_CACHE_USAGE = "stormguard.server.kv_cache_usage"
LOAD_RETRY_AFTER = "stormguard.server.retry_after_s"
LOAD_SHOULD_RETRY = "stormguard.server.should_retry"
LOAD_SHED = "stormguard.server.load_shed"

# -- span events ---------------------------------------------------------------------
EVENT_BREAKER_TRANSITION = "stormguard.breaker.transition"
EVENT_ENDPOINT_TRANSITION = "stormguard.endpoint.transition"
EVENT_BUDGET_REFUSED = "stormguard.budget.refused"
EVENT_FALLBACK = "stormguard.fallback"

# -- metrics -------------------------------------------------------------------------
METRIC_OPERATION_DURATION = "gen_ai.client.operation.duration"
METRIC_TOKEN_USAGE = "gen_ai.client.token.usage"
METRIC_TIME_TO_FIRST_CHUNK = "gen_ai.client.operation.time_to_first_chunk"
METRIC_CALLS = "stormguard.client.calls"
METRIC_ATTEMPTS = "stormguard.client.attempts"
METRIC_BUDGET_REFUSALS = "stormguard.client.budget.refusals"
METRIC_BREAKER_TRANSITIONS = "stormguard.client.breaker.transitions"
METRIC_BREAKER_STATE = "stormguard.client.breaker.state"
METRIC_ENDPOINT_TRANSITIONS = "stormguard.client.endpoint.transitions"
METRIC_ENDPOINT_STATUS = "stormguard.client.endpoint.status"
METRIC_DISCOVERY_CHANGES = "stormguard.client.discovery.changes"
METRIC_DISCOVERY_ENDPOINTS = "stormguard.client.discovery.endpoints"
METRIC_QUEUE_DURATION = "stormguard.client.queue.duration"
METRIC_CONCURRENCY_LIMIT = "stormguard.client.concurrency.limit"
METRIC_QUOTA_WAIT = "stormguard.client.quota.wait.duration"
METRIC_QUOTA_PACED_429S = "stormguard.client.quota.paced_429s"

# Explicit bucket boundaries the GenAI metric conventions (v1.41.0) give.
DURATION_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
TOKEN_BUCKETS = (
    1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864,
)  # fmt: skip
