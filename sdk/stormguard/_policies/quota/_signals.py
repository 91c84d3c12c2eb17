"""What a response says about its key's quota: the ``x-ratelimit-*`` headers
(``RateLimit``, already parsed) and, on a 429, the refusal's message.

OpenAI's 429 names the limit that refused and its numbers: "Rate limit reached
for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29937,
Requested 385. Please try again in 644ms." (the reference server writes the same
text). Without headers that is the only word of the key's limit and level, so it
is read as a fallback for them; its "try again in" (a Go duration) is the wait
when no Retry-After header came. Azure writes "Please retry after 6 seconds". (Which
429s are a quota's, and which are too large to wait for, ``_core/verdict.py`` says.)
Every number is bounded as the headers' parsers bound theirs: a malformed or
absurd value is None, never an exception.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Literal

from ..._core.rate_limit_headers import RateLimit, parse_reset

__all__ = ["Dimension", "Reading", "Refusal", "readings", "refusal_of"]

Dimension = Literal["tokens", "requests"]

#: How much of a message is read (OpenAI's are ~250 characters).
_MAX_MESSAGE = 2000
_DIMENSION = re.compile(r"on (tokens|requests) per (?:min|minute)\b|\((TPM|RPM)\)")
_NUMBERS = re.compile(r"Limit (\d{1,15}), Used (\d{1,15}), Requested (\d{1,15})")
_TRY_AGAIN = re.compile(r"try again in ((?:\d{1,12}(?:\.\d{1,12})?(?:h|ms|m|s|us|µs|ns))+)")
_RETRY_AFTER = re.compile(r"retry after (\d{1,6}) seconds?")


@dataclass(frozen=True, slots=True)
class Reading:
    """One dimension's limit and what the key had left, checked."""

    dimension: Dimension
    limit: float
    remaining: float


@dataclass(frozen=True, slots=True)
class Refusal:
    """What a quota 429's message says (each field None when it did not say)."""

    #: The limit that refused (``tokens``, ``requests``).
    dimension: Dimension | None = None
    limit: int | None = None
    used: int | None = None
    requested: int | None = None
    #: Seconds until the request fits ("Please try again in 644ms").
    retry_in: float | None = None

    def reading(self) -> Reading | None:
        """The limit and remaining the message implies (limit - used), if sane."""
        if self.dimension is None or self.limit is None or self.used is None:
            return None
        return _checked(self.dimension, self.limit, self.limit - self.used)


def refusal_of(message: str | None) -> Refusal:
    """Read a quota 429's message (OpenAI's, Azure's); unknown text reads as empty."""
    if not message:
        return _NOTHING
    text = message[:_MAX_MESSAGE]
    dimension: Dimension | None = None
    found = _DIMENSION.search(text)
    if found is not None:
        word = found.group(1) or ("tokens" if found.group(2) == "TPM" else "requests")
        dimension = "tokens" if word == "tokens" else "requests"
    limit = used = requested = None
    numbers = _NUMBERS.search(text)
    if numbers is not None:
        limit, used, requested = (int(n) for n in numbers.groups())
    retry_in = None
    again = _TRY_AGAIN.search(text)
    if again is not None:
        retry_in = parse_reset(again.group(1))
    else:
        after = _RETRY_AFTER.search(text)
        if after is not None:
            retry_in = parse_reset(after.group(1))
    if dimension is None and limit is None and retry_in is None:
        return _NOTHING
    return Refusal(dimension, limit, used, requested, retry_in or None)


def readings(rate_limit: RateLimit) -> tuple[Reading | None, Reading | None]:
    """The tokens and the requests reading of a response's headers, each None when a
    value is missing or absurd: a limit of 0 (or not finite), a remaining over the
    limit. A bad header is ignored and the last good value kept."""
    return (
        _pair("tokens", rate_limit.limit_tokens, rate_limit.remaining_tokens),
        _pair("requests", rate_limit.limit_requests, rate_limit.remaining_requests),
    )


def _pair(dimension: Dimension, limit: int | None, remaining: int | None) -> Reading | None:
    if limit is None or remaining is None:
        return None
    return _checked(dimension, limit, remaining)


def _checked(dimension: Dimension, limit: float, remaining: float) -> Reading | None:
    if not (math.isfinite(limit) and math.isfinite(remaining)):
        return None
    if limit <= 0 or remaining < 0 or remaining > limit:
        return None
    return Reading(dimension, float(limit), float(remaining))


_NOTHING = Refusal()
