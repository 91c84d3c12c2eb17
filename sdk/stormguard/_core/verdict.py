"""One classification of an attempt's outcome, read by every policy.

``classify(error, policy)`` judges an outcome once (None: the attempt succeeded)
and returns a ``Verdict``: whether another attempt is worth it and, if not, the
``StopReason``; whether the next model of ``fallback_models`` may serve the call;
whether the breaker counts a failure; what the adaptive throttle and the
concurrency limit learn; whether it was a shed or a too-long refusal. The retry
policy, the fallback, the breaker, the throttle and the limiter read their
answer from it, so a status means the same thing to all of them.

The status tables, one per meaning:

* ``TRANSIENT_STATUSES`` (408, 429, 500, 502, 503, 504): "the server cannot
  serve this now", so a later attempt or another model may. The retry policy's
  default ``retry_statuses`` and the fallback's rule.
* ``REFUSAL_STATUSES`` (429, 503): "alive, but refusing": the server's load or
  the caller's rate. A shed for the limiter, never an accept for the throttle,
  never a failure for the breaker.
* Breaker failures are every 5xx but 503, and 408: crash-like answers.

The reasons behind each rule sit next to it below.
"""

from __future__ import annotations

import enum
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from ..protocol import ShedReason
from .exceptions import (
    APIConnectionError,
    APIError,
    APIResponseValidationError,
    APIStatusError,
    APITimeoutError,
    CircuitOpenError,
    ClientClosedError,
    EventLoopMismatchError,
    LocalQueueFullError,
    QueueTimeoutError,
    QuotaWaitError,
    RefusedBeforeSendError,
    StreamInterruptedError,
    ThrottledError,
)
from .stop_reason import StopReason

__all__ = [
    "QUOTA_CODES",
    "REFUSAL_STATUSES",
    "TRANSIENT_STATUSES",
    "LimitOutcome",
    "RetryStatuses",
    "Verdict",
    "classify",
    "is_content_policy_refusal",
    "is_context_length_refusal",
    "is_out_of_quota",
    "is_quota_refusal",
    "is_too_large_for_quota",
    "refusal_message",
]

#: "This server cannot serve you now": worth a later attempt, or another model.
TRANSIENT_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
#: "Alive, but refusing": a shed (the server's load) or the caller's rate.
REFUSAL_STATUSES = frozenset({429, 503})
_OUT_OF_QUOTA = "insufficient_quota"
#: The ``code`` or ``type`` of a 429 that refuses the caller's rate (a quota), not
#: the server's load: OpenAI's ``rate_limit_exceeded`` (its ``type`` names the
#: limit, ``tokens`` or ``requests``), Anthropic's ``rate_limit_error``, Azure
#: OpenAI's code ``"429"``.
QUOTA_CODES = frozenset({"rate_limit_exceeded", "rate_limit_error", "tokens", "requests", "429"})
_RESTART_REASONS = frozenset(
    {ShedReason.ENGINE_RESTART.value, ShedReason.WARMING.value, ShedReason.DRAINING.value}
)


class RetryStatuses(Protocol):
    """What ``classify`` reads of a retry policy (``retry.RetryPolicy``): the statuses
    worth another attempt. A protocol, so that the policy builds on the verdict and
    the verdict needs nothing of the policy's."""

    @property
    def retry_statuses(self) -> frozenset[int]: ...


