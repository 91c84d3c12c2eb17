"""One attempt's bookkeeping: its response and failure, the deadline errors of
its reads, its settling with the limiter, the breaker, outlier ejection and
the throttle (one ``Verdict`` read by each), and its ``AttemptRecord``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from .._core.exceptions import APIError, APIStatusError, APITimeoutError
from .._core.history import AttemptRecord
from .._core.http import httpx
from .._core.rate_limit_headers import RateLimit
from .._core.stop_reason import StopReason
from .._core.verdict import LimitOutcome, classify
from .._policies.breaker.states import CircuitState
from .._policies.routing.ejection_rules import evidence_of
from .._policies.routing.peak_ewma import token_sample
from ..protocol import ServerLoad
from ..telemetry._events import AttemptEnded
from .call_base import OK, CallBase
from .call_quota import quota_observed, quota_refused
from .call_state import ATTEMPT_OPEN, IN_FLIGHT

if TYPE_CHECKING:
    from .._policies.routing.endpoint_state import EndpointState
    from ..tokens import TokenRateLimiter


__all__ = [
    "close_record",
    "completion_tokens",
    "deadline_error",
    "deadline_passed",
    "failed",
    "failed_reading",
    "saw_response",
    "stop_open_attempt",
]


def saw_response(call: CallBase, response: httpx.Response) -> None:
    """Note the status and load headers of the attempt's response."""
    call.machine.step("saw_response")
    # One pass over the headers: httpx.Headers.get scans them all on each of the
    # dozen look-ups the parser makes (about 20 us a call, measured).
    headers = dict(response.headers.items())
    load = ServerLoad.from_headers(headers)
    call.server_load = call.redactor.scrub_load(load)
    call.rate_limit = RateLimit.from_headers(headers)
    if call._endpoint is not None:
        call.core.picker.observe(call._endpoint, call.server_load)
    policy = call.core.token_policy
    bucket = policy.rate_limiter if policy is not None else None
    if bucket is not None and call.rate_limit.remaining_tokens is not None:
        _tokens_left(call, bucket, call.rate_limit.remaining_tokens)
    quota_observed(call, response.status_code)
    _note(call, response.status_code, None)


def _tokens_left(call: CallBase, bucket: TokenRateLimiter, remaining: int) -> None:
    """The server's count of this caller's tokens beats the local estimate: the
    client's bucket holds no more (``observe``, never below empty). When none is
    left, this endpoint takes no call before the reset, at most ``MAX_PAUSE_S``:
    one server's headers are its own word, as its Retry-After is, and never stop
    the calls to another endpoint (a spent quota there is reported there)."""
    bucket.observe(remaining, None)
    reset = call.rate_limit.reset_tokens
    limiter, endpoint = call.core.limiter, call._endpoint
    if remaining == 0 and reset and limiter is not None and endpoint is not None:
        limiter.endpoint(endpoint.name).pause(reset)


def failed(call: CallBase, error: APIError) -> APIError:
    """Record that the attempt ended in ``error`` and return it, to be raised
    (scrubbed of secrets: it may quote a library's text, an httpx error's), with
    the attempt's request as its ``request``."""
    if error.request is None:
        error.request = call._request
    if error.rate_limit.is_empty:
        error.rate_limit = call.rate_limit
    call.redactor.scrub_error(error)
    call._attempt_error = error
    if isinstance(error, APIStatusError) and error.status_code == 429:
        call._quota_refusal = quota_refused(call, error)
    call.machine.step("failed")
    _settle_attempt(call, None, error)
    if call._pending is None or call._pending[1] is None:
        status = call._pending[0] if call._pending else getattr(error, "status_code", None)
        _note(call, status, type(error).__name__)
    return error


def deadline_passed(call: CallBase, doing: str, *, response_started: bool = False) -> APIError:
    """The error, recorded, of an attempt that the call's deadline ended ``doing``
    something (a cancel scope fired, or a check between two reads)."""
    return failed(call, deadline_error(call, doing, response_started=response_started))


