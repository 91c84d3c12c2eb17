"""One logical call, from first attempt to final answer, without any I/O.

``LogicalCall`` holds every decision of a call: the deadline, the headers and
timeout of each attempt, whether a failure is retried, how long to wait, when
to stop and why, and the attempt history. tenacity runs the loop: the call
hands ``tenacity.Retrying`` (sync) or ``tenacity.AsyncRetrying`` (async) its
``retry``/``wait``/``stop`` strategies, so the drivers in ``_client.py`` and
``_async_client.py`` contain only I/O: send, read, sleep.

Before each attempt the call takes a slot of its endpoint's concurrency limit
(``_limiter.py``), waiting in the local queue when the endpoint is at its limit;
the driver does the waiting.

Order of the checks after a failed attempt (tenacity's own order):
``retry`` (is this failure retryable at all?) → ``wait`` (Retry-After or
jittered backoff) → ``stop`` (attempts left? time left for the wait and an
attempt? budget left?). The budget is asked last, so a retry that the attempt
limit or the deadline already forbids never spends it.

A shed before processing (``is_shed``) is not a retry but a **requeue**: the
call goes back to the local queue where it stood, paid from the limiter's
requeue budget instead of the retry budget, not counted against
``max_attempts``, and sent with the same ``x-stormguard-attempt`` (the server
never worked on it; gRPC's transparent retry, Finagle's requeue).
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Generator, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import tenacity

from . import _logs
from ._body import BodyLimit, BodyTooLargeError, read_response
from ._breaker import CircuitState
from ._call_state import ATTEMPT_OPEN, IN_FLIGHT, CallMachine, CallState
from ._deadline import Deadline
from ._ejection import evidence_of
from ._events import (
    AttemptEnded,
    AttemptStarted,
    BudgetRefused,
    CallEnded,
    CallStarted,
    FellBack,
    FirstChunk,
    PrecheckPassed,
    ResponseSummary,
)
from ._exceptions import (
    APIError,
    APIResponseValidationError,
    APITimeoutError,
    CircuitOpenError,
    StormguardError,
    ThrottledError,
)
from ._history import AttemptRecord
from ._http import httpx, response_types
from ._limiter import Lease, SlotWaiter
from ._models import APIResult, CallInfo, Record, output_text_of
from ._prompt_view import precheck_view
from ._rate_limit_headers import RateLimit
from ._responses import (
    error_from_response,
    parse_json_object,
    request_id_of,
    result_from_response,
)
from ._stop_reason import StopReason
from ._stream_timeouts import StreamBounds, StreamTimeouts
from ._streaming import _StreamBase
from ._verdict import LimitOutcome, classify
from .openai_errors import as_openai_error
from .protocol import (
    HEADER_ATTEMPT,
    HEADER_DEADLINE_MS,
    HEADER_PRIORITY,
    HEADER_REQUEUE,
    Priority,
    ServerLoad,
    parse_priority,
)

if TYPE_CHECKING:
    from ._base_client import ClientCore
    from ._breaker import Permit
    from ._endpoints import EndpointState
    from ._events import CallObserver
    from ._options import AttemptTimeouts
    from .tokens import Precheck, Reservation

PrecheckFlow = Generator[httpx.Request, "httpx.Response | None", "Precheck"]

#: What a call hands the caller besides its result: nothing (""), the final response
#: with its body read ("response": ``.with_raw_response``), or the final response
#: before its body is read ("unread": ``.with_streaming_response``).
HandOver = Literal["", "response", "unread"]

__all__ = ["BodyReader", "CallSpec", "Delivery", "HandOver", "LogicalCall"]

R = TypeVar("R", bound=APIResult)

_OK = "ok"
_RETRY = "retry"
_FAILOVER = "failover"
_REQUEUED = "requeued"
_NO_SCOPE: AbstractContextManager[None] = contextlib.nullcontext()


@dataclass(frozen=True, slots=True)
class CallSpec:
    """What the facade asks for: one logical call."""

    method: str
    path: str
    result_type: type[APIResult]
    operation: str
    body: Mapping[str, Any] | None = None
    stream: bool = False
    chunk_type: type[Record] | None = None
    model: str | None = None
    timeout: float | None = None
    #: Bounds of each attempt's connect, write and pool wait (None: the client's).
    attempt_timeouts: AttemptTimeouts | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    #: Transport mode (``stormguard.httpx_client``): hand back httpx responses, not records.
    raw: bool = False
    #: A URL outside the client's endpoints (transport mode): sent as it is.
    absolute_url: str | None = None
    #: Pre-encoded body (transport mode passes the caller's bytes through unchanged).
    content: bytes | None = None
    #: What the caller gets besides the result (``with_raw_response`` and the like).
    hand_over: HandOver = ""
    #: A stream's first-chunk, idle and overall bounds (None: the client's).
    stream_timeouts: StreamTimeouts | None = None

    @property
    def replays_stream(self) -> bool:
        """Whether a stream's bytes read before its first chunk are kept, to be handed
        on as they came (transport mode, ``with_streaming_response``)."""
        return self.raw or self.hand_over == "unread"


@dataclass(slots=True)
class Delivery:
    """What a call in a hand-over mode returns to the facade: the final attempt's
    response and what it carries (``_raw_response.py`` wraps it for the caller)."""

    call: LogicalCall
    #: The final attempt's response: its body read ("response" mode, a non-stream),
    #: or open (a stream, or a body not read yet).
    response: httpx.Response
    #: The result, the ``Stream``/``AsyncStream``, or None: a body not read yet.
    result: Any
    info: CallInfo
    #: The final attempt's time from sending to the end of its body (None: not over).
    elapsed: timedelta | None = None


class LogicalCall:
    """State and decisions of one logical call; created per call, used by one driver."""

    def __init__(self, core: ClientCore, spec: CallSpec) -> None:
        self.core = core
        self.spec = spec
        self.deadline = Deadline(core.clock, spec.timeout)
        #: A stream's first-chunk, idle and overall bounds, held in ``deadline``
        #: (``_stream_timeouts.py``); None: the deadline alone bounds the call.
        self.stream_bounds = (
            StreamBounds.of(
                core.stream_timeouts if spec.stream_timeouts is None else spec.stream_timeouts,
                self.deadline,
                core.clock,
            )
            if spec.stream
            else None
        )
        #: Where the call is (``_call_state.py``): each step below moves it, and a
        #: step out of order raises ``CallProtocolError``.
        self.machine = CallMachine()
        self.history: list[AttemptRecord] = []
        self.retry_stopped_by: StopReason | None = None
        self.attempt_number = 0
        self.server_load = ServerLoad()
        #: The ``x-ratelimit-*`` headers of the last response.
        self.rate_limit = RateLimit()
        self._content = spec.content
        if self._content is None and spec.body is not None:
            self._content = json.dumps(spec.body, separators=(",", ":")).encode()

        self._endpoint: EndpointState | None = None
        self._endpoint_choice: EndpointState | None = None
        self._last_endpoint: str | None = None
        #: Endpoints this call has sent an attempt to (a failover goes only to others).
        self._tried: set[str] = set()
        #: The endpoint the next retry goes to, chosen when it was decided.
        self._next_target: EndpointState | None = None
        #: The next retry is a failover: to an endpoint not tried yet, outside the budget.
        self._failover = False
        self._permit: Permit | None = None
        #: The request of the current (or last) attempt: the ``request`` of its errors.
        self._request: httpx.Request | None = None
        self._attempt_error: BaseException | None = None
        self._delay_before = 0.0
        self._next_delay = 0.0
        self._started = 0.0
        self._pending: tuple[int | None, str | None, float] | None = None
        self.precheck: Precheck | None = None
        self._reservation: Reservation | None = None
        #: "response" mode: the final response rebuilt with its body, and its elapsed.
        self._read: tuple[httpx.Response, timedelta] | None = None
        #: "unread" mode: what the result will say of the call, once its body is read.
        self._unread_info: CallInfo | None = None
        self.total_attempts = 0
        #: Models still to try when this one cannot serve (``fallback_models``).
        self.fallbacks = [m for m in core.fallback_models if m != spec.model]
        #: The model first asked for, once the call has moved to a fallback.
        self.degraded_from: str | None = None
        core.budget.record_call()
        core.stats.call()
        limiter = core.limiter
        #: The concurrency slot of the current attempt (None: no limiter, or none held).
        self._lease: Lease | None = None
        #: The call's class (its ``x-priority``): its pool of endpoints, its queue rank.
        self.priority = self._priority()
        self._limit_key: tuple[int, int] = (Priority.STANDARD.rank, 0)
        if limiter is not None:
            limiter.requeue_budget.record_call()
            self._limit_key = (self.priority.rank, limiter.next_seq())
        #: Requeues on the current model (sheds sent back to the local queue).
        self._requeues = 0
        self._requeue_next = False
        #: The next attempt resends a requeued call (not a retry).
        self._resending = False
        #: The last failed attempt is worth a retry (its ``Verdict``), and whether a
        #: shed can be requeued after it (the limiter's ``LimitOutcome`` of it).
        self._retryable = False
        self._failure_limit = LimitOutcome.IGNORED
        self._forced_stop: StopReason | None = None
        self._queued_before = 0.0
        #: Seconds the call spent in the local queue, over every attempt.
        self.queued_s = 0.0
        #: The call's observer (telemetry); None when nothing is recorded: no events then.
        self._trace: CallObserver | None = None
        #: Scrubs the client's credentials, and this call's own, from what it shows.
        self.redactor = core.redactor.including(headers=spec.headers, url=spec.absolute_url)
        if core.observer is not None:
            self._trace = core.observer.start_call(self._started_event())

    def _priority(self) -> Priority:
        """The call's ``x-priority``: its own header, else the client's."""
        for name, value in self.spec.headers.items():
            if name.lower() == HEADER_PRIORITY:
                return parse_priority({HEADER_PRIORITY: value})
        return self.core.priority

    # -- telemetry: events for the call's observer ----------------------------------------

    def _started_event(self) -> CallStarted:
        spec, body = self.spec, self.spec.body
        max_tokens = None
        if body is not None:
            value = body.get(
                "max_tokens", body.get("max_completion_tokens", body.get("max_output_tokens"))
            )
            max_tokens = value if isinstance(value, int) else None
        return CallStarted(
            operation=spec.operation,
            model=spec.model,
            stream=spec.stream,
            max_tokens=max_tokens,
            server_address=self.core.server_address,
            server_port=self.core.server_port,
            body=body,
            scrub=self.redactor.scrub,
        )

    def observing(self) -> AbstractContextManager[None]:
        """Entered by the driver around the whole call: the observer's active scope, and
        the call's end when an exception (cancellation included) leaves it."""
        return _NO_SCOPE if self._trace is None else self._observing(self._trace)

    @contextlib.contextmanager
    def _observing(self, trace: CallObserver) -> Iterator[None]:
        with trace.active():
            try:
                yield
            except BaseException as exc:
                self.ended(exc)
                raise

    def sending(self) -> AbstractContextManager[None]:
        """Entered by the driver around the HTTP send of an attempt."""
        return _NO_SCOPE if self._trace is None else self._trace.sending()

    def first_chunk(self, response_id: str | None, response_model: str | None) -> None:
        if self._trace is not None:
            self._trace.on_event(FirstChunk(response_id, response_model))

    def ended(
        self,
        error: BaseException | None = None,
        *,
        cancelled: bool = False,
        response: ResponseSummary | None = None,
    ) -> None:
        """The call is over (result, final error, or the caller left); only the first
        report counts. A cancellation is the caller's choice, not the call's failure."""
        if error is not None and self._lease is not None:
            # A stream that failed after its first chunk (cut by a crash, timed out):
            # its success at the first chunk must not raise the limit.
            self._lease.mark(classify(error).limit_after_first_chunk, self._lease.load)
        self.release_slot()
        if self.machine.step("end") is CallState.DONE or self._trace is None:
            return  # only the first report counts
        if error is not None and not isinstance(error, Exception):
            error, cancelled = None, True  # CancelledError, KeyboardInterrupt, GeneratorExit
        self._trace.on_event(
            CallEnded(
                error=error,
                cancelled=cancelled,
                model=self.spec.model,
                degraded_from=self.degraded_from,
                attempts=self.total_attempts,
                retry_stopped_by=self.retry_stopped_by,
                response=response,
                budget=self.core.budget.state(),
                queued=self.queued_s,
            )
        )

    # -- the token pre-check, before any attempt ----------------------------------------

    def precheck_flow(self) -> PrecheckFlow | None:
        """The token pre-check of this call (None when there is nothing to check): a
        flow the driver runs with ``run_precheck_sync``/``run_precheck_async``. It
        raises ``ContextWindowExceededError`` before any attempt is made."""
        policy = self.core.token_policy
        view = precheck_view(self.spec)  # what the check reads of the body (_prompt_view.py)
        if policy is None or view is None or self.spec.model is None:
            return None
        kind, body = view
        self.machine.step("precheck")
        flow = policy.precheck_flow(self.spec.model, kind, body, base_url=self.core.base_url)
        return self._with_client_headers(flow)

    def _with_client_headers(self, flow: PrecheckFlow) -> PrecheckFlow:
        # The lookups (/models, /tokenize) go to the same server as the call and need
        # its credentials; the flow itself knows nothing of them.
        try:
            request = next(flow)
            while True:
                for name in ("authorization", "user-agent"):
                    if name in self.core.headers and name not in request.headers:
                        request.headers[name] = self.core.headers[name]
                request = flow.send((yield request))
        except StopIteration as stop:
            result: Precheck = stop.value
            return result

    def prechecked(self, check: Precheck) -> float:
        """Apply a passed pre-check: switch to the context fallback model if it chose
        one, and reserve the token cost with the rate limiter. Returns the seconds to
        wait for the rate limiter (raises ``TokenRateLimitedError`` when that wait
        would pass the deadline)."""
        self.precheck = check
        if check.model != self.spec.model:
            self._switch_model(check.model)
        if self._reservation is not None:  # a fallback model's check replaces the last one
            self._reservation.cancel()
            self._reservation = None
        policy = self.core.token_policy
        if policy is None:
            return 0.0
        remaining = self.deadline.remaining()
        self._reservation = policy.reserve(
            check, max_wait=remaining if math.isfinite(remaining) else None
        )
        wait = self._reservation.wait if self._reservation is not None else 0.0
        if self._trace is not None:
            self._trace.on_event(
                PrecheckPassed(
                    check.model,
                    check.prompt_tokens,
                    check.max_tokens,
                    check.context_window,
                    check.counter,
                    wait,
                )
            )
        return wait

    def settle_tokens(self, total_tokens: object) -> None:
        """Refund the unused part of the rate-limit reservation once usage is known."""
        if self._reservation is not None and isinstance(total_tokens, int):
            self._reservation.settle(total_tokens)
            self._reservation = None

    # -- fallback to the next model ------------------------------------------------------

    def fall_back(self, error: BaseException) -> bool:
        """Move the call to the next fallback model if ``error`` allows it and time is
        left; the driver then runs a fresh retry loop (attempt numbers restart at 1, on
        the new model: it is not a retry of the old one). False: raise ``error``."""
        if not self.fallbacks or not classify(error).fallback or self.deadline.expired:
            return False
        if self.machine.state in ATTEMPT_OPEN:
            self._close_record(self.retry_stopped_by or StopReason.NOT_RETRYABLE)
            self.machine.step("stop")
        self.machine.step("fall_back")
        model = self.fallbacks.pop(0)
        if self._trace is not None:
            self._trace.on_event(FellBack(self.spec.model, model, type(error).__name__))
        self.degraded_from = self.degraded_from or self.spec.model
        self._switch_model(model)
        self.attempt_number = 0
        self._requeues = 0
        self._resending = False
        self._next_target = None
        self._failover = False
        self.retry_stopped_by = None
        self._delay_before = 0.0
        self.core.stats.fallback()
        return True

    def _switch_model(self, model: str) -> None:
        if self.spec.body is None:
            return
        body = dict(self.spec.body)
        body["model"] = model
        self.spec = replace(self.spec, model=model, body=body)
        self._content = json.dumps(body, separators=(",", ":")).encode()

    # -- the tenacity loop -------------------------------------------------------------

    def retrying_kwargs(self) -> dict[str, Any]:
        """Strategies for ``tenacity.Retrying``/``AsyncRetrying``; the driver adds ``sleep``."""
        return {
            "retry": self._retry,
            "wait": self._wait,
            "stop": self._stop,
            "before_sleep": self._before_sleep,
            "reraise": True,
        }

    def _retry(self, state: tenacity.RetryCallState) -> bool:
        if self.stream_bounds is not None:
            self.stream_bounds.attempt_over()  # the retry is decided on the call's total
        error = _outcome_error(state)
        if error is None:
            return False
        verdict = classify(error, self.core.retry_policy)
        self._retryable, self._failure_limit = verdict.retry, verdict.limit
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

    def _has_room_for(self, target: EndpointState) -> bool:
        if self.core.picker.shedding(target):
            return False
        limiter = self.core.limiter
        return limiter is None or limiter.endpoint(target.name).state().paused_for <= 0

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

    def _can_retry_elsewhere(self) -> bool:
        last = self._endpoint.name if self._endpoint is not None else self._last_endpoint
        return any(state.name != last and self._usable(state) for state in self._serving())

    def _stop(self, state: tenacity.RetryCallState) -> bool:
        if self._requeue_next:
            return False  # ``_wait`` checked it
        if self._forced_stop is not None:
            reason = self._forced_stop
        elif self.attempt_number - self._requeues >= self.core.retry_policy.max_attempts:
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
        self._resending = self._requeue_next
        if self._requeue_next:
            self._requeues += 1
            self.core.stats.requeue()
            outcome = _REQUEUED
        elif self._failover:
            self.core.stats.failover()
            outcome = _FAILOVER
        else:
            outcome = _RETRY
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

    # -- one attempt ---------------------------------------------------------------------

    def reserve(self) -> SlotWaiter | None:
        """Choose the endpoint of the next attempt and take a slot of its concurrency
        limit. Returns the waiter to wait on when the endpoint is at its limit (the
        driver waits, then hands the lease to ``granted``); None: go now."""
        self.machine.step("reserve")
        if self.stream_bounds is not None:
            self.stream_bounds.attempt_over()
        if self.deadline.expired:
            raise APITimeoutError("The call's deadline passed before the attempt could start")
        self._check_throttle()
        target, self._next_target = self._next_target, None
        if target is not None and self._usable(target):
            endpoint = target
        else:  # none chosen (a first attempt, a requeue), or it left rotation meanwhile
            endpoint = self._pick_endpoint(
                retry=self.attempt_number > 0 and not self._resending,
                untried_only=self._failover,
            )
        self._endpoint_choice = endpoint
        self._queued_before = 0.0
        limiter = self.core.limiter
        if limiter is None:
            return None
        rank, seq = self._limit_key
        got = limiter.endpoint(endpoint.name).acquire(rank, seq, self.deadline.at)
        if isinstance(got, Lease):
            self._lease = got
            return None
        return got

    def granted(self, lease: Lease) -> SlotWaiter | None:
        """The slot the call waited for is its own now; unless its endpoint was
        ejected while it waited: then the slot goes back and the attempt goes
        elsewhere (returns the next waiter as ``reserve`` does; None: go now)."""
        self.queued_s += lease.queued_s
        ejection, endpoint = self.core.ejection, self._endpoint_choice
        if ejection is not None and endpoint is not None and not ejection.usable(endpoint):
            lease.release()
            return self.reserve()
        self._lease = lease
        self._queued_before = lease.queued_s
        return None

    def release_slot(self) -> None:
        """Give the attempt's concurrency slot back (with the outcome it was marked with)."""
        lease, self._lease = self._lease, None
        if lease is not None:
            lease.release()

    def begin_attempt(self, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The request of the next attempt, with its share of the deadline (after
        ``reserve``, and the wait it asked for)."""
        remaining = self.deadline.remaining()
        if self.deadline.expired:
            self.release_slot()
            raise APITimeoutError("The call's deadline passed before the attempt could start")
        endpoint = self._endpoint_choice
        assert endpoint is not None, "reserve() comes first"
        try:
            self._permit = self._breaker_permit(endpoint)
        except CircuitOpenError:
            self.release_slot()
            raise
        self.core.picker.started(endpoint)
        self._endpoint = endpoint
        self._tried.add(endpoint.name)
        self._attempt_error = None
        self.machine.step("begin_attempt")
        self.attempt_number += 1
        self.total_attempts += 1
        self.core.stats.attempt(retry=not self._resending and self.attempt_number > 1)
        headers = dict(self.core.headers)
        headers.update(self.spec.headers)
        headers[HEADER_ATTEMPT] = str(self.attempt_number - self._requeues)
        if self._requeues:
            headers[HEADER_REQUEUE] = str(self._requeues)
        bounds = self.stream_bounds
        # A stream that may outlive the call's timeout announces its own bound, so
        # the server does not abort it at the total.
        announced = remaining if bounds is None else bounds.deadline_header(remaining)
        if math.isfinite(announced):
            headers[HEADER_DEADLINE_MS] = str(max(int(announced * 1000), 1))
        url = self.spec.absolute_url or endpoint.url_for(self.spec.path)
        extensions: dict[str, Any] = {}
        if self.spec.absolute_url is None and endpoint.authority is not None:
            # A discovered address: the service's name in Host, and for TLS.
            headers["host"] = endpoint.authority
            if endpoint.server_hostname is not None:
                extensions["sni_hostname"] = endpoint.server_hostname
        if self._trace is not None:
            headers.update(self._trace.attempt_started(self._attempt_event(endpoint, url)))
        timeout = self.core.attempt_timeout(remaining, self.spec.attempt_timeouts)
        if bounds is not None:
            timeout = bounds.attempt_timeout(timeout)
            bounds.attempt_started()  # the first chunk's bound, from now
        self._started = self.core.clock.now()
        self._pending = None
        # The timeout as a plain dict, which httpx and httpx2 both read: either one's
        # Timeout object is a number to the other.
        self._request = http.build_request(
            self.spec.method,
            url,
            content=self._content,
            headers=headers,
            extensions={**extensions, "timeout": timeout.as_dict()},
        )
        return self._request

    def _attempt_event(self, endpoint: EndpointState, url: str) -> AttemptStarted:
        permit, registry = self._permit, self.core.breakers
        breaker = (
            None if registry is None else registry.breaker_name(endpoint.name, self.spec.model)
        )
        state = None if permit is None else ("half_open" if permit.probe else "closed")
        lease = self._lease
        return AttemptStarted(
            number=self.attempt_number,
            model=self.spec.model,
            method=self.spec.method,
            url=url,
            endpoint=endpoint.name,
            backoff=self._delay_before,
            breaker=breaker,
            breaker_state=state,
            queued=self._queued_before,
            concurrency_limit=None if lease is None else lease.limit,
            failover=self._failover,
        )

    def _check_throttle(self) -> None:
        throttle = self.core.throttle
        if throttle is not None and throttle.should_reject():
            raise ThrottledError(
                "Rejected locally by adaptive throttling: the server has been refusing"
                " most requests",
                probability=throttle.probability(),
            )

    def _pick_endpoint(self, *, retry: bool = False, untried_only: bool = False) -> EndpointState:
        """The endpoint of the next attempt. Endpoints that are ejected or whose
        breaker is open are skipped, and with none left the call fails now, with no
        I/O (``CircuitOpenError``). A retry goes to an endpoint the call has not
        tried when one is usable (only such one with ``untried_only``), else to
        another than the last; a requeue avoids the last. Of those, one with a free
        concurrency slot comes first, else the one with the shortest queue."""
        core = self.core
        if retry:
            avoid: set[str] = self._tried
        elif self.attempt_number > 0 and self._last_endpoint is not None:
            avoid = {self._last_endpoint}
        else:
            avoid = set()
        candidates = core.picker.candidates(
            model=self.spec.model,
            priority=self.priority,
            spill=core.spill_over,
            avoid=avoid,
            usable=self._usable,
        )
        if retry:
            untried = [s for s in candidates if s.name not in self._tried]
            candidates = untried if untried or untried_only else candidates
        if not candidates:
            raise self._refusal()
        limiter = core.limiter
        if limiter is None or len(candidates) == 1:
            return candidates[0]
        for state in candidates:
            if limiter.endpoint(state.name).has_room():
                return state
        # No free slot anywhere: wait in the own pool's shortest queue (another
        # pool's endpoints are spill-over, for room, never to queue on).
        own = [s for s in candidates if s.serves_class(self.priority)] or candidates
        return min(own, key=lambda s: limiter.endpoint(s.name).expected_wait())

    def _serving(self) -> list[EndpointState]:
        """The endpoints that serve the call's model and class now (spill-over included)."""
        return self.core.picker.serving(self.spec.model, self.priority, self.core.spill_over)

    def _usable(self, state: EndpointState) -> bool:
        """Whether an attempt may go to ``state`` now: not ejected, breaker accepting."""
        ejection, registry = self.core.ejection, self.core.breakers
        if ejection is not None and not ejection.usable(state):
            return False
        return registry is None or registry.get(state.name, self.spec.model).accepting

    def _refusal(self) -> CircuitOpenError:
        """The error of a call no endpoint can take: the soonest to return of the
        ejected endpoints and open breakers."""
        registry, ejection, model = self.core.breakers, self.core.ejection, self.spec.model
        if self.core.discovery is not None:
            self.core.discovery.request_refresh()  # every endpoint out: the set may be stale
        refusal: CircuitOpenError | None = None
        serving = self._serving()
        for state in serving:
            wait = None if ejection is None else ejection.retry_in(state)
            if wait is not None:
                exc = CircuitOpenError(
                    f"Endpoint {state.name} is ejected; it may return in {wait:.1f}s",
                    breaker=state.name,
                    retry_in=wait,
                )
            elif registry is not None:
                try:
                    registry.get(state.name, model).before_call().ignore()
                    continue  # it turned half-open meanwhile: the next attempt may go
                except CircuitOpenError as open_:
                    exc = open_
            else:
                continue
            if refusal is None or (exc.retry_in or 0) < (refusal.retry_in or 0):
                refusal = exc
        if refusal is None:
            name = serving[0].name
            refusal = CircuitOpenError("Every endpoint was out of rotation", breaker=name)
        return refusal

    def _breaker_permit(self, endpoint: EndpointState) -> Permit | None:
        registry = self.core.breakers
        if registry is None:
            return None
        return registry.get(endpoint.name, self.spec.model).before_call()

    def any_endpoint_accepting(self) -> bool:
        """Whether a retry could be sent now (some endpoint is in rotation with its
        breaker letting calls in)."""
        return any(self._usable(state) for state in self._serving())

    def remaining_or_none(self) -> float | None:
        """Seconds left, or None without a deadline (the form anyio's ``fail_after`` takes)."""
        remaining = self.deadline.remaining()
        return remaining if math.isfinite(remaining) else None

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
        limiter = policy.rate_limiter if policy is not None else None
        if limiter is not None and self.rate_limit.remaining_tokens is not None:
            # The server's count of this caller's tokens beats the local estimate.
            limiter.observe(self.rate_limit.remaining_tokens, self.rate_limit.reset_tokens)
        self._note(response.status_code, None)

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
            self._settle(outcome, None if outcome == _OK else self._attempt_error)
        lease = self._lease
        if outcome != _OK or not self.spec.stream:
            self.release_slot()  # a stream holds its slot until it ends (``ended``)
        if self._trace is not None:
            self._trace.on_event(
                AttemptEnded(outcome, status, error_type, self.server_load, duration)
            )
        endpoint = self._endpoint
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
            )
        )
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
            self._lease.mark(verdict.limit, self.server_load, ttft)
        if permit is not None:
            permit.settle(error, verdict=verdict)
            if self._endpoint is not None and verdict.breaker_failure:
                self._after_breaker_failure(self._endpoint)
        ejection, endpoint = self.core.ejection, self._endpoint
        if ejection is not None and endpoint is not None:
            evidence = evidence_of(error, response_seen=self._pending is not None)
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

    def complete(self, response: httpx.Response, body: bytes) -> APIResult | httpx.Response:
        """The result of a read response, or the status error to raise (and retry).
        In transport mode the result is the response itself, body read."""
        if response.status_code >= 300:
            raise self.failed(
                error_from_response(
                    response, body, server_load=self.server_load, redactor=self.redactor
                )
            )
        if self.spec.raw:
            return read_response(response, body)
        try:
            result = result_from_response(
                response,
                body,
                self.spec.result_type,
                info=self.info(response),
                redactor=self.redactor,
            )
        except APIError as exc:
            raise self.failed(exc) from None
        if self.spec.hand_over == "response":
            self._read = (read_response(response, body), response.elapsed)
        return result

    def handed_over(self, response: httpx.Response) -> httpx.Response:
        """A success handed to the caller before its body is read
        (``with_streaming_response``): the attempt succeeded at its headers, so no
        retry follows; the call ends when the caller has read the body or closed it."""
        self._unread_info = info = self.info(response)
        self.succeeded_info(info)
        return response

    def result_of_body(self, response: httpx.Response, body: bytes) -> APIResult:
        """The result of a body the caller read after the hand-over; the call ends here."""
        assert self._unread_info is not None
        try:
            result = result_from_response(
                response,
                body,
                self.spec.result_type,
                info=self._unread_info,
                redactor=self.redactor,
            )
        except APIError as exc:
            raise self.failed_after_hand_over(exc) from None
        self.succeeded(result)
        self.ended(response=summarize(result))
        return result

    def failed_after_hand_over(self, error: APIError) -> APIError:
        """An error reading a body after the hand-over: not retried (the caller has
        the response), annotated with the call's history; the call ends with it."""
        if error.request is None:
            error.request = self._request
        self.annotate(error)
        self.ended(error)
        return error

    def closed_after_hand_over(self, body: bytes | None) -> None:
        """The caller closed a handed-over response: the call ends, with the summary of
        the body read, or as cancelled if the body was not read to its end."""
        if body is None:
            self.ended(cancelled=True)
            return
        payload = parse_json_object(body)
        if payload is not None:
            usage = payload.get("usage")
            if isinstance(usage, Mapping):
                self.settle_tokens(usage.get("total_tokens"))
        self.ended(response=None if payload is None else summarize(payload))

    def info(self, response: httpx.Response) -> CallInfo:
        """What the result will say about this call (history completed on success)."""
        return CallInfo(
            server_load=self.server_load,
            attempt_history=(),
            request_id=request_id_of(response, redactor=self.redactor),
            model=self.spec.model,
            rate_limit=self.rate_limit,
        )

    def finish(self, result: R | httpx.Response | object) -> Any:
        """The call's answer: a record gets the history attached; a transport-mode
        response closes its attempt; a stream closed its attempt at its first chunk.
        In a hand-over mode the answer is a ``Delivery`` of all that and the response."""
        if self.spec.hand_over:
            return self._delivery(result)
        if isinstance(result, APIResult):
            return self._finished(result)
        if isinstance(result, response_types()):
            self._close_record(_OK)
            self.machine.step("succeeded")
            if self._trace is not None:
                payload = parse_json_object(result.content)
                self.ended(response=None if payload is None else summarize(payload))
        return result

    def _delivery(self, result: object) -> Delivery:
        if isinstance(result, APIResult):  # "response" mode: the body was read
            result = self._finished(result)
            assert result.call_info is not None and self._read is not None
            response, elapsed = self._read
            return Delivery(self, response, result, result.call_info, elapsed)
        if isinstance(result, response_types()):  # "unread" mode, not a stream
            assert self._unread_info is not None
            return Delivery(self, result, None, self._unread_info)
        assert isinstance(result, _StreamBase)  # a stream, in either mode
        return Delivery(self, result.response, result, result.call_info)

    def _finished(self, result: R) -> R:
        result = self.succeeded(result)
        if self._trace is not None:
            self.ended(response=summarize(result))
        return result

    def succeeded(self, result: R) -> R:
        """Close the history with an ``ok`` attempt and attach it to the result."""
        if result.call_info is not None:
            self.succeeded_info(result.call_info)
        usage = result.get("usage")
        if isinstance(usage, Mapping):
            self.settle_tokens(usage.get("total_tokens"))
        return result

    def succeeded_info(self, info: CallInfo) -> None:
        """Close the history with an ``ok`` attempt and attach it to ``info``."""
        self._close_record(_OK)
        self.machine.step("succeeded")
        info.attempt_history = tuple(self.history)
        info.precheck = self.precheck
        info.degraded_from = self.degraded_from
        info.model = self.spec.model

    def annotate(self, error: StormguardError) -> None:
        """Give the error the call's attempt count, history and stop reason."""
        self.redactor.scrub_error(error)
        if self.machine.state in ATTEMPT_OPEN:
            self._close_record(self.retry_stopped_by or StopReason.NOT_RETRYABLE)
            self.machine.step("stop")
        error.attempts = self.total_attempts
        error.attempt_history = tuple(self.history)
        error.retry_stopped_by = self.retry_stopped_by
        error.precheck = self.precheck
        if self._reservation is not None and self.total_attempts > 0:
            # The call failed: its tokens were not used (a server that failed does not
            # count them either), so they go back to the rate limiter.
            self._reservation.cancel()
            self._reservation = None
        if isinstance(error, APIError) and error.server_load.is_empty:
            error.server_load = self.server_load
        if isinstance(error, APIError) and error.rate_limit.is_empty:
            error.rate_limit = self.rate_limit
        if self.core.openai_errors:  # the error leaves the call here: openai's class too
            as_openai_error(error)


