"""When a call may move on to a smaller model instead of failing.

The OOM-avalanche incident's stop-loss order ends with "degrade to a smaller model": when the
primary model's servers are open-circuited, shedding, or still overloaded
after the retries the budget allowed, the next model in ``fallback_models``
serves the call and the result says ``degraded=True``. Errors that are the
caller's own fault (400, 401, 403, 404, 409, 422) fail as they are: another
model would refuse the same request, and hiding a bug behind a degraded
answer helps nobody. Refusals of the token pre-check have their own answer
(``context_fallbacks`` of the token policy).

A 429 out of quota (``insufficient_quota``, ``_retry.is_out_of_quota``) does not
fall back either: it says the account has no credit left, and the fallback
models go out with the same client, the same key and the same endpoints, so the
next model would be refused for the same empty account, one more request to
learn it. A limit per model is a rate limit (OpenAI's ``rate_limit_exceeded``),
a 429 that still falls back. The error is raised as it came, with
``retry_stopped_by="not_retryable"``.
"""

from __future__ import annotations

from ._exceptions import (
    APIConnectionError,
    APIStatusError,
    CircuitOpenError,
    StreamInterruptedError,
)
from ._retry import is_out_of_quota

__all__ = ["FALLBACK_STATUSES", "is_fallback_worthy"]

#: Statuses that say "this model's servers cannot serve you now".
FALLBACK_STATUSES = frozenset({408, 429, 500, 502, 503, 504})


def is_fallback_worthy(error: BaseException) -> bool:
    """True when trying the next model can help (overload, outage, open breaker), not
    for the caller's own faults or an account out of quota."""
    if isinstance(error, CircuitOpenError):
        return True
    if isinstance(error, StreamInterruptedError):
        return error.chunks_received == 0
    if isinstance(error, APIConnectionError):  # timeouts included
        return not getattr(error, "response_started", False)
    if isinstance(error, APIStatusError):
        if error.server_load.load_shed == "too_long" or is_out_of_quota(error):
            return False
        return error.status_code in FALLBACK_STATUSES or error.server_load.load_shed is not None
    return False
