"""A hosted API's quota per API key, as OpenAI enforces it: off unless a limit is set.

Most people call a hosted API (OpenAI, Azure OpenAI, a LiteLLM proxy) that limits each
key in requests per minute (RPM) and tokens per minute (TPM); this lets a laptop show
a client that quota. Each limit is a bucket that refills continuously: its capacity
is the per-minute limit and it refills at limit / 60 per second, so a key that has
been idle for a minute may send a whole minute's worth at once and then one
request's worth as each refills. OpenAI's own messages fit this model to the
millisecond: "Limit 30000, Used 29937, Requested 385. Please try again in 644ms" is
the 322 tokens missing at 500 tokens a second.

A request is charged when it arrives, before admission and the engine: one request,
and its prompt tokens plus ``max_tokens`` (or ``max_completion_tokens``; the
``default_max_tokens`` estimate when it sends neither); embeddings their input
tokens. Nothing is given back when the answer uses fewer tokens, or fails: OpenAI
charges ``max_tokens`` at admission and does not refund. A refused request takes
nothing. A daily token limit, when set, counts the tokens charged in a day that starts
at the key's first charged request; past it the key gets ``insufficient_quota``.

Keys are kept by a short hash (``key_label``), never as sent, in a table of at most
``max_keys``: the key used least recently is dropped for a new one. A dropped key
comes back with full buckets and a new day, which forgives nothing per minute unless
more than ``max_keys`` keys were busy within the last minute (an idle key's buckets
are full after one); a daily limit is kept only for the keys still tracked.

Time is read from the injected clock only, so tests never sleep.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Literal

from stormguard_server.clock import ClockLike, as_clock
from stormguard_server.config import QuotaConfig

__all__ = [
    "ANONYMOUS",
    "MAX_LIMIT",
    "Bucket",
    "KeyCounts",
    "Quota",
    "QuotaRefusal",
    "RefusalReason",
    "check_limit",
    "go_duration",
    "key_label",
]

#: The label of requests that send no key: they share one quota.
ANONYMOUS = "anonymous"
#: The largest limit taken (per minute or per day): far above any provider's, and small
#: enough that a one-token charge still moves a float bucket (exact below 2**53).
MAX_LIMIT = 10**12
#: The largest ``default_max_tokens``: the largest ``max_tokens`` a request may send.
MAX_DEFAULT_MAX_TOKENS = 10**9

_MINUTE_S = 60.0
_DAY_S = 86_400.0
# A wait shorter than this counts as none: the waits told are rounded to the
# millisecond, give or take a nanosecond of float error, and a client that waited
# what it was told must find the room it was told of.
_SLACK_S = 1e-6
# Hex digits of the key's SHA-256 in its label: 48 bits, no collision among 1,024 keys
# but once in 10**8 tables.
_LABEL_HEX = 12

#: Why a request was refused: its ``error.type`` (OpenAI's ``requests``, ``tokens`` and
#: ``insufficient_quota``), or ``too_large`` for a request over the TPM limit itself.
RefusalReason = Literal["requests", "tokens", "too_large", "insufficient_quota"]
REFUSAL_REASONS: tuple[RefusalReason, ...] = (
    "requests",
    "tokens",
    "too_large",
    "insufficient_quota",
)


def check_limit(value: int, *, low: int = 1, high: int = MAX_LIMIT) -> int:
    """``value`` if it is a whole number within ``low..high``, else ValueError saying so.

    >>> check_limit(60000)
    60000
    >>> check_limit(0)
    Traceback (most recent call last):
    ValueError: must be within 1..1000000000000, got 0
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"must be a whole number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"must be within {low}..{high}, got {value}")
    return value


def key_label(headers: Mapping[str, str]) -> str:
    """The key a request is charged to, as a label safe to show: the first 12 hex digits
    of the SHA-256 of its bearer token (``Authorization: Bearer KEY``), else of Azure's
    ``api-key`` header; ``anonymous`` when it sends neither. An ``Authorization`` of
    another scheme counts whole, as the key.

    >>> key_label({"authorization": "Bearer sk-test"}) == key_label({"api-key": "sk-test"})
    True
    >>> key_label({}), key_label({"authorization": "Bearer  "})
    ('anonymous', 'anonymous')
    """
    secret = headers.get("authorization", "").strip()
    scheme, _, rest = secret.partition(" ")
    if scheme.lower() == "bearer":
        secret = rest.strip()
    if not secret:
        secret = headers.get("api-key", "").strip()
    if not secret:
        return ANONYMOUS
    digest = hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()
    return digest[:_LABEL_HEX]


