"""The stormguard wire protocol: header names, and how each value is read and written.

This module is where the SDK and the reference server meet (the server imports
it, and of the SDK besides only ``stormguard.__version__`` and
``stormguard.telemetry.configure_otlp``; nothing here imports the server). docs/protocol.md is the
prose version. Every parser is a pure function that returns ``None`` for a
missing, malformed or absurd value: a header is advice from the server, and bad
advice must never turn into an exception in the caller's code.
"""

from __future__ import annotations

import datetime
import email.utils
import enum
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, fields

__all__ = [
    "ABSURD_RETRY_AFTER_S",
    "HEADER_ATTEMPT",
    "HEADER_DEADLINE_MS",
    "HEADER_ENDPOINT_LOAD_METRICS",
    "HEADER_ENDPOINT_LOAD_METRICS_FORMAT",
    "HEADER_INFLIGHT_TOKENS",
    "HEADER_KV_CACHE_USAGE",
    "HEADER_LOAD_SHED",
    "HEADER_MS_RETRY_AFTER_MS",
    "HEADER_PRIORITY",
    "HEADER_QUEUE_DEPTH",
    "HEADER_QUEUE_TOKENS",
    "HEADER_REQUEST_ID",
    "HEADER_REQUEUE",
    "HEADER_RETRY_AFTER",
    "HEADER_RETRY_AFTER_MS",
    "HEADER_SHOULD_RETRY",
    "HEADER_STAINLESS_RETRY_COUNT",
    "HEADER_TOKEN_CAPACITY",
    "LOAD_HEADERS",
    "Priority",
    "ServerLoad",
    "ShedReason",
    "format_retry_after",
    "parse_attempt",
    "parse_bool",
    "parse_deadline_ms",
    "parse_endpoint_load_metrics",
    "parse_fraction",
    "parse_non_negative_int",
    "parse_priority",
    "parse_retry_after",
]

# Client -> server.
HEADER_ATTEMPT = "x-stormguard-attempt"
# Times this attempt's call was shed before processing and sent again (requeued);
# a requeue keeps its attempt number: the server never worked on the call.
HEADER_REQUEUE = "x-stormguard-requeue"
HEADER_STAINLESS_RETRY_COUNT = "x-stainless-retry-count"  # openai-python's own retry counter
HEADER_DEADLINE_MS = "x-request-deadline-ms"
HEADER_PRIORITY = "x-priority"

# Server -> client, on every response.
HEADER_QUEUE_DEPTH = "x-queue-depth"
HEADER_QUEUE_TOKENS = "x-queue-tokens"
HEADER_INFLIGHT_TOKENS = "x-inflight-tokens"
HEADER_TOKEN_CAPACITY = "x-token-capacity"
HEADER_KV_CACHE_USAGE = "x-kv-cache-usage"
HEADER_RETRY_AFTER = "retry-after"
HEADER_RETRY_AFTER_MS = "retry-after-ms"
#: Azure OpenAI's name for ``retry-after-ms`` on a 429.
HEADER_MS_RETRY_AFTER_MS = "x-ms-retry-after-ms"
HEADER_SHOULD_RETRY = "x-should-retry"
HEADER_LOAD_SHED = "x-load-shed"
HEADER_REQUEST_ID = "x-request-id"
# HTTP's own: when the response was made, on the server's clock (Retry-After dates).
_HEADER_DATE = "date"

# Plain vLLM (no stormguard middleware) reports its load in ORCA's format when a
# request asks for it: ``endpoint-load-metrics-format: TEXT`` gets
# ``endpoint-load-metrics: TEXT named_metrics.kv_cache_usage_perc=0.4, ...``.
HEADER_ENDPOINT_LOAD_METRICS = "endpoint-load-metrics"
HEADER_ENDPOINT_LOAD_METRICS_FORMAT = "endpoint-load-metrics-format"

LOAD_HEADERS = (
    HEADER_QUEUE_DEPTH,
    HEADER_QUEUE_TOKENS,
    HEADER_INFLIGHT_TOKENS,
    HEADER_TOKEN_CAPACITY,
    HEADER_KV_CACHE_USAGE,
)

