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
from typing import TYPE_CHECKING, Any, NoReturn

import tenacity

from .._core import logs as _logs
from .._core.exceptions import CircuitOpenError
from .._core.stop_reason import StopReason
from .._core.verdict import LimitOutcome, classify
from ..telemetry._events import BudgetRefused
from .attempt_record import AttemptRecords
from .call_base import FAILOVER, PACED, REQUEUED, RETRY

if TYPE_CHECKING:
    from .._policies.routing.endpoint_state import EndpointState


__all__ = ["RetryLoop"]


class RetryLoop(AttemptRecords):
    """tenacity's strategies, bound to the call."""

    def retrying_kwargs(self) -> dict[str, Any]:
        """Strategies for ``tenacity.Retrying``/``AsyncRetrying``; the driver adds ``sleep``."""
        return {
            "retry": self._retry,
            "wait": self._wait,
            "stop": self._stop,
            "before_sleep": self._before_sleep,
            "reraise": True,
            "retry_error_callback": _raise_last_error,
        }

    def attempt_judged(self) -> None:
        """An attempt's outcome is being judged: a stream's first-chunk bound is over,
        the retry is decided on the call's total. ``retry`` starts with it; the call
        flow calls it for a first attempt that succeeded (no loop was built)."""
        if self.stream_bounds is not None:
            self.stream_bounds.attempt_over()

    def _retry(self, state: tenacity.RetryCallState) -> bool:
        self.attempt_judged()
        error = _outcome_error(state)
        if error is None:
            return False
        verdict = classify(error, self.core.retry_policy)
        endpoint = self._endpoint
        # That deployment's account has no credit; another's may: a retry there.
        if verdict.out_of_quota and endpoint is not None and self._skip_credential_of(endpoint):
            verdict = replace(verdict, retry=True, stop=None)
        self._retryable, self._failure_limit = verdict.retry, verdict.limit
        # A quota 429 the key's pacer takes, while the call has paced retries left.
        self._paced_next = self._quota_refusal and verdict.retry and self._paced_left()
        if self._paced_next:
            self._requeue_next = False
            return True
        # A shed the server says came before any processing, with a limiter to queue in.
        self._requeue_next = self.core.limiter is not None and verdict.requeue
        if not (self._requeue_next or verdict.retry):
            self._stopped(verdict.stop or StopReason.NOT_RETRYABLE)
            return False
        return True

    def _wait(self, state: tenacity.RetryCallState) -> float:
        """The wait before the next attempt; for a shed, first whether it is requeued.
        A requeue the requeue budget (or the deadline, or open breakers) refuses is
        then an ordinary retry, if the retry policy and the retry budget allow one.
        A retry's endpoint is chosen here, since it decides the wait and whether the
        retry is a failover."""
        error = _outcome_error(state)
        self._forced_stop = None
        self._next_target, self._failover = None, False
        if self._paced_next:
            self._next_delay = 0.0  # the key's pacer holds the call (``pace``)
            return 0.0
        if self._requeue_next:
            # Back in the local queue at once when the limit is full of other calls:
            # the slot it waits for is one the server has room behind.
            delay = 0.0 if not self._requeue_must_wait() else self._retry_delay(error, None)
            refusal = self._requeue_refusal(delay)
            if refusal is None:
                self._next_delay = delay
                return delay
            self._requeue_next = False
            if not self._retryable:
                self._forced_stop = refusal
                self._next_delay = 0.0
                return 0.0
        self._next_target, self._failover = self._retry_target()
        self._next_delay = self._retry_delay(error, self._next_target)
        return self._next_delay

    def _retry_target(self) -> tuple[EndpointState | None, bool]:
        """The endpoint of the next retry (None: none can take it), and whether the
        retry is a **failover**: to an endpoint this call has not tried, which has
        room by its own signals (not paused by its limiter, no fresh shed in its
        load headers). A failover adds nothing to the endpoint that failed, so it is
        not paid from the retry budget that protects that endpoint; it takes a slot
        of the new endpoint's concurrency limit like any call (docs/retries.md)."""
        try:
            target = self._pick_endpoint(retry=True)
        except CircuitOpenError:
            return None, False
        return target, target.name not in self._tried and self._has_room_for(target)

    def _retry_delay(self, error: BaseException | None, target: EndpointState | None) -> float:
        policy = self.core.retry_policy
        if self._failover:
            # The failed endpoint sees nothing more of this call and the new one has
            # room: a wait would only delay the caller (its limiter still paces it).
            return 0.0
        last = self._endpoint.name if self._endpoint is not None else self._last_endpoint
        elsewhere = self._can_retry_elsewhere() if target is None else target.name != last
        if elsewhere:
            # Retry-After is the advice of the server that sent it; a retry that goes
            # to another, healthy endpoint only needs the jittered backoff.
            return policy.backoff(self.attempt_number, self.core.rng)
        return policy.delay(
            error if error is not None else Exception(), self.attempt_number, self.core.rng
        )

    def _requeue_refusal(self, delay: float) -> StopReason | None:
        """Why a shed cannot be requeued after ``delay`` (None: it can, budget spent).
        A restart shed needs no budget: the endpoint is paused for its Retry-After and
        then probed one call at a time, so its requeues are paced by the pause itself
        (the calls that were in flight at the crash cost one attempt each)."""
        limiter = self.core.limiter
        assert limiter is not None
        if not self.deadline.allows_sleep(delay):
            return StopReason.DEADLINE
        if not self.any_endpoint_accepting():
            return StopReason.CIRCUIT_OPEN
        if self._failure_limit is LimitOutcome.RESTARTING:
            return None
        if not limiter.requeue_budget.try_spend():
            self.core.stats.requeue_refusal()
            return StopReason.REQUEUE_BUDGET
        return None

    def _requeue_must_wait(self) -> bool:
        """Whether a requeue needs the server's Retry-After (or a backoff) first. Not
        when another endpoint can take the call, nor when the shed endpoint's slots
        are all taken by other calls: then the wait is for a slot a completion frees,
        behind a limit the shed just lowered. A shed with slots to spare came from
        load this client does not make: the server's advice is all there is."""
        limiter, endpoint = self.core.limiter, self._endpoint
        if limiter is None or endpoint is None or self._can_retry_elsewhere():
            return False
        return not limiter.endpoint(endpoint.name).full_without(1 if self._lease else 0)

    def _paced_left(self) -> bool:
        gate, quota = self.core.quota, self._quota
        return (
            gate is not None and quota is not None and quota.paced <= gate.policy.max_paced_retries
        )

    def _stop(self, state: tenacity.RetryCallState) -> bool:
        if self._paced_next:
            if not self.deadline.expired:
                return False  # the pacer fails the call its deadline cannot fit
            reason = StopReason.DEADLINE
        elif self._requeue_next:
            return False  # ``_wait`` checked it
        elif self._forced_stop is not None:
            reason = self._forced_stop
        elif (
            self.attempt_number - self._requeues - self._paced
            >= self.core.retry_policy.max_attempts
        ):
            reason = StopReason.MAX_ATTEMPTS
        # tenacity (>= 8.3) computes the wait before it asks stop: the wait this stop
        # decides on is the one about to be slept.
        elif not self.deadline.allows_sleep(state.upcoming_sleep):
            reason = StopReason.DEADLINE
        elif self._next_target is None and not self.any_endpoint_accepting():
            reason = StopReason.CIRCUIT_OPEN
        elif self._failover:
            return False  # paid by nobody: the failed endpoint sees no more of this call
        elif not self.core.budget.try_spend():
            self.core.stats.budget_refusal()
            if self._trace is not None:
                self._trace.on_event(BudgetRefused(self.core.budget.state()))
            reason = StopReason.BUDGET
        else:
            return False
        self._stopped(reason)
        return True

    def _before_sleep(self, state: tenacity.RetryCallState) -> None:
        self._resending = self._requeue_next or self._paced_next
        if self._paced_next:
            self._paced += 1
            self.core.stats.paced()
            outcome = PACED
        elif self._requeue_next:
            self._requeues += 1
            self.core.stats.requeue()
            outcome = REQUEUED
        elif self._failover:
            self.core.stats.failover()
            outcome = FAILOVER
        else:
            outcome = RETRY
        self._close_record(outcome)
        self.machine.step("back_off")
        self._delay_before = self._next_delay
        _logs.retrying(
            outcome=outcome,
            attempt=self.attempt_number,
            method=self.spec.method,
            path=self.spec.path,
            endpoint=self._endpoint.name if self._endpoint is not None else self._last_endpoint,
            error=_outcome_error(state),
            wait=self._next_delay,
            redactor=self.redactor,
        )

    def _stopped(self, reason: StopReason) -> None:
        self.retry_stopped_by = reason
        self._close_record(reason)
        self.machine.step("stop")
        _logs.retry_stopped(
            reason=reason,
            attempt=self.attempt_number,
            error=self._attempt_error,
            redactor=self.redactor,
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