def go_duration(seconds: float) -> str:
    """``seconds`` as Go's ``time.Duration`` prints it, rounded up to the millisecond, as
    OpenAI writes ``x-ratelimit-reset-*`` and "Please try again in ...". Rounded up, so
    a client that waits that long finds what it was told.

    >>> [go_duration(s) for s in (0, 0.0004, 0.02, 0.644, 1, 1.5, 60, 360, 3723.5)]
    ['0s', '1ms', '20ms', '644ms', '1s', '1.5s', '1m0s', '6m0s', '1h2m3.5s']
    """
    if not seconds > 0:  # NaN too
        return "0s"
    # Forgive a nanosecond of float error (0.001 * 1000 is 1.0000000000000002).
    ms = math.ceil(seconds * 1000 - 1e-6)
    if ms < 1000:
        return f"{max(ms, 1)}ms"
    hours, rest = divmod(ms, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    whole, millis = divmod(rest, 1000)
    secs = f"{whole}.{millis:03d}".rstrip("0") if millis else str(whole)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


@dataclass
class Bucket:
    """A bucket that refills continuously: ``capacity`` units, refilled at
    ``capacity / period_s`` per second. Full when made.

    >>> bucket = Bucket.full(60, now=0.0)
    >>> bucket.take(60, now=0.0); bucket.wait_for(1, now=0.0), bucket.reset_in(now=30.0)
    (1.0, 30.0)
    """

    capacity: float
    level: float
    at: float
    period_s: float = _MINUTE_S

    @classmethod
    def full(cls, capacity: float, now: float) -> Bucket:
        """A full bucket of ``capacity`` units, refilled over a minute."""
        return cls(capacity=capacity, level=capacity, at=now)

    @property
    def rate(self) -> float:
        """Units refilled per second."""
        return self.capacity / self.period_s

    def level_at(self, now: float) -> float:
        """Units in the bucket at ``now``."""
        return min(self.capacity, self.level + max(0.0, now - self.at) * self.rate)

    def wait_for(self, amount: float, now: float) -> float:
        """Seconds until ``amount`` units are in the bucket (0: now)."""
        return max(0.0, amount - self.level_at(now)) / self.rate

    def reset_in(self, now: float) -> float:
        """Seconds until the bucket is full again."""
        return (self.capacity - self.level_at(now)) / self.rate

    def take(self, amount: float, now: float) -> None:
        """Take ``amount`` units (the caller has checked that they are there)."""
        self.level = self.level_at(now) - amount
        self.at = max(self.at, now)


@dataclass
class _Day:
    """Tokens charged in the day that started at ``start``."""

    limit: int
    start: float
    used: int = 0

    def used_now(self, now: float) -> int:
        """Tokens charged today (a new day, from 0, once a whole one has passed)."""
        if now - self.start >= _DAY_S:
            self.start, self.used = now, 0
        return self.used


@dataclass
class KeyCounts:
    """What one key was charged and refused, for ``/metrics``."""

    admitted: int = 0
    tokens_charged: int = 0
    refused: dict[RefusalReason, int] = field(default_factory=dict)


@dataclass
class _KeyQuota:
    requests: Bucket | None
    tokens: Bucket | None
    day: _Day | None
    counts: KeyCounts = field(default_factory=KeyCounts)


@dataclass(frozen=True, slots=True)
class QuotaRefusal:
    """A request refused by its key's quota, with the numbers OpenAI's message quotes:
    ``limit``, ``used`` (limit minus what is left, whole), ``requested``, and the wait
    until it fits (None when waiting cannot help: too large, or out of quota)."""

    reason: RefusalReason
    limit: int
    used: int
    requested: int
    retry_after_s: float | None


class Quota:
    """Every key's buckets and counts, for ``config``'s limits, on ``clock``."""

    def __init__(self, config: QuotaConfig, *, clock: ClockLike | None = None) -> None:
        for name in ("tokens_per_minute", "requests_per_minute", "tokens_per_day"):
            value = getattr(config, name)
            if value is not None:
                try:
                    check_limit(value)
                except ValueError as exc:
                    raise ValueError(f"quota {name} {exc}") from None
        try:
            check_limit(config.default_max_tokens, low=0, high=MAX_DEFAULT_MAX_TOKENS)
            check_limit(config.max_keys)
        except ValueError as exc:
            raise ValueError(f"quota setting {exc}") from None
        self.config = config
        self._clock = as_clock(clock)
        self._keys: OrderedDict[str, _KeyQuota] = OrderedDict()
        #: Every keyed request is refused with ``insufficient_quota`` while set (a flag,
        #: or the admin endpoint).
        self.insufficient_quota = config.insufficient_quota
        #: Keys dropped from the table to make room.
        self.evicted = 0

    # -- the charge -------------------------------------------------------

    def charge(self, key: str, tokens: int) -> QuotaRefusal | None:
        """Charge one request of ``tokens`` to ``key`` (a ``key_label``); None when it
        fits, else why not (and nothing is taken)."""
        now = self._clock.now()
        entry = self._entry(key, now)
        refusal = self._refusal(entry, tokens, now)
        if refusal is not None:
            refused = entry.counts.refused
            refused[refusal.reason] = refused.get(refusal.reason, 0) + 1
            return refusal
        if entry.requests is not None:
            entry.requests.take(1, now)
        if entry.tokens is not None:
            entry.tokens.take(tokens, now)
        if entry.day is not None:
            entry.day.used += tokens
        entry.counts.admitted += 1
        entry.counts.tokens_charged += tokens
        return None

    def _refusal(self, entry: _KeyQuota, tokens: int, now: float) -> QuotaRefusal | None:
        if self.insufficient_quota:
            return QuotaRefusal("insufficient_quota", 0, 0, tokens, None)
        if entry.day is not None:
            used = entry.day.used_now(now)
            if used + tokens > entry.day.limit:
                return QuotaRefusal("insufficient_quota", entry.day.limit, used, tokens, None)
        if entry.tokens is not None and tokens > entry.tokens.capacity:
            limit = int(entry.tokens.capacity)
            return QuotaRefusal("too_large", limit, 0, tokens, None)
        # Over both limits: the one that frees up last is the one to wait for.
        worst: QuotaRefusal | None = None
        checks: tuple[tuple[RefusalReason, Bucket | None, int], ...] = (
            ("requests", entry.requests, 1),
            ("tokens", entry.tokens, tokens),
        )
        for reason, bucket, amount in checks:
            if bucket is None:
                continue
            wait = bucket.wait_for(amount, now)
            if wait > _SLACK_S and (worst is None or wait > (worst.retry_after_s or 0.0)):
                limit = int(bucket.capacity)
                used = limit - max(0, math.floor(bucket.level_at(now)))
                worst = QuotaRefusal(reason, limit, used, amount, wait)
        return worst

    # -- the headers ------------------------------------------------------

    def rate_limit_headers(self, key: str) -> dict[str, str]:
        """OpenAI's ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` for ``key``
        now (the reset: until the bucket is full again, as a Go duration); a pair only
        for a limit that is set; none when headers are switched off. Reading a key adds
        nothing to the table: one not in it has full buckets."""
        if not self.config.headers:
            return {}
        now = self._clock.now()
        entry = self._keys.get(key)
        headers: dict[str, str] = {}
        for kind, limit, bucket in (
            ("requests", self.config.requests_per_minute, entry.requests if entry else None),
            ("tokens", self.config.tokens_per_minute, entry.tokens if entry else None),
        ):
            if limit is None:
                continue
            remaining = limit if bucket is None else max(0, math.floor(bucket.level_at(now)))
            reset = 0.0 if bucket is None else bucket.reset_in(now)
            headers[f"x-ratelimit-limit-{kind}"] = str(limit)
            headers[f"x-ratelimit-remaining-{kind}"] = str(remaining)
            headers[f"x-ratelimit-reset-{kind}"] = go_duration(reset)
        return headers

    # -- the table --------------------------------------------------------

    def counts(self) -> Iterator[tuple[str, KeyCounts]]:
        """Each tracked key's label and counts, least recently used first."""
        for key, entry in list(self._keys.items()):
            yield key, entry.counts

    def __len__(self) -> int:
        return len(self._keys)

    def _entry(self, key: str, now: float) -> _KeyQuota:
        entry = self._keys.get(key)
        if entry is not None:
            self._keys.move_to_end(key)
            return entry
        config = self.config
        entry = _KeyQuota(
            requests=_bucket(config.requests_per_minute, now),
            tokens=_bucket(config.tokens_per_minute, now),
            day=None if config.tokens_per_day is None else _Day(config.tokens_per_day, now),
        )
        self._keys[key] = entry
        while len(self._keys) > config.max_keys:
            self._keys.popitem(last=False)
            self.evicted += 1
        return entry


def _bucket(limit: int | None, now: float) -> Bucket | None:
    return None if limit is None else Bucket.full(float(limit), now)