# A Retry-After beyond one day is not advice a client can act on (a date in
# another year, 1e308): parsers report it as absent, so the caller falls back
# to its own backoff instead of sleeping for it or overflowing a timer.
ABSURD_RETRY_AFTER_S = 86_400.0

# Attempt numbers and deadlines beyond these are treated as garbage.
_MAX_ATTEMPT = 1_000_000
_MAX_DEADLINE_MS = 7 * 86_400_000


class Priority(str, enum.Enum):
    """Value of ``x-priority``; the server sheds ``sheddable`` first and ``critical`` last."""

    CRITICAL = "critical"
    STANDARD = "standard"
    SHEDDABLE = "sheddable"

    @property
    def rank(self) -> int:
        """0 for the most important: lower ranks are served and kept first."""
        return _PRIORITY_RANK[self]


_PRIORITY_RANK = {Priority.CRITICAL: 0, Priority.STANDARD: 1, Priority.SHEDDABLE: 2}


class ShedReason(str, enum.Enum):
    """Value of ``x-load-shed``: why the server refused a request."""

    QUEUE_FULL = "queue_full"
    TOKEN_BUDGET = "token_budget"
    DEADLINE = "deadline"
    WARMING = "warming"
    DRAINING = "draining"
    ENGINE_RESTART = "engine_restart"
    RETRY_SHED = "retry_shed"
    TOO_LONG = "too_long"


def _get(headers: Mapping[str, str], name: str) -> str | None:
    value = headers.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


def parse_non_negative_int(value: str | None) -> int | None:
    """``"12"`` -> 12; negative, fractional, huge or non-numeric -> None."""
    if value is None:
        return None
    value = value.strip()
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        return None
    return int(value)


def parse_fraction(value: str | None) -> float | None:
    """A float in [0, 1] (KV-cache usage); anything else -> None."""
    number = _parse_finite_float(value)
    if number is None or not 0.0 <= number <= 1.0:
        return None
    return number


def parse_bool(value: str | None) -> bool | None:
    """``true``/``false`` in any case; anything else -> None."""
    if value is None:
        return None
    lowered = value.strip().lower()
    if lowered == "true":
        return True
    if lowered == "false":
        return False
    return None


def _parse_finite_float(value: str | None) -> float | None:
    if value is None or len(value) > 64:
        return None
    try:
        number = float(value.strip())
    except ValueError:
        return None
    if not math.isfinite(number):
        return None
    return number


def _http_date(value: str) -> float | None:
    """An HTTP-date as a POSIX timestamp (a date without a zone is UTC, as in
    openai-python); None when it is not one."""
    try:
        moment = email.utils.parsedate_to_datetime(value)
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.timezone.utc)
        return moment.timestamp()
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None


def _parse_seconds(value: str, now: float, sent: str | None) -> float | None:
    """A Retry-After value: delta-seconds (RFC 9110 allows only digits; we also take
    decimals, as several servers send them) or an HTTP-date. A date is read against
    the response's own ``Date`` when it has one (both are the server's clock, so a
    skewed client clock cancels out, as RFC 9111 reads ages against ``Date``), else
    against ``now``; one less than a second ahead, its resolution, is no wait."""
    number = _parse_finite_float(value)
    if number is None:
        moment = _http_date(value)
        if moment is None:
            return None
        origin = _http_date(sent) if sent is not None else None
        number = moment - (now if origin is None else origin)
        if number < 1.0:
            return None
    if not 0 < number <= ABSURD_RETRY_AFTER_S:
        return None
    return number