def summarize(result: APIResult | Mapping[str, Any]) -> ResponseSummary:
    """The id, model, finish reasons, usage and text of a (non-streamed) result."""
    usage = result.get("usage")
    usage = usage if isinstance(usage, Mapping) else {}
    reasons: list[str] = []
    texts: list[str] = []
    choices = result.get("choices")
    for choice in choices if isinstance(choices, list) else ():
        if not isinstance(choice, Mapping):
            continue
        reason = choice.get("finish_reason")
        if isinstance(reason, str):
            reasons.append(reason)
        message = choice.get("message")
        text = message.get("content") if isinstance(message, Mapping) else choice.get("text")
        if isinstance(text, str):
            texts.append(text)
    status, output = result.get("status"), result.get("output")
    if isinstance(output, list) and isinstance(status, str):  # a Responses API response
        reasons.append(status)
        texts.append(output_text_of(output))
    response_id, model = result.get("id"), result.get("model")
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    return ResponseSummary(
        response_id=response_id if isinstance(response_id, str) else None,
        response_model=model if isinstance(model, str) else None,
        finish_reasons=tuple(reasons),
        input_tokens=prompt if isinstance(prompt, int) else None,
        output_tokens=completion if isinstance(completion, int) else None,
        output_text=tuple(texts),
    )


