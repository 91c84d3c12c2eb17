"""The quota (buckets.py) on the wire: OpenAI's 429s, its ``x-ratelimit-*`` headers on
every response of a keyed route, and the per-key counts in ``/metrics``.

The 429's body is the one OpenAI sends, word for word but for the organization
(``org-`` and the key's label, never the key):

- over a rate: ``type`` ``requests`` or ``tokens``, ``code`` ``rate_limit_exceeded``,
  "Rate limit reached for MODEL in organization ORG on tokens per min (TPM): Limit
  30000, Used 29937, Requested 385. Please try again in 644ms. ...", and the wait in
  the Retry-After header the server was told to send (or none);
- a request larger than the TPM limit itself: "Request too large for ...", no
  Retry-After (waiting cannot help);
- out of quota: ``type`` and ``code`` ``insufficient_quota``, "You exceeded your
  current quota, ...", no Retry-After (OpenAI's clients must not retry it).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stormguard_server.config import RetryAfterMode
from stormguard_server.http.json_response import JSONResponse
from stormguard_server.quota.buckets import (
    REFUSAL_REASONS,
    Quota,
    QuotaRefusal,
    go_duration,
    key_label,
)
from stormguard_server.telemetry.metrics import PREFIX

__all__ = ["KEYED_ROUTES", "QuotaCollector", "QuotaHeadersMiddleware", "quota_refusal_response"]

#: The routes a hosted API charges: every other (``/v1/models``, ``/health``,
#: ``/ready``, ``/metrics``, ``/tokenize``) is free and carries no quota headers.
KEYED_ROUTES = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}
)

_LIMITS_URL = "https://platform.openai.com/account/rate-limits"
_ERRORS_URL = "https://platform.openai.com/docs/guides/error-codes/api-errors"
_PER_MIN = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}


def quota_message(refusal: QuotaRefusal, *, model: str, key: str) -> str:
    """OpenAI's message for ``refusal`` of a request for ``model`` by ``key`` (a label).

    >>> from stormguard_server.quota.buckets import QuotaRefusal
    >>> quota_message(QuotaRefusal("tokens", 30000, 29937, 385, 0.644), model="m", key="k")
    ... # doctest: +NORMALIZE_WHITESPACE
    'Rate limit reached for m in organization org-k on tokens per min (TPM): Limit 30000,
    Used 29937, Requested 385. Please try again in 644ms. Visit
    https://platform.openai.com/account/rate-limits to learn more.'
    """
    org = f"org-{key}"
    if refusal.reason == "insufficient_quota":
        return (
            "You exceeded your current quota, please check your plan and billing details. "
            f"For more information on this error, read the docs: {_ERRORS_URL}."
        )
    if refusal.reason == "too_large":
        return (
            f"Request too large for {model} in organization {org} on {_PER_MIN['tokens']}: "
            f"Limit {refusal.limit}, Requested {refusal.requested}. The input or output "
            f"tokens must be reduced in order to run successfully. Visit {_LIMITS_URL} to "
            "learn more."
        )
    return (
        f"Rate limit reached for {model} in organization {org} on {_PER_MIN[refusal.reason]}: "
        f"Limit {refusal.limit}, Used {refusal.used}, Requested {refusal.requested}. "
        f"Please try again in {go_duration(refusal.retry_after_s or 0.0)}. "
        f"Visit {_LIMITS_URL} to learn more."
    )


def retry_after_headers(seconds: float | None, mode: RetryAfterMode) -> dict[str, str]:
    """The one header ``mode`` names for a wait of ``seconds``, rounded up (to whole
    seconds, as OpenAI's ``retry-after``, or to milliseconds); none without a wait.

    >>> retry_after_headers(1.2, "seconds"), retry_after_headers(1.2, "azure")
    ({'retry-after': '2'}, {'x-ms-retry-after-ms': '1200'})
    """
    if seconds is None or mode == "none":
        return {}
    ms = max(1, math.ceil(seconds * 1000 - 1e-6))
    if mode == "seconds":
        return {"retry-after": str(math.ceil(ms / 1000))}
    return {"retry-after-ms" if mode == "ms" else "x-ms-retry-after-ms": str(ms)}


def quota_refusal_response(
    quota: Quota, refusal: QuotaRefusal, *, model: str, key: str
) -> JSONResponse:
    """The 429 for ``refusal``: OpenAI's body, and the Retry-After of the quota's mode.
    The ``x-ratelimit-*`` headers are added by ``QuotaHeadersMiddleware``, as on any
    answer of a keyed route."""
    out_of_quota = refusal.reason == "insufficient_quota"
    body = {
        "error": {
            "message": quota_message(refusal, model=model, key=key),
            "type": "tokens" if refusal.reason == "too_large" else refusal.reason,
            "param": None,
            "code": "insufficient_quota" if out_of_quota else "rate_limit_exceeded",
        }
    }
    headers = retry_after_headers(refusal.retry_after_s, quota.config.retry_after)
    return JSONResponse(body, status_code=429, headers=headers)


class QuotaHeadersMiddleware:
    """Adds the caller's ``x-ratelimit-*`` headers (``Quota.rate_limit_headers``, read when
    the answer starts) to every answer of a keyed route: successes, 429s, 400s, sheds."""

    def __init__(self, app: ASGIApp, quota: Quota) -> None:
        self.app = app
        self.quota = quota

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") not in KEYED_ROUTES:
            await self.app(scope, receive, send)
            return
        key = key_label(Headers(scope=scope))

        async def send_with_quota(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = self.quota.rate_limit_headers(key)
                if extra:
                    raw = list(message.get("headers", []))
                    raw += [(name.encode(), value.encode()) for name, value in extra.items()]
                    message["headers"] = raw
            await send(message)

        await self.app(scope, receive, send_with_quota)


class QuotaCollector(Collector):
    """The quota's counts, read at scrape time: per tracked key (labelled by its hash,
    never the key) and the table's size and evictions."""

    def __init__(self, quota: Quota) -> None:
        self.quota = quota

    def collect(self) -> Iterator[Metric]:
        quota = self.quota
        yield GaugeMetricFamily(
            f"{PREFIX}_quota_keys", "API keys whose quota is tracked.", value=len(quota)
        )
        yield _counter("quota_keys_evicted", "Keys dropped to make room.", quota.evicted)
        admitted = CounterMetricFamily(
            f"{PREFIX}_quota_admitted", "Requests charged to a key's quota.", labels=["key"]
        )
        tokens = CounterMetricFamily(
            f"{PREFIX}_quota_tokens_charged", "Tokens charged to a key's quota.", labels=["key"]
        )
        refused = CounterMetricFamily(
            f"{PREFIX}_quota_refused",
            "Requests a key's quota refused (429), by reason.",
            labels=["key", "reason"],
        )
        for key, counts in quota.counts():
            admitted.add_metric([key], counts.admitted)
            tokens.add_metric([key], counts.tokens_charged)
            for reason in REFUSAL_REASONS:
                if reason in counts.refused:
                    refused.add_metric([key, reason], counts.refused[reason])
        yield admitted
        yield tokens
        yield refused


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    family = CounterMetricFamily(f"{PREFIX}_{name}", doc)
    family.add_metric([], value)
    return family