class LimitOutcome(str, enum.Enum):
    """How an attempt that held a slot went, as far as the concurrency limit is concerned."""

    #: The server processed it (any answer but a shed).
    SUCCESS = "success"
    #: The server shed it before processing: the overload signal.
    DROPPED = "dropped"
    #: The server shed it because its engine is not serving (restarting, warming, draining).
    RESTARTING = "restarting"
    #: The server lost a stream it had begun (cut, or a 5xx event after the first
    #: chunk): a loss that lowers the limit, but no refusal, so it never pauses it.
    CUT = "cut"
    #: Says nothing about load: cancelled, a connection error, a caller error.
    IGNORED = "ignored"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one attempt's outcome means to each policy."""

    #: Another attempt is worth it (the retry policy's rule).
    retry: bool
    #: Why not, when ``retry`` is False and the attempt failed (None on success).
    stop: StopReason | None
    #: The next model of ``fallback_models`` may serve the call.
    fallback: bool
    #: The server looks unwell: the breaker (and outlier ejection) count a failure.
    breaker_failure: bool
    #: The request left this process (the throttle counts only those).
    sent: bool
    #: The server accepted it, for the adaptive throttle.
    accepted: bool
    #: Refused before any processing (the limiter's overload signal).
    shed: bool
    #: A shed the server did not forbid retrying: with a limiter, it goes back to
    #: the local queue (a requeue, not a retry).
    requeue: bool
    #: What the concurrency limit learns from it.
    limit: LimitOutcome
    #: What the limit learns when this error cuts a stream after its first chunk.
    limit_after_first_chunk: LimitOutcome
    #: The request cannot fit the model (``is_context_length_refusal``): the caller's
    #: error, which only a longer-context model can serve.
    too_long: bool
    #: A 429 ``insufficient_quota``: the account has no credit.
    out_of_quota: bool
    #: A 429 that refuses the caller's rate (``is_quota_refusal``): with a quota
    #: policy, a congestion signal for the key's pacer, not a shed.
    quota: bool = False
    #: A content filter refused the request (``is_content_policy_refusal``): the
    #: caller's error, moved to another model only by a configured route.
    content_policy: bool = False


_SUCCESS = Verdict(
    retry=False,
    stop=None,
    fallback=False,
    breaker_failure=False,
    sent=True,
    accepted=True,
    shed=False,
    requeue=False,
    limit=LimitOutcome.SUCCESS,
    limit_after_first_chunk=LimitOutcome.IGNORED,
    too_long=False,
    out_of_quota=False,
)


def _ended_here(stop: StopReason) -> Verdict:
    """An attempt this process ended, not the server: nothing to learn from it."""
    return Verdict(
        retry=False,
        stop=stop,
        fallback=False,
        breaker_failure=False,
        sent=False,
        accepted=False,
        shed=False,
        requeue=False,
        limit=LimitOutcome.IGNORED,
        limit_after_first_chunk=LimitOutcome.IGNORED,
        too_long=False,
        out_of_quota=False,
    )


#: The client was closed (``close()`` ended the attempt): the caller ended it, as a
#: cancellation does (gRPC ends a closed channel's calls as ``CANCELLED`` too).
_CLOSED = _ended_here(StopReason.CANCELLED)
#: Your ``http_client`` cannot serve this event loop: no other attempt or model on
#: it can either, and the server never saw it.
_WRONG_LOOP = _ended_here(StopReason.NOT_RETRYABLE)


def is_out_of_quota(error: BaseException | None) -> bool:
    """A 429 that says the account is out of quota (``code`` or ``type``
    ``insufficient_quota``), not over a rate: never retried, never requeued, and
    no shed for the concurrency limit (the server has room; this caller has no
    credit)."""
    return (
        isinstance(error, APIStatusError)
        and error.status_code == 429
        and _OUT_OF_QUOTA in (error.code, error.type)
    )


def is_quota_refusal(error: BaseException | None) -> bool:
    """A 429 that refuses the caller's rate, not the server's load: no ``x-load-shed``,
    not out of credit (``is_out_of_quota``) nor too large for the quota
    (``is_too_large_for_quota``), and a quota's own mark: its ``code`` or ``type``
    (``QUOTA_CODES``), or ``x-ratelimit-*`` headers. The quota policy paces it
    (docs/quotas.md); a bare 429 counts only once its key's pacing is on."""
    if not isinstance(error, APIStatusError) or error.status_code != 429:
        return False
    if error.server_load.load_shed is not None or is_out_of_quota(error):
        return False
    if is_too_large_for_quota(error):
        return False
    return bool({error.code, error.type} & QUOTA_CODES) or not error.rate_limit.is_empty