def deadline_error(call: CallBase, doing: str, *, response_started: bool = False) -> APIError:
    """The error of a deadline that passed ``doing`` something, not recorded; a
    stream's bound that passed says which it was, and a first chunk's is retried."""
    bounds = call.stream_bounds
    reason = None if bounds is None else bounds.timeout_reason()
    message = f"The call's deadline passed {doing}"
    if bounds is not None and reason is not None:
        message = f"{reason[0].upper()}{reason[1:]} {doing}"
        response_started = response_started and not bounds.first_chunk_passed
    return APITimeoutError(message, response_started=response_started, server_load=call.server_load)


def failed_reading(call: CallBase, error: APIError) -> APIError:
    """A body reader's error: the failure of the attempt while it is in flight
    (``failed``); after the hand-over the error as it is, which the reader's
    caller ends the call with (``failed_after_hand_over``)."""
    return failed(call, error) if call.machine.state in IN_FLIGHT else error


def _note(call: CallBase, status: int | None, error_type: str | None) -> None:
    call._pending = (status, error_type, call.core.clock.now() - call._started)


def close_record(call: CallBase, outcome: str, usage: object = None) -> None:
    """Close the attempt's record with ``outcome`` (settling an attempt still in
    flight first, with the answer's ``usage`` when it has one); the caller then
    takes the step the outcome leads to."""
    if call.machine.state not in ATTEMPT_OPEN:
        return  # no attempt was sent (refused before it: open breaker, throttle)
    status, error_type, duration = call._pending or (None, None, 0.0)
    if call._pending is None:
        duration = call.core.clock.now() - call._started
    if call.machine.state in IN_FLIGHT:
        _settle_attempt(call, outcome, None if outcome == OK else call._attempt_error, usage)
    end_wait(call)
    lease = call._lease
    if outcome != OK or not call.spec.stream:
        call.release_slot()  # a stream holds its slot until it ends (``ended``)
    if call._trace is not None:
        call._trace.on_event(AttemptEnded(outcome, status, error_type, call.server_load, duration))
    quota_wait = 0.0
    if call._quota is not None:
        quota_wait, call._quota.attempt_wait = call._quota.attempt_wait, 0.0
    endpoint = call._endpoint
    deployment = tier = None
    if endpoint is not None and endpoint.provider is not None:
        deployment, tier = endpoint.name, endpoint.tier
    if endpoint is not None:
        if outcome == OK and call.spec.stream:
            # Its first chunk is in: the endpoint serves it until its end (``release_slot``).
            call._streaming_from = endpoint
        else:
            call.core.picker.finished(endpoint)
        call._last_endpoint = endpoint.name
        call._endpoint = None
    call.history += (
        AttemptRecord(
            number=call.attempt_number,
            status_code=status,
            error_type=error_type,
            delay_before=call._delay_before,
            duration=duration,
            outcome=outcome,
            endpoint=endpoint.name if endpoint is not None else None,
            model=call.spec.model,
            queued=call._queued_before,
            concurrency_limit=None if lease is None else lease.limit,
            started_at=call._started,
            quota_wait=quota_wait,
            deployment=deployment,
            tier=tier,
            affinity=call._attempt_affinity if endpoint is not None else None,
            hedge=call.hedge,
        ),
    )
    if deployment is not None and tier is not None:
        call.core.tier_watch.attempted(deployment, tier, outcome)
    call._pending = None


def stop_open_attempt(call: CallBase) -> None:
    """The call leaves its model (an error leaves the call, or it falls back) with an
    attempt's record still open: closed with the loop's stop reason, or as not
    retryable (an error the loop never judged), and the call stopped."""
    if call.machine.state in ATTEMPT_OPEN:
        close_record(call, call.retry_stopped_by or StopReason.NOT_RETRYABLE)
        call.machine.step("stop")


