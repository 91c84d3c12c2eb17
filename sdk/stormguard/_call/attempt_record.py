"""One attempt's bookkeeping: its response and failure, the deadline errors of
its reads, its settling with the limiter, the breaker, outlier ejection and
the throttle (one ``Verdict`` read by each), and its ``AttemptRecord``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._core.exceptions import APIError, APIStatusError, APITimeoutError
from .._core.history import AttemptRecord
from .._core.http import httpx
from .._core.rate_limit_headers import RateLimit
from .._core.verdict import LimitOutcome, classify
from .._policies.breaker.states import CircuitState
from .._policies.routing.ejection_rules import evidence_of
from ..protocol import ServerLoad
from ..telemetry._events import AttemptEnded
from .call_base import OK
from .call_state import ATTEMPT_OPEN, IN_FLIGHT
from .endpoint_choice import EndpointChoice

if TYPE_CHECKING:
    from .._policies.routing.endpoint_state import EndpointState
    from ..tokens import TokenRateLimiter


__all__ = ["AttemptRecords"]


class AttemptRecords(EndpointChoice):
    """The bookkeeping of one attempt, from its response to its record."""

    def saw_response(self, response: httpx.Response) -> None:
        """Note the status and load headers of the attempt's response."""
        self.machine.step("saw_response")
        # One pass over the headers: httpx.Headers.get scans them all on each of the
        # dozen look-ups the parser makes (about 20 us a call, measured).
        headers = dict(response.headers.items())
        load = ServerLoad.from_headers(headers)
        self.server_load = self.redactor.scrub_load(load)
        self.rate_limit = RateLimit.from_headers(headers)
        if self._endpoint is not None:
            self.core.picker.observe(self._endpoint, self.server_load)
        policy = self.core.token_policy
        bucket = policy.rate_limiter if policy is not None else None
        if bucket is not None and self.rate_limit.remaining_tokens is not None:
            self._tokens_left(bucket, self.rate_limit.remaining_tokens)
        self._quota_observed(response.status_code)
        self._note(response.status_code, None)

    def _tokens_left(self, bucket: TokenRateLimiter, remaining: int) -> None:
        """The server's count of this caller's tokens beats the local estimate: the
        client's bucket holds no more (``observe``, never below empty). When none is
        left, this endpoint takes no call before the reset, at most ``MAX_PAUSE_S``:
        one server's headers are its own word, as its Retry-After is, and never stop
        the calls to another endpoint (a spent quota there is reported there)."""
        bucket.observe(remaining, None)
        reset = self.rate_limit.reset_tokens
        limiter, endpoint = self.core.limiter, self._endpoint
        if remaining == 0 and reset and limiter is not None and endpoint is not None:
            limiter.endpoint(endpoint.name).pause(reset)

    def failed(self, error: APIError) -> APIError:
        """Record that the attempt ended in ``error`` and return it, to be raised
        (scrubbed of secrets: it may quote a library's text, an httpx error's), with
        the attempt's request as its ``request``."""
        if error.request is None:
            error.request = self._request
        if error.rate_limit.is_empty:
            error.rate_limit = self.rate_limit
        self.redactor.scrub_error(error)
        self._attempt_error = error
        if isinstance(error, APIStatusError) and error.status_code == 429:
            self._quota_refusal = self._quota_refused(error)
        self.machine.step("failed")
        self._settle(None, error)
        if self._pending is None or self._pending[1] is None:
            status = self._pending[0] if self._pending else getattr(error, "status_code", None)
            self._note(status, type(error).__name__)
        return error

    def deadline_passed(self, doing: str, *, response_started: bool = False) -> APIError:
        """The error, recorded, of an attempt that the call's deadline ended ``doing``
        something (a cancel scope fired, or a check between two reads)."""
        return self.failed(self.deadline_error(doing, response_started=response_started))

    def deadline_error(self, doing: str, *, response_started: bool = False) -> APIError:
        """The error of a deadline that passed ``doing`` something, not recorded; a
        stream's bound that passed says which it was, and a first chunk's is retried."""
        bounds = self.stream_bounds
        reason = None if bounds is None else bounds.timeout_reason()
        message = f"The call's deadline passed {doing}"
        if bounds is not None and reason is not None:
            message = f"{reason[0].upper()}{reason[1:]} {doing}"
            response_started = response_started and not bounds.first_chunk_passed
        return APITimeoutError(
            message, response_started=response_started, server_load=self.server_load
        )

    def failed_reading(self, error: APIError) -> APIError:
        """A body reader's error: the failure of the attempt while it is in flight
        (``failed``); after the hand-over the error as it is, which the reader's
        caller ends the call with (``failed_after_hand_over``)."""
        return self.failed(error) if self.machine.state in IN_FLIGHT else error

    def _note(self, status: int | None, error_type: str | None) -> None:
        self._pending = (status, error_type, self.core.clock.now() - self._started)

    def _close_record(self, outcome: str) -> None:
        """Close the attempt's record with ``outcome`` (settling an attempt still in
        flight first); the caller then takes the step the outcome leads to."""
        if self.machine.state not in ATTEMPT_OPEN:
            return  # no attempt was sent (refused before it: open breaker, throttle)
        status, error_type, duration = self._pending or (None, None, 0.0)
        if self._pending is None:
            duration = self.core.clock.now() - self._started
        if self.machine.state in IN_FLIGHT:
            self._settle(outcome, None if outcome == OK else self._attempt_error)
        lease = self._lease
        if outcome != OK or not self.spec.stream:
            self.release_slot()  # a stream holds its slot until it ends (``ended``)
        if self._trace is not None:
            self._trace.on_event(
                AttemptEnded(outcome, status, error_type, self.server_load, duration)
            )
        quota_wait = 0.0
        if self._quota is not None:
            quota_wait, self._quota.attempt_wait = self._quota.attempt_wait, 0.0
        endpoint = self._endpoint
        deployment = tier = None
        if endpoint is not None and endpoint.provider is not None:
            deployment, tier = endpoint.name, endpoint.tier
        if endpoint is not None:
            self.core.picker.finished(endpoint)
            self._last_endpoint = endpoint.name
            self._endpoint = None
        self.history.append(
            AttemptRecord(
                number=self.attempt_number,
                status_code=status,
                error_type=error_type,
                delay_before=self._delay_before,
                duration=duration,
                outcome=outcome,
                endpoint=endpoint.name if endpoint is not None else None,
                model=self.spec.model,
                queued=self._queued_before,
                concurrency_limit=None if lease is None else lease.limit,
                started_at=self._started,
                quota_wait=quota_wait,
                deployment=deployment,
                tier=tier,
            )
        )
        if deployment is not None and tier is not None:
            self.core.tier_watch.attempted(deployment, tier, outcome)
        self._pending = None

    def _settle(self, outcome: str | None, error: BaseException | None = None) -> None:
        """Tell the breaker and the throttle how the attempt in flight went, once: as
        soon as it failed (so the retry decision sees an opened breaker) or when it
        ended. Nothing is told of a cancelled attempt: that says nothing about the
        server."""
        permit, self._permit = self._permit, None
        if outcome == "cancelled":
            if permit is not None:
                permit.ignore()
            return
        verdict = classify(error, self.core.retry_policy)  # read by each policy below
        if self._lease is not None:
            # A stream settles at its first chunk: the time so far is its first token's.
            ttft = self.core.clock.now() - self._started if self.spec.stream else None
            # A quota 429 the pacer paces is the caller's rate, not the server's load.
            limit = LimitOutcome.IGNORED if self._quota_refusal else verdict.limit
            self._lease.mark(limit, self.server_load, ttft)
        if permit is not None:
            permit.settle(error, verdict=verdict)
            if self._endpoint is not None and verdict.breaker_failure:
                self._after_breaker_failure(self._endpoint)
        ejection, endpoint = self.core.ejection, self._endpoint
        if ejection is not None and endpoint is not None:
            evidence = evidence_of(error, response_seen=self._pending is not None, verdict=verdict)
            if ejection.record(endpoint, evidence, sent_at=self._started):
                self._after_ejection(endpoint)
        if self.core.throttle is not None:
            self.core.throttle.record(error, verdict=verdict)

    def _after_breaker_failure(self, endpoint: EndpointState) -> None:
        """An endpoint whose breaker this failure opened gets a recovery ramp: its
        concurrency limit starts from the bottom when calls return."""
        registry, limiter = self.core.breakers, self.core.limiter
        if registry is None or limiter is None:
            return
        if registry.get(endpoint.name, self.spec.model).state is CircuitState.OPEN:
            limiter.endpoint(endpoint.name).went_down()

    def _after_ejection(self, endpoint: EndpointState) -> None:
        """An ejected endpoint gets the same recovery ramp as one whose breaker
        opened: when it returns, its limit starts from the bottom."""
        if self.core.limiter is not None:
            self.core.limiter.endpoint(endpoint.name).went_down()