def _outcome_error(state: tenacity.RetryCallState) -> BaseException | None:
    outcome = state.outcome
    if outcome is None or not outcome.failed:
        return None
    return outcome.exception()


class BodyReader:
    """Collects a response body within ``max_response_bytes`` and the call's
    deadline; the drivers feed it the pieces of ``iter_body``/``aiter_body``
    (at most 64 KiB each, however the body is encoded)."""

    __slots__ = ("_call", "_chunks", "_limit", "_status")

    def __init__(self, call: LogicalCall, response: httpx.Response) -> None:
        self._call = call
        self._chunks: list[bytes] = []
        self._status = response.status_code
        try:
            self._limit = BodyLimit(call.core.max_response_bytes, response)
        except BodyTooLargeError as exc:
            raise self._too_large(exc) from None

    def _too_large(self, exc: BodyTooLargeError) -> APIError:
        return self._call.failed_reading(
            APIResponseValidationError(
                str(exc), status_code=self._status, server_load=self._call.server_load
            )
        )

    def feed(self, chunk: bytes) -> None:
        try:
            self._limit.add(len(chunk))
        except BodyTooLargeError as exc:
            raise self._too_large(exc) from None
        if self._call.deadline.expired:
            raise self._call.failed_reading(
                self._call.deadline_error("while reading the response", response_started=True)
            )
        self._chunks.append(chunk)

    def body(self) -> bytes:
        return b"".join(self._chunks)