def _settle_attempt(
    call: CallBase, outcome: str | None, error: BaseException | None = None, usage: object = None
) -> None:
    """Tell the lease, the breaker, ejection and the throttle how the attempt in
    flight went, once: as soon as it failed (so the retry decision sees an opened
    breaker) or when it ended; and the endpoint's latency estimate, with
    ``LatencyRouting``. Nothing else is told of a cancelled attempt: that says
    nothing about the server."""
    permit, call._permit = call._permit, None
    end_wait(call)
    # A stream settles at its first chunk: the time so far is its first token's.
    elapsed = call.core.clock.now() - call._started
    if call.core.latency_routing is not None and call._endpoint is not None:
        _latency_sample(call, call._endpoint, outcome, error, elapsed, usage)
    if outcome == StopReason.CANCELLED:
        if permit is not None:
            permit.ignore()
        return
    verdict = classify(error, call.core.retry_policy)  # read by each policy below
    if call._lease is not None:
        ttft = elapsed if call.spec.stream else None
        # A quota 429 the pacer paces is the caller's rate, not the server's load.
        limit = LimitOutcome.IGNORED if call._quota_refusal else verdict.limit
        call._lease.mark(limit, call.server_load, ttft)
    if permit is not None:
        permit.settle(error, verdict=verdict)
        if call._endpoint is not None and verdict.breaker_failure:
            _after_breaker_failure(call, call._endpoint)
    ejection, endpoint = call.core.ejection, call._endpoint
    if ejection is not None and endpoint is not None:
        evidence = evidence_of(error, response_seen=call._pending is not None, verdict=verdict)
        if ejection.record(endpoint, evidence, sent_at=call._started):
            _after_ejection(call, endpoint)
    if call.core.throttle is not None:
        call.core.throttle.record(error, verdict=verdict)


def end_wait(call: CallBase) -> None:
    """The stream attempt no longer waits for its first chunk (it has it, or ended
    without it): its endpoint's estimate no longer counts its wait."""
    waiting, call._waiting = call._waiting, None
    if waiting is not None:
        call.core.picker.wait_ended(*waiting)


def _latency_sample(
    call: CallBase,
    endpoint: EndpointState,
    outcome: str | None,
    error: BaseException | None,
    elapsed: float,
    usage: object,
) -> None:
    """The attempt's latency sample (``_policies/routing/peak_ewma.py`` says why
    these): a stream's time to its first chunk, or a lower bound on it when it
    ended before one, cancelled or timed out; a plain call's seconds per
    completion token (at least 16). Other endings give none."""
    latency = call.core.latency_routing
    assert latency is not None
    stream = call.spec.stream
    if outcome == OK:
        if stream:
            sample = elapsed
        else:
            tokens = completion_tokens(usage)
            if tokens is None:
                return
            sample = token_sample(elapsed, tokens)
        call.core.picker.observe_latency(endpoint, sample, latency, stream=stream)
    elif stream and (outcome == StopReason.CANCELLED or isinstance(error, APITimeoutError)):
        call.core.picker.observe_latency(endpoint, elapsed, latency, stream=True, lower_bound=True)


def completion_tokens(usage: object) -> int | None:
    """The completion (or Responses API output) tokens an answer's ``usage`` counts;
    None: none counted."""
    if not isinstance(usage, Mapping):
        return None
    tokens = usage.get("completion_tokens", usage.get("output_tokens"))
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        return None
    return tokens


def _after_breaker_failure(call: CallBase, endpoint: EndpointState) -> None:
    """An endpoint whose breaker this failure opened gets a recovery ramp: its
    concurrency limit starts from the bottom when calls return."""
    registry, limiter = call.core.breakers, call.core.limiter
    if registry is None or limiter is None:
        return
    if registry.get(endpoint.name, call.spec.model).state is CircuitState.OPEN:
        limiter.endpoint(endpoint.name).went_down()


def _after_ejection(call: CallBase, endpoint: EndpointState) -> None:
    """An ejected endpoint gets the same recovery ramp as one whose breaker
    opened: when it returns, its limit starts from the bottom."""
    if call.core.limiter is not None:
        call.core.limiter.endpoint(endpoint.name).went_down()
