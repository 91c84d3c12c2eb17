"""What happened to each attempt of a logical call, and each move of it to another
model, kept on results and errors."""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["AttemptRecord", "FallbackKind", "FallbackStep"]


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One HTTP attempt of a logical call.

    ``delay_before`` is the backoff slept before this attempt (0 for the first);
    ``queued`` the seconds it waited in the local queue for a concurrency slot,
    and ``concurrency_limit`` the endpoint's limit when it got one (None without
    a limiter); ``outcome`` is ``"ok"``, ``"retry"`` (a retry followed),
    ``"failover"`` (a retry followed on an endpoint the call had not tried, outside
    the retry budget), ``"requeued"`` (shed before processing, the call went back
    to the local queue) or the reason the call stopped here (see
    ``StormguardError.retry_stopped_by``), or ``"paced"`` (a quota 429: the call
    went back to its key's pacer, outside the retry budget); ``started_at`` is when
    it was sent, on the client's clock (``time.monotonic()`` unless a test's clock
    was given); ``quota_wait`` the seconds it waited for its share of its key's
    quota (docs/quotas.md); ``deployment`` and ``tier`` the ``Deployment`` it went
    to and that deployment's tier (None: a plain endpoint, docs/providers.md);
    ``affinity`` whether its endpoint was its prefix-cache affinity key's home
    (``"hit"``: the first of the key's ranking of the endpoints in rotation, or
    the endpoint the key moved to when its home was full) or
    another because the home was full, shedding or already tried by the call
    (``"overflow"``); None: the call had no key, or there was no choice to make
    (docs/resilience.md, "Prefix-cache affinity"); ``hedge`` whether it was a
    hedge: one more attempt of a slow call, sent to another endpoint while the
    call's own attempt still ran (docs/resilience.md, "Hedged requests"). Of a
    hedged call's two racing attempts, the one whose answer the call returned
    has outcome ``"ok"``; the other, cancelled with its connection closed,
    ``"hedge_lost"``.
    """

    number: int
    status_code: int | None
    error_type: str | None
    delay_before: float
    duration: float
    outcome: str
    endpoint: str | None = None
    model: str | None = None
    queued: float = 0.0
    concurrency_limit: int | None = None
    started_at: float | None = None
    quota_wait: float = 0.0
    deployment: str | None = None
    tier: int | None = None
    affinity: str | None = None
    hedge: bool = False


class FallbackKind(str, enum.Enum):
    """Why a call moved to another model."""

    #: The model's servers could not serve it (overload, outage, open breaker).
    UNAVAILABLE = "unavailable"
    #: The request was too long for the model's context window.
    CONTEXT_WINDOW = "context_window"
    #: A content filter refused it.
    CONTENT_POLICY = "content_policy"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, slots=True)
class FallbackStep:
    """One move of a call to another model (``CallInfo.fallbacks``)."""

    from_model: str | None
    to_model: str
    kind: FallbackKind
    #: The exception class of the refusal that caused it.
    error_type: str
