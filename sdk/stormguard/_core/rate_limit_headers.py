"""The ``x-ratelimit-*`` headers: what the caller's quota has left, and when it resets.

OpenAI sends them on every response; LiteLLM's proxy and vLLM gateways copy
OpenAI's names (``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``).
They describe this caller's *quota* (a rate), not the server's load: that is
``ServerLoad``. A reset is a duration from the moment the response left the
server: OpenAI writes Go durations (``6m0s``, ``1s``, ``20ms``, ``1h2m3.5s``),
LiteLLM's proxy plain seconds (``42``). As every parser of ``stormguard.protocol``,
these return None for a missing, malformed or absurd value (negative, over a
day, over 18 digits): a header is advice, never an exception.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields

from ..protocol import ABSURD_RETRY_AFTER_S, parse_non_negative_int

__all__ = [
    "HEADER_LIMIT_REQUESTS",
    "HEADER_LIMIT_TOKENS",
    "HEADER_REMAINING_REQUESTS",
    "HEADER_REMAINING_TOKENS",
    "HEADER_RESET_REQUESTS",
    "HEADER_RESET_TOKENS",
    "NO_RATE_LIMIT",
    "RateLimit",
    "parse_reset",
]

HEADER_LIMIT_REQUESTS = "x-ratelimit-limit-requests"
HEADER_LIMIT_TOKENS = "x-ratelimit-limit-tokens"
HEADER_REMAINING_REQUESTS = "x-ratelimit-remaining-requests"
HEADER_REMAINING_TOKENS = "x-ratelimit-remaining-tokens"
HEADER_RESET_REQUESTS = "x-ratelimit-reset-requests"
HEADER_RESET_TOKENS = "x-ratelimit-reset-tokens"

_UNIT_SECONDS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_NUMBER = r"\d{1,12}(?:\.\d{1,12})?"
_PART = re.compile(rf"({_NUMBER})(h|ms|m|s|us|µs|ns)")
_DURATION = re.compile(rf"(?:{_NUMBER}(?:h|ms|m|s|us|µs|ns))+")
_SECONDS = re.compile(_NUMBER)


def parse_reset(value: str | None) -> float | None:
    """Seconds until a limit resets: a Go duration (``6m0s``, ``20ms``) or plain
    seconds (``42``, ``0.5``); None when absent, malformed, or over a day.

    >>> parse_reset("6m0s"), parse_reset("20ms"), parse_reset("1h"), parse_reset("7")
    (360.0, 0.02, 3600.0, 7.0)
    >>> parse_reset("-1s"), parse_reset("soon"), parse_reset("999h"), parse_reset("1e9")
    (None, None, None, None)
    """
    if value is None:
        return None
    text = value.strip()
    if not text or len(text) > 64:
        return None
    if _SECONDS.fullmatch(text):
        seconds = float(text)
    elif _DURATION.fullmatch(text):
        seconds = sum(float(n) * _UNIT_SECONDS[unit] for n, unit in _PART.findall(text))
    else:
        return None
    return seconds if seconds <= ABSURD_RETRY_AFTER_S else None


def _count(headers: Mapping[str, str], name: str) -> int | None:
    value = headers.get(name)
    return parse_non_negative_int(value) if value is not None else None


@dataclass(frozen=True, slots=True)
class RateLimit:
    """The ``x-ratelimit-*`` headers of a response; every field None when not sent.

    >>> RateLimit.from_headers({"x-ratelimit-remaining-tokens": "0",
    ...                         "x-ratelimit-reset-tokens": "20s"}).exhausted_reset()
    20.0
    """

    limit_requests: int | None = None
    limit_tokens: int | None = None
    remaining_requests: int | None = None
    remaining_tokens: int | None = None
    #: Seconds from the response until the request limit is whole again.
    reset_requests: float | None = None
    #: Seconds from the response until the token limit is whole again.
    reset_tokens: float | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str]) -> RateLimit:
        """Parse the headers (lower-case names, as httpx gives them); bad values are None."""
        for name in _HEADERS:
            if name in headers:
                break
        else:
            return _NONE  # most servers send none of them: 0.3 us instead of 3.5
        return cls(
            limit_requests=_count(headers, HEADER_LIMIT_REQUESTS),
            limit_tokens=_count(headers, HEADER_LIMIT_TOKENS),
            remaining_requests=_count(headers, HEADER_REMAINING_REQUESTS),
            remaining_tokens=_count(headers, HEADER_REMAINING_TOKENS),
            reset_requests=parse_reset(headers.get(HEADER_RESET_REQUESTS)),
            reset_tokens=parse_reset(headers.get(HEADER_RESET_TOKENS)),
        )

    def exhausted_reset(self) -> float | None:
        """Seconds until every exhausted limit (remaining 0) has reset: when a request
        can next be accepted. None when none is exhausted, or its reset was not sent
        or is no wait (``0s``): as a Retry-After of 0, that is no advice, and the
        caller's own jittered backoff applies."""
        waits = [
            reset
            for remaining, reset in (
                (self.remaining_requests, self.reset_requests),
                (self.remaining_tokens, self.reset_tokens),
            )
            if remaining == 0 and reset
        ]
        return max(waits) if waits else None

    @property
    def is_empty(self) -> bool:
        """True when the response carried none of the headers."""
        return all(getattr(self, f.name) is None for f in fields(self))


_HEADERS = (
    HEADER_REMAINING_TOKENS,
    HEADER_REMAINING_REQUESTS,
    HEADER_LIMIT_TOKENS,
    HEADER_LIMIT_REQUESTS,
    HEADER_RESET_TOKENS,
    HEADER_RESET_REQUESTS,
)
_NONE = RateLimit()
#: What ``from_headers`` returns for a response without any of the headers (the
#: same object each time: a cheap check).
NO_RATE_LIMIT = _NONE