def parse_retry_after(headers: Mapping[str, str], *, now: float | None = None) -> float | None:
    """Seconds the server asks us to wait, from ``retry-after-ms`` (preferred, finer;
    Azure OpenAI also names it ``x-ms-retry-after-ms``) or ``retry-after`` (seconds
    or HTTP-date). None when absent, not a number,
    absurd (over a day), or no wait at all (zero, negative, a date in the past):
    then the caller's own jittered backoff applies, as openai-python's
    (``0 < retry_after <= 60``) and urllib3's (``if retry_after:``) do; a zero under
    clock skew would bring every skewed client back in the same instant. ``now``
    is the wall clock, for an HTTP-date without the response's ``Date``."""
    ms = _get(headers, HEADER_RETRY_AFTER_MS)
    if ms is None:
        ms = _get(headers, HEADER_MS_RETRY_AFTER_MS)
    if ms is not None:
        number = _parse_finite_float(ms)
        if number is not None and 0 < number <= ABSURD_RETRY_AFTER_S * 1000:
            return number / 1000.0
    seconds = _get(headers, HEADER_RETRY_AFTER)
    if seconds is None:
        return None
    wall = time.time() if now is None else now
    return _parse_seconds(seconds, wall, _get(headers, _HEADER_DATE))


def format_retry_after(seconds: float) -> dict[str, str]:
    """The two Retry-After headers for a wait of ``seconds``: whole seconds rounded
    up (at least 1, as RFC 9110 has no fractions) and exact milliseconds."""
    seconds = min(max(seconds, 0.0), ABSURD_RETRY_AFTER_S)
    return {
        HEADER_RETRY_AFTER: str(max(1, math.ceil(seconds))),
        HEADER_RETRY_AFTER_MS: str(max(1, math.ceil(seconds * 1000))),
    }


def parse_attempt(headers: Mapping[str, str]) -> int | None:
    """Attempt number of a request (1 = first try): ``x-stormguard-attempt``, else
    openai-python's ``x-stainless-retry-count`` + 1. None when neither is usable."""
    attempt = parse_non_negative_int(_get(headers, HEADER_ATTEMPT))
    if attempt is not None and 1 <= attempt <= _MAX_ATTEMPT:
        return attempt
    retries = parse_non_negative_int(_get(headers, HEADER_STAINLESS_RETRY_COUNT))
    if retries is not None and retries < _MAX_ATTEMPT:
        return retries + 1
    return None


def parse_deadline_ms(headers: Mapping[str, str]) -> float | None:
    """Milliseconds the caller will still wait (``x-request-deadline-ms``); None when
    absent or malformed. Zero is valid: the caller has already given up."""
    number = _parse_finite_float(_get(headers, HEADER_DEADLINE_MS))
    if number is None or number < 0 or number > _MAX_DEADLINE_MS:
        return None
    return number


_MAX_ORCA_HEADER = 4096
_MAX_ORCA_METRICS = 64


def parse_endpoint_load_metrics(value: str | None) -> dict[str, float]:
    """The named metrics of an ORCA ``endpoint-load-metrics`` header (TEXT or JSON
    form, as vLLM sends them); {} for anything malformed. Bounded: at most 64
    metrics from at most 4 KiB of header."""
    if not value or len(value) > _MAX_ORCA_HEADER:
        return {}
    kind, _, payload = value.strip().partition(" ")
    metrics: dict[str, float] = {}
    if kind.upper() == "TEXT":
        for item in payload.split(",")[:_MAX_ORCA_METRICS]:
            name, sep, raw = item.strip().partition("=")
            if not sep or not name.startswith("named_metrics."):
                continue
            number = _parse_finite_float(raw)
            if number is not None:
                metrics[name.removeprefix("named_metrics.")] = number
    elif kind.upper() == "JSON":
        try:
            report = json.loads(payload)
        except ValueError:
            return {}
        named = report.get("named_metrics") if isinstance(report, dict) else None
        if isinstance(named, dict):
            for name, raw in list(named.items())[:_MAX_ORCA_METRICS]:
                if isinstance(name, str) and isinstance(raw, (int, float)) and math.isfinite(raw):
                    metrics[name] = float(raw)
    return metrics


