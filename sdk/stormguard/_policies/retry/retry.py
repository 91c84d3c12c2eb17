"""Which failures are worth another attempt, and how long to wait before it.

Defaults, and the reasons for them (docs/retries.md has the long version):

* ``max_attempts=3``: one try and two retries, openai-python's default. More
  attempts only help against faults shorter than the backoff; an outage longer
  than that is what the retry budget and the breaker are for.
* Full jitter, ``uniform(0, min(max_delay, base_delay * 2**(n-1)))``: of the
  schemes in AWS's "Exponential Backoff and Jitter" study, full jitter spread
  retries best and did the least total work; decorrelated jitter was close but
  needs state between attempts. Spreading matters more than the mean here: a
  crash fails every in-flight request at the same instant.
* ``base_delay=0.5``, ``max_delay=8``: openai-python's bounds, so porting keeps
  the timing users already know.
* ``Retry-After`` is the server's own estimate of when capacity returns (the
  reference server computes it from the work running and queued) and beats our
  guess; it is clamped to ``max_retry_after`` (60 s, as openai-python) so a server cannot
  park a caller for an hour. Negative, malformed and absurd (over a day)
  values are ignored by ``stormguard.protocol`` and the jittered backoff applies.
* A 429 without Retry-After whose ``x-ratelimit-remaining-*`` is 0 waits for
  that limit's ``x-ratelimit-reset-*`` (the later one when both are spent):
  openai-python ignores these headers and backs off 0.5-8 s, which a spent
  minute's quota refuses again; the same clamp and deadline apply.
* A 429 whose error ``code`` or ``type`` is ``insufficient_quota`` is not
  retried (``verdict.is_out_of_quota``): the account is out of credit, and no
  wait of seconds brings it back; OpenAI says so in the body of an ordinary 429.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ..._core.exceptions import RateLimitError
from ..._core.stop_reason import StopReason
from ..._core.verdict import TRANSIENT_STATUSES, classify

__all__ = ["DEFAULT_RETRY_STATUSES", "RetryDecision", "RetryPolicy"]

#: The retryable statuses by default: the transient ones (``_core/verdict.py``).
DEFAULT_RETRY_STATUSES = TRANSIENT_STATUSES


@dataclass(frozen=True, slots=True)
class RetryDecision:
    """Whether to retry after a failed attempt; ``reason`` names why not."""

    retry: bool
    reason: StopReason | None = None


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How one logical call retries.

    >>> RetryPolicy(max_attempts=5, max_delay=20.0).max_attempts
    5
    >>> RetryPolicy(max_attempts=1).max_attempts  # never retry
    1
    """

    max_attempts: int = 3
    base_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0
    retry_statuses: frozenset[int] = field(default=DEFAULT_RETRY_STATUSES)

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        for name in ("base_delay", "max_delay", "max_retry_after"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if self.base_delay > self.max_delay:
            raise ValueError("base_delay must not exceed max_delay")
        object.__setattr__(self, "retry_statuses", frozenset(self.retry_statuses))

    def backoff(self, retry_number: int, rng: random.Random) -> float:
        """Full-jitter delay before retry ``retry_number`` (1 for the first retry)."""
        ceiling = min(self.max_delay, self.base_delay * 2.0 ** min(retry_number - 1, 62))
        return rng.uniform(0.0, ceiling)

    def delay(self, error: BaseException, retry_number: int, rng: random.Random) -> float:
        """The wait before the next attempt: the server's Retry-After when it sent a
        usable one, else for a 429 the reset of the exhausted ``x-ratelimit-*`` limit
        (both clamped to ``max_retry_after``), else the jittered backoff."""
        load = getattr(error, "server_load", None)
        retry_after = getattr(load, "retry_after", None)
        if retry_after is None and isinstance(error, RateLimitError):
            retry_after = error.rate_limit.exhausted_reset()
        if retry_after is not None:
            return min(float(retry_after), self.max_retry_after)
        return self.backoff(retry_number, rng)

    def decide(self, error: BaseException) -> RetryDecision:
        """Whether the failure of one attempt is worth another attempt: the retry
        part of its ``Verdict`` (``verdict.classify``, where the rule lives)."""
        verdict = classify(error, self)
        return RetryDecision(verdict.retry, verdict.stop)