def is_too_large_for_quota(error: BaseException | None) -> bool:
    """A 429 whose message says the request alone is over the key's limit
    (OpenAI's "Request too large for MODEL ... on tokens per min"): no wait makes it
    fit, so it is never retried."""
    if not isinstance(error, APIStatusError) or error.status_code != 429:
        return False
    return refusal_message(error)[:40].lower().lstrip().startswith("request too large")


#: The ``code`` of a 400 that says the request is longer than the model's context
#: window (OpenAI, LiteLLM's proxy, the reference server, this client's pre-check).
CONTEXT_LENGTH_CODE = "context_length_exceeded"
#: What a 400 without that code says instead, as LiteLLM's exception mapping reads it:
#: vLLM ("This model's maximum context length is ...", "... is longer than the maximum
#: model length of ..."), Anthropic ("prompt is too long"), others.
_CONTEXT_LENGTH_PHRASES = (
    "maximum context length",
    "maximum context limit",
    "maximum model length",
    "longer than the model's context length",
    "prompt is too long",
)
#: The ``code`` of a 400 a content filter answered: OpenAI's ``content_policy_violation``,
#: Azure OpenAI's ``content_filter``.
CONTENT_POLICY_CODES = frozenset({"content_policy_violation", "content_filter"})
_CONTENT_POLICY_PHRASES = ("content management policy", "content_filter_policy", "safety system")


def is_context_length_refusal(error: BaseException | None) -> bool:
    """The request is longer than the model's context window: refused by the token
    pre-check (``ContextWindowExceededError``), by a server's load shed ``too_long``,
    or by a 400 whose ``code`` is ``context_length_exceeded`` or whose message says
    so (``_CONTEXT_LENGTH_PHRASES``)."""
    if not isinstance(error, APIStatusError):
        return False
    if error.server_load.load_shed == ShedReason.TOO_LONG.value:
        return True
    if error.status_code != 400:
        return False
    if CONTEXT_LENGTH_CODE in (error.code, error.type):
        return True
    message = refusal_message(error)[:500].lower()
    return any(phrase in message for phrase in _CONTEXT_LENGTH_PHRASES)


def is_content_policy_refusal(error: BaseException | None) -> bool:
    """A 400 a content filter answered: its ``code`` (``CONTENT_POLICY_CODES``), or
    its message naming the filter, as LiteLLM reads Azure's."""
    if not isinstance(error, APIStatusError) or error.status_code != 400:
        return False
    if {error.code, error.type} & CONTENT_POLICY_CODES:
        return True
    message = refusal_message(error)[:500].lower()
    return any(phrase in message for phrase in _CONTENT_POLICY_PHRASES)


def refusal_message(error: APIStatusError) -> str:
    """The server's own message of an error answer (its body's ``message``, scrubbed),
    without the ``Error code: 429 - `` that ``message`` starts with."""
    body = error.body
    if isinstance(body, Mapping):
        message = body.get("message")
        if isinstance(message, str):
            return message
    return error.message