def parse_priority(headers: Mapping[str, str]) -> Priority:
    """``x-priority``; missing or unknown values mean ``standard``."""
    value = _get(headers, HEADER_PRIORITY)
    if value is None:
        return Priority.STANDARD
    try:
        return Priority(value.lower())
    except ValueError:
        return Priority.STANDARD


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """What a response said about the server's load; every field None when not sent.

    >>> ServerLoad.from_headers({"x-queue-depth": "3", "retry-after": "abc"})
    ServerLoad(queue_depth=3, queue_tokens=None, inflight_tokens=None, token_capacity=None, \
kv_cache_usage=None, retry_after=None, should_retry=None, load_shed=None)
    """

    queue_depth: int | None = None
    queue_tokens: int | None = None
    inflight_tokens: int | None = None
    token_capacity: int | None = None
    kv_cache_usage: float | None = None
    retry_after: float | None = None
    should_retry: bool | None = None
    load_shed: str | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], *, now: float | None = None) -> ServerLoad:
        """Parse the protocol's response headers; malformed values become None."""
        if not any(name in headers for name in _LOAD_HEADERS):
            return _NO_LOAD  # a server that reports nothing (most calls to a hosted API)
        shed = _get(headers, HEADER_LOAD_SHED)
        if shed is not None and (len(shed) > 64 or not shed.isascii()):
            shed = None
        queue_depth = parse_non_negative_int(_get(headers, HEADER_QUEUE_DEPTH))
        kv_usage = parse_fraction(_get(headers, HEADER_KV_CACHE_USAGE))
        if queue_depth is None or kv_usage is None:
            # Plain vLLM: its ORCA report fills in what the protocol headers left out.
            orca = parse_endpoint_load_metrics(_get(headers, HEADER_ENDPOINT_LOAD_METRICS))
            waiting = orca.get("num_requests_waiting")
            if queue_depth is None and waiting is not None and 0 <= waiting < 10**9:
                queue_depth = int(waiting)
            usage = orca.get("kv_cache_usage_perc")
            if kv_usage is None and usage is not None and 0.0 <= usage <= 1.0:
                kv_usage = usage
        return cls(
            queue_depth=queue_depth,
            queue_tokens=parse_non_negative_int(_get(headers, HEADER_QUEUE_TOKENS)),
            inflight_tokens=parse_non_negative_int(_get(headers, HEADER_INFLIGHT_TOKENS)),
            token_capacity=parse_non_negative_int(_get(headers, HEADER_TOKEN_CAPACITY)),
            kv_cache_usage=kv_usage,
            retry_after=parse_retry_after(headers, now=now),
            should_retry=parse_bool(_get(headers, HEADER_SHOULD_RETRY)),
            load_shed=shed.lower() if shed is not None else None,
        )

    def to_headers(self) -> dict[str, str]:
        """The headers that carry this load (the server's side of ``from_headers``)."""
        out: dict[str, str] = {}
        for name, value in (
            (HEADER_QUEUE_DEPTH, self.queue_depth),
            (HEADER_QUEUE_TOKENS, self.queue_tokens),
            (HEADER_INFLIGHT_TOKENS, self.inflight_tokens),
            (HEADER_TOKEN_CAPACITY, self.token_capacity),
        ):
            if value is not None:
                out[name] = str(int(value))
        if self.kv_cache_usage is not None:
            out[HEADER_KV_CACHE_USAGE] = f"{min(max(self.kv_cache_usage, 0.0), 1.0):.4f}"
        if self.retry_after is not None:
            out.update(format_retry_after(self.retry_after))
        if self.should_retry is not None:
            out[HEADER_SHOULD_RETRY] = "true" if self.should_retry else "false"
        if self.load_shed is not None:
            out[HEADER_LOAD_SHED] = self.load_shed
        return out

    @property
    def is_empty(self) -> bool:
        """True when the response carried none of the protocol's headers."""
        return all(getattr(self, f.name) is None for f in fields(self))


#: What a response that carries none of the load headers says (all None).
_NO_LOAD = ServerLoad()
#: The headers ``ServerLoad.from_headers`` reads.
_LOAD_HEADERS = (
    HEADER_LOAD_SHED,
    HEADER_QUEUE_DEPTH,
    HEADER_KV_CACHE_USAGE,
    HEADER_ENDPOINT_LOAD_METRICS,
    HEADER_QUEUE_TOKENS,
    HEADER_INFLIGHT_TOKENS,
    HEADER_TOKEN_CAPACITY,
    HEADER_RETRY_AFTER_MS,
    HEADER_MS_RETRY_AFTER_MS,
    HEADER_RETRY_AFTER,
    HEADER_SHOULD_RETRY,
)
