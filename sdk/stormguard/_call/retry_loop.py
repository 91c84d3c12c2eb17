"""The retry loop's strategies for tenacity (``retry``, ``wait``, ``stop``,
``before_sleep``): whether a failure is retried, requeued or paced, how long to
wait, where the retry goes, and when and why the loop stops.

A **paced retry** follows a quota 429 (``_call/call_quota.py``): the call goes back to
its key's pacer, which holds it until the key has room (the 429's wait, jittered,
then the call's share of the key's rate). It is not a retry: the provider never
processed the request, so it spends no retry budget and does not count against
``max_attempts``; it keeps its ``x-stormguard-attempt``. At most
``QuotaPolicy.max_paced_retries`` per call, and within the deadline (the pacer
fails a call its deadline cannot fit with ``QuotaWaitError``); past the cap, a
quota 429 is an ordinary retry.
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Any, NoReturn

import tenacity

from .._core import logs as _logs
from .._core.exceptions import CircuitOpenError
from .._core.stop_reason import StopReason
from .._core.verdict import LimitOutcome, classify
from ..telemetry._events import BudgetRefused
from .attempt_record import close_record
from .call_base import FAILOVER, PACED, REQUEUED, RETRY, CallBase
from .endpoint_choice import (
    any_endpoint_accepting,
    can_retry_elsewhere,
    has_room_for,
    pick_endpoint,
    skip_credential_of,
)

if TYPE_CHECKING:
    from .._policies.routing.endpoint_state import EndpointState


__all__ = ["attempt_judged", "retrying_kwargs"]


def retrying_kwargs(call: CallBase) -> dict[str, Any]:
    """Strategies for the ``tenacity.Retrying`` that ``call_flow`` steps (it adds a
    ``sleep`` never called: a backoff is a ``Sleep`` its driver performs)."""
    return {
        "retry": partial(_retry, call),
        "wait": partial(_wait, call),
        "stop": partial(_stop, call),
        "before_sleep": partial(_before_sleep, call),
        "reraise": True,
        "retry_error_callback": _raise_last_error,
    }


def attempt_judged(call: CallBase) -> None:
    """An attempt's outcome is being judged: a stream's first-chunk bound is over,
    the retry is decided on the call's total. ``retry`` starts with it; the call
    flow calls it for a first attempt that succeeded (no loop was built)."""
    if call.stream_bounds is not None:
        call.stream_bounds.attempt_over()


def _retry(call: CallBase, state: tenacity.RetryCallState) -> bool:
    attempt_judged(call)
    error = _outcome_error(state)
    if error is None:
        return False
    verdict = classify(error, call.core.retry_policy)
    endpoint = call._endpoint
    # That deployment's account has no credit; another's may: a retry there.
    if verdict.out_of_quota and endpoint is not None and skip_credential_of(call, endpoint):
        verdict = replace(verdict, retry=True, stop=None)
    call._retryable, call._failure_limit = verdict.retry, verdict.limit
    # A quota 429 the key's pacer takes, while the call has paced retries left.
    call._paced_next = call._quota_refusal and verdict.retry and _paced_left(call)
    if call._paced_next:
        call._requeue_next = False
        return True
    # A shed the server says came before any processing, with a limiter to queue in.
    call._requeue_next = call.core.limiter is not None and verdict.requeue
    if not (call._requeue_next or verdict.retry):
        _stopped(call, verdict.stop or StopReason.NOT_RETRYABLE)
        return False
    return True


def _wait(call: CallBase, state: tenacity.RetryCallState) -> float:
    """The wait before the next attempt; for a shed, first whether it is requeued.
    A requeue the requeue budget (or the deadline, or open breakers) refuses is
    then an ordinary retry, if the retry policy and the retry budget allow one.
    A retry's endpoint is chosen here, since it decides the wait and whether the
    retry is a failover."""
    error = _outcome_error(state)
    call._forced_stop = None
    call._next_target, call._failover = None, False
    if call._paced_next:
        call._next_delay = 0.0  # the key's pacer holds the call (``pace``)
        return 0.0
    if call._requeue_next:
        # Back in the local queue at once when the limit is full of other calls:
        # the slot it waits for is one the server has room behind.
        delay = 0.0 if not _requeue_must_wait(call) else _retry_delay(call, error, None)
        refusal = _requeue_refusal(call, delay)
        if refusal is None:
            call._next_delay = delay
            return delay
        call._requeue_next = False
        if not call._retryable:
            call._forced_stop = refusal
            call._next_delay = 0.0
            return 0.0
    call._next_target, call._failover = _retry_target(call)
    call._next_delay = _retry_delay(call, error, call._next_target)
    return call._next_delay


def _retry_target(call: CallBase) -> tuple[EndpointState | None, bool]:
    """The endpoint of the next retry (None: none can take it), and whether the
    retry is a **failover**: to an endpoint this call has not tried, which has
    room by its own signals (not paused by its limiter, no fresh shed in its
    load headers). A failover adds nothing to the endpoint that failed, so it is
    not paid from the retry budget that protects that endpoint; it takes a slot
    of the new endpoint's concurrency limit like any call (docs/retries.md)."""
    try:
        target = pick_endpoint(call, retry=True)
    except CircuitOpenError:
        return None, False
    return target, target.name not in call._tried and has_room_for(call, target)