def classify(error: BaseException | None, policy: RetryStatuses | None = None) -> Verdict:
    """Judge one attempt's outcome (None: it succeeded). ``policy`` supplies the
    retryable statuses (default: ``TRANSIENT_STATUSES``); nothing else depends on it.

    >>> from stormguard import RateLimitError
    >>> v = classify(RateLimitError("slow down", status_code=429))
    >>> v.retry, v.fallback, v.breaker_failure, v.accepted, v.shed
    (True, True, False, False, True)
    """
    if error is None:
        return _SUCCESS
    if isinstance(error, ClientClosedError):
        return _CLOSED
    if isinstance(error, EventLoopMismatchError):
        return _WRONG_LOOP
    retry_statuses = TRANSIENT_STATUSES if policy is None else policy.retry_statuses
    retry, stop = _retry_rule(error, retry_statuses)
    status = error if isinstance(error, APIStatusError) else None
    too_long = is_context_length_refusal(error)
    quota = is_out_of_quota(error)
    too_large = is_too_large_for_quota(error)
    shed = status is not None and status.status_code in REFUSAL_STATUSES and not too_long
    shed = shed and not quota and not too_large
    breaker_failure = _breaker_rule(error)
    sent = _sent(error)
    accepted = sent and not breaker_failure
    accepted = accepted and not (status is not None and status.status_code in REFUSAL_STATUSES)
    limit = LimitOutcome.IGNORED
    if shed:
        assert status is not None
        restarting = status.server_load.load_shed in _RESTART_REASONS
        limit = LimitOutcome.RESTARTING if restarting else LimitOutcome.DROPPED
    return Verdict(
        retry=retry,
        stop=stop,
        fallback=_fallback_rule(error, too_long=too_long, quota=quota),
        breaker_failure=breaker_failure,
        sent=sent,
        accepted=accepted,
        shed=shed,
        requeue=shed and status is not None and status.server_load.should_retry is not False,
        limit=limit,
        limit_after_first_chunk=_stream_cut_rule(error),
        too_long=too_long,
        out_of_quota=quota,
        quota=is_quota_refusal(error),
        content_policy=is_content_policy_refusal(error),
    )


class AttemptAbandoned(BaseException):
    """A sync call's own driver gave the attempt up (a hedged call's racer that lost,
    ``_call/drivers.py``): a cancellation, as asyncio's ``CancelledError`` is to an
    async one; it never leaves the SDK."""


def _cancellations() -> tuple[type[BaseException], ...]:
    """The errors that mean the caller gave up. ``asyncio`` is not imported for this:
    a task cannot have been cancelled unless asyncio is already loaded."""
    asyncio = sys.modules.get("asyncio")
    if asyncio is None:
        return (AttemptAbandoned, KeyboardInterrupt)
    return (asyncio.CancelledError, AttemptAbandoned, KeyboardInterrupt)


def _retry_rule(
    error: BaseException, retry_statuses: frozenset[int]
) -> tuple[bool, StopReason | None]:
    """Whether the failure of one attempt is worth another attempt.

    Refusals made in this process are final for the call: each names its stop
    reason. A timeout or a cut before the answer began is retried (nothing was
    delivered, the server did no work the caller keeps); after it began, a retry
    would generate twice. A 429 out of quota is never retried, whatever
    ``x-should-retry`` says: no wait of seconds refills an account; nor is a
    request too large for the key's quota: no wait makes it fit. Otherwise the
    server's ``x-should-retry`` wins, then the policy's ``retry_statuses``.
    """
    if isinstance(error, _cancellations()):
        return False, StopReason.CANCELLED
    if isinstance(error, CircuitOpenError):
        return False, StopReason.CIRCUIT_OPEN
    if isinstance(error, ThrottledError):
        return False, StopReason.THROTTLED
    if isinstance(error, (QueueTimeoutError, QuotaWaitError)):
        return False, StopReason.DEADLINE  # no slot, or no room in the quota, in time
    if isinstance(error, LocalQueueFullError):
        return False, StopReason.QUEUE_FULL
    if isinstance(error, StreamInterruptedError):
        # Cut before the first chunk reached the caller (later cuts never get
        # here): nothing was delivered, so trying again is safe.
        return (True, None) if error.chunks_received == 0 else (False, StopReason.NOT_RETRYABLE)
    if isinstance(error, APITimeoutError):
        return (False, StopReason.NOT_RETRYABLE) if error.response_started else (True, None)
    if isinstance(error, APIConnectionError):
        return True, None
    if isinstance(error, APIStatusError):
        if is_out_of_quota(error) or is_too_large_for_quota(error):
            return False, StopReason.NOT_RETRYABLE
        should_retry = error.server_load.should_retry
        if should_retry is False:
            return False, StopReason.SHOULD_RETRY_FALSE
        if should_retry is True or error.status_code in retry_statuses:
            return True, None
    return False, StopReason.NOT_RETRYABLE


