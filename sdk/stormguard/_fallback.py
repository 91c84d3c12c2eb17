"""When a call may move on to a smaller model instead of failing.

The OOM-avalanche incident's stop-loss order ends with "degrade to a smaller model": when the
primary model's servers are open-circuited, shedding, or still overloaded
after the retries the budget allowed, the next model in ``fallback_models``
serves the call and the result says ``degraded=True``. Which failures allow
it is one field of the outcome's ``Verdict`` (``_verdict.py``, where the rule
and its reasons live): not the caller's own faults, not a request too long for
the model, not an account out of quota (raised as it came, with
``retry_stopped_by="not_retryable"``).
"""

from __future__ import annotations

from ._verdict import TRANSIENT_STATUSES, classify

__all__ = ["FALLBACK_STATUSES", "is_fallback_worthy"]

#: Statuses that say "this model's servers cannot serve you now": the transient ones.
FALLBACK_STATUSES = TRANSIENT_STATUSES


def is_fallback_worthy(error: BaseException) -> bool:
    """True when trying the next model can help (overload, outage, open breaker), not
    for the caller's own faults or an account out of quota."""
    return classify(error).fallback