def _retry_delay(
    call: CallBase, error: BaseException | None, target: EndpointState | None
) -> float:
    policy = call.core.retry_policy
    if call._failover:
        # The failed endpoint sees nothing more of this call and the new one has
        # room: a wait would only delay the caller (its limiter still paces it).
        return 0.0
    last = call._endpoint.name if call._endpoint is not None else call._last_endpoint
    elsewhere = can_retry_elsewhere(call) if target is None else target.name != last
    if elsewhere:
        # Retry-After is the advice of the server that sent it; a retry that goes
        # to another, healthy endpoint only needs the jittered backoff.
        return policy.backoff(call.attempt_number, call.core.rng)
    return policy.delay(
        error if error is not None else Exception(), call.attempt_number, call.core.rng
    )


def _requeue_refusal(call: CallBase, delay: float) -> StopReason | None:
    """Why a shed cannot be requeued after ``delay`` (None: it can, budget spent).
    A restart shed needs no budget: the endpoint is paused for its Retry-After and
    then probed one call at a time, so its requeues are paced by the pause itself
    (the calls that were in flight at the crash cost one attempt each)."""
    limiter = call.core.limiter
    assert limiter is not None
    if not call.deadline.allows_sleep(delay):
        return StopReason.DEADLINE
    if not any_endpoint_accepting(call):
        return StopReason.CIRCUIT_OPEN
    if call._failure_limit is LimitOutcome.RESTARTING:
        return None
    if not limiter.requeue_budget.try_spend():
        call.core.stats.requeue_refusal()
        return StopReason.REQUEUE_BUDGET
    return None


def _requeue_must_wait(call: CallBase) -> bool:
    """Whether a requeue needs the server's Retry-After (or a backoff) first. Not
    when another endpoint can take the call, nor when the shed endpoint's slots
    are all taken by other calls: then the wait is for a slot a completion frees,
    behind a limit the shed just lowered. A shed with slots to spare came from
    load this client does not make: the server's advice is all there is."""
    limiter, endpoint = call.core.limiter, call._endpoint
    if limiter is None or endpoint is None or can_retry_elsewhere(call):
        return False
    return not limiter.endpoint(endpoint.name).full_without(1 if call._lease else 0)


def _paced_left(call: CallBase) -> bool:
    gate, quota = call.core.quota, call._quota
    return gate is not None and quota is not None and quota.paced <= gate.policy.max_paced_retries


def _stop(call: CallBase, state: tenacity.RetryCallState) -> bool:
    if call._paced_next:
        if not call.deadline.expired:
            return False  # the pacer fails the call its deadline cannot fit
        reason = StopReason.DEADLINE
    elif call._requeue_next:
        return False  # ``_wait`` checked it
    elif call._forced_stop is not None:
        reason = call._forced_stop
    elif call.attempt_number - call._requeues - call._paced >= call.core.retry_policy.max_attempts:
        reason = StopReason.MAX_ATTEMPTS
    # tenacity (>= 8.3) computes the wait before it asks stop: the wait this stop
    # decides on is the one about to be slept.
    elif not call.deadline.allows_sleep(state.upcoming_sleep):
        reason = StopReason.DEADLINE
    elif call._next_target is None and not any_endpoint_accepting(call):
        reason = StopReason.CIRCUIT_OPEN
    elif call._failover:
        return False  # paid by nobody: the failed endpoint sees no more of this call
    elif not call.core.budget.try_spend():
        call.core.stats.budget_refusal()
        if call._trace is not None:
            call._trace.on_event(BudgetRefused(call.core.budget.state()))
        reason = StopReason.BUDGET
    else:
        return False
    _stopped(call, reason)
    return True


def _before_sleep(call: CallBase, state: tenacity.RetryCallState) -> None:
    call._resending = call._requeue_next or call._paced_next
    if call._paced_next:
        call._paced += 1
        call.core.stats.paced()
        outcome = PACED
    elif call._requeue_next:
        call._requeues += 1
        call.core.stats.requeue()
        outcome = REQUEUED
    elif call._failover:
        call.core.stats.failover()
        outcome = FAILOVER
    else:
        outcome = RETRY
    close_record(call, outcome)
    call.machine.step("back_off")
    call._delay_before = call._next_delay
    _logs.retrying(
        outcome=outcome,
        attempt=call.attempt_number,
        method=call.spec.method,
        path=call.spec.path,
        endpoint=call._endpoint.name if call._endpoint is not None else call._last_endpoint,
        error=_outcome_error(state),
        wait=call._next_delay,
        redactor=call.redactor,
    )


def _stopped(call: CallBase, reason: StopReason) -> None:
    call.retry_stopped_by = reason
    close_record(call, reason)
    call.machine.step("stop")
    _logs.retry_stopped(
        reason=reason,
        attempt=call.attempt_number,
        error=call._attempt_error,
        redactor=call.redactor,
    )


def _raise_last_error(state: tenacity.RetryCallState) -> NoReturn:
    """The stopped loop raises the last attempt's error, as ``reraise=True`` does, but
    from a frame that holds only ``state`` (whose outcome ``call_flow`` then clears):
    the frames of tenacity's own re-raise hold the error, and its traceback them."""
    raise state.outcome.exception()  # type: ignore[union-attr,misc]


def _outcome_error(state: tenacity.RetryCallState) -> BaseException | None:
    outcome = state.outcome
    if outcome is None or not outcome.failed:
        return None
    return outcome.exception()