def _fallback_rule(error: BaseException, *, too_long: bool, quota: bool) -> bool:
    """True when trying the next model can help (overload, outage, open breaker).

    Errors that are the caller's own fault (400, 401, 403, 404, 409, 422) fail as
    they are: another model would refuse the same request, and hiding a bug behind
    a degraded answer helps nobody. Nor does a too-long request, nor a content
    filter's refusal: those go only where their own routes say (``_policies/fallback.py``).
    A 429 out of quota does not fall back either: the fallback models go out with
    the same client, key and endpoints, so the next model would be refused for the
    same empty account, one more request to learn it; a limit per model is a rate
    limit, which still falls back. A timeout or cut after the answer began does
    not: the caller's deadline was spent on generation, not on a refusal.
    """
    if isinstance(error, (CircuitOpenError, QuotaWaitError)):
        return True  # a model's quota is its own (OpenAI's limits are per model)
    if isinstance(error, StreamInterruptedError):
        return error.chunks_received == 0
    if isinstance(error, APIConnectionError):  # timeouts included
        return not getattr(error, "response_started", False)
    if isinstance(error, APIStatusError):
        if too_long or quota:
            return False
        return error.status_code in TRANSIENT_STATUSES or error.server_load.load_shed is not None
    return False


def _breaker_rule(error: BaseException) -> bool:
    """Whether an attempt's outcome says the server is unwell.

    Only crash-like failures count: refused, reset or timed-out connections,
    500, 502, 504 and every other 5xx but 503, 408, a stream cut before its first
    chunk, and a 2xx body that breaks the API. A 503 or a 429 is a server that
    answers: "alive, but full" (a shed, vLLM's queue-full answer, the caller's
    rate), or "not serving until Retry-After" (``engine_restart``, ``warming``,
    ``draining``). Those pace the calls instead (the concurrency limit,
    ``_policies/limiter/aimd.py``: the limit falls, a restart pauses the endpoint
    for its Retry-After), and the calls wait within
    their deadlines rather than fail. Not failures either: the caller's own
    errors (other 4xx, ``too_long``), refusals made in this process,
    cancellation, and a stream cut after content arrived (the call already
    counted as a success at its first chunk; a crash that cut it fails the next
    calls with refused connections).
    """
    if isinstance(error, APIStatusError):
        if error.status_code in REFUSAL_STATUSES:
            return False
        return error.status_code >= 500 or error.status_code == 408
    if isinstance(error, StreamInterruptedError):
        return error.chunks_received == 0
    if isinstance(error, QueueTimeoutError):
        return False  # no slot in time, here: nothing was sent
    return isinstance(error, (APIConnectionError, APIResponseValidationError))


def _sent(error: BaseException) -> bool:
    """Whether the request left this process: an ``APIError`` that is not a local
    refusal (a ``ContextWindowExceededError`` is a ``BadRequestError`` refused
    here) nor a wait for a slot that never ended (``QueueTimeoutError``)."""
    return (
        isinstance(error, APIError)
        and not isinstance(error, RefusedBeforeSendError)
        and not isinstance(error, QueueTimeoutError)
    )


def _stream_cut_rule(error: BaseException) -> LimitOutcome:
    """What a stream that failed after its first chunk tells the limit. Cut by the
    server (the connection, or a 5xx event): a loss, since the server lost work it
    had taken, and an engine that runs out of memory cuts every stream it has at
    once; the limit must be down before the backlog refills it (Netflix's gRPC
    client limiter counts a call that ends ``UNAVAILABLE`` as a drop too). But not
    a shed: the server took the call, so a cut never pauses the endpoint as a shed
    at the floor does (``LimitOutcome.CUT``). Anything else (the caller's
    deadline, a malformed chunk) says nothing about load."""
    if isinstance(error, StreamInterruptedError) or (
        isinstance(error, APIStatusError) and error.status_code >= 500
    ):
        return LimitOutcome.CUT
    return LimitOutcome.IGNORED
