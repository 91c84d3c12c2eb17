"""One logical call, from first attempt to final answer, without any I/O.

``LogicalCall`` makes every decision of a call: the deadline, the headers and
timeout of each attempt, whether a failure is retried, how long to wait, when
to stop and why, and the attempt history. The retry loop is tenacity's: the call
gives ``tenacity.Retrying`` its ``retry``/``wait``/``stop`` strategies, and
``call_flow`` (``_call/call_flow.py``) steps it for both drivers, so the drivers
(``_call/drivers.py``) contain only I/O: send, read, sleep.

``LogicalCall`` is one class over one state (``call_base.CallBase``, where each
attribute is declared with the modules that set it). Its decisions sit in
modules of one job each, functions of that state (none imports this module, and
none another's above it): ``call_precheck.py`` (the token pre-check),
``call_events.py`` (telemetry), ``call_quota.py`` (its key's quota),
``endpoint_choice.py``, ``attempt_record.py`` (an attempt's response, failure,
settling and record), ``retry_loop.py`` (tenacity's strategies),
``call_result.py`` (results, hand-over, the error that leaves the call); this
module binds the ones a driver, a stream or a hand-over calls as the call's
methods, and holds the fallback and the start of each attempt.
``call_state.CallMachine`` orders the steps; ``verdict.classify`` judges each
outcome once for every policy.

Before each attempt the call takes a slot of its endpoint's concurrency limit
(``_policies/limiter/limiter.py``), waiting in the local queue when the endpoint is at its limit;
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

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .._core.deadline import MIN_ATTEMPT_TIME
from .._core.exceptions import APITimeoutError, CircuitOpenError, ThrottledError
from .._core.history import FallbackKind, FallbackStep
from .._core.http import httpx
from .._core.logs import fell_back
from .._io.own_pool import attempt_request
from .._policies.fallback import next_fallback
from .._policies.limiter.lease import Lease
from .._policies.limiter.slot_waiter import SlotWaiter
from .._policies.routing.deployment import Deployment, is_account_header, with_query
from ..protocol import HEADER_ATTEMPT, HEADER_DEADLINE_MS, HEADER_REQUEUE
from ..telemetry._events import AttemptStarted, FellBack
from . import (
    attempt_record,
    call_events,
    call_precheck,
    call_quota,
    call_result,
    endpoint_choice,
    retry_loop,
)
from .attempt_record import stop_open_attempt
from .call_base import CallBase
from .call_events import started_event
from .call_quota import left_pacing, quota_sent
from .call_spec import CallSpec
from .endpoint_choice import breaker_permit, own_endpoint, pick_endpoint, usable

if TYPE_CHECKING:
    from .._policies.routing.endpoint_state import EndpointState
    from .client_core import ClientCore


__all__ = ["LogicalCall"]


class LogicalCall(CallBase):
    """One logical call: its state (``CallBase``, every attribute declared there),
    the steps a driver takes first (the fallback to the next model,
    the start of each attempt: its endpoint, its concurrency slot, its request),
    and the steps of the helpers below, each a function of the call's state in a
    module of one job (bound here as methods: no lookup costs more than one)."""

    # The token pre-check (``_call/call_precheck.py``).
    precheck_flow = call_precheck.precheck_flow
    prechecked = call_precheck.prechecked
    # The call's telemetry (``_call/call_events.py``).
    observing = call_events.observing
    sending = call_events.sending
    first_chunk = call_events.first_chunk
    ended = call_events.ended
    # Its place in its key's quota, with deployments past a key that cannot fit
    # (``_call/endpoint_choice.py`` over ``_call/call_quota.py``).
    pace = endpoint_choice.pace
    answered = endpoint_choice.answered
    left_pacing = call_quota.left_pacing
    # One attempt's response, failure and record (``_call/attempt_record.py``).
    saw_response = attempt_record.saw_response
    failed = attempt_record.failed
    failed_reading = attempt_record.failed_reading
    deadline_passed = attempt_record.deadline_passed
    deadline_error = attempt_record.deadline_error
    # tenacity's strategies (``_call/retry_loop.py``).
    retrying_kwargs = retry_loop.retrying_kwargs
    attempt_judged = retry_loop.attempt_judged
    # How the call ends (``_call/call_result.py``).
    complete = call_result.complete
    handed_over = call_result.handed_over
    result_of_body = call_result.result_of_body
    failed_after_hand_over = call_result.failed_after_hand_over
    closed_after_hand_over = call_result.closed_after_hand_over
    settle = call_result.settle
    succeeded_info = call_result.succeeded_info
    finish = call_result.finish
    annotate = call_result.annotate

    def __init__(
        self,
        core: ClientCore,
        spec: CallSpec,
        http: httpx.Client | httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(core, spec)
        if http is not None:
            self.http = http  # the driver's pool: what it performs the call's I/O with
        observer = core.observer
        if observer is not None and not (core.observer_quiet and core.observer_quiet()):
            self._trace = observer.start_call(started_event(self))

    @classmethod
    def hedge_of(cls, primary: LogicalCall, target: EndpointState) -> LogicalCall:
        """A hedge of ``primary`` (``_call/hedge_race.py``): the same request on its
        current model, by the same deadline, one attempt to ``target`` and never to
        the endpoint ``primary``'s attempt is on; not a logical call of its own (no
        budget deposit, no call counted), observed under ``primary``'s span."""
        spec = primary.spec
        if spec.timeout is not None:  # the call's deadline, not a new one from now
            spec = replace(spec, timeout=max(primary.deadline.remaining(), MIN_ATTEMPT_TIME))
        hedge = cls.__new__(cls)
        CallBase.__init__(hedge, primary.core, spec, counted=False)
        hedge.hedge = True
        hedge.http = primary.http
        hedge.models_tried = primary.models_tried
        hedge.degraded_from = primary.degraded_from
        hedge.fallback_steps = primary.fallback_steps
        hedge.precheck = primary.precheck
        hedge._next_target = target
        own = own_endpoint(primary)
        hedge._skipped = primary._skipped if own is None else primary._skipped | {own}
        make = getattr(primary._trace, "hedge_trace", None)
        if make is not None:  # an observer of its own, under the call's span
            hedge._trace = make()
        return hedge

    def fall_back(self, error: BaseException) -> bool:
        """Move the call to another model if ``error`` has a route (``_policies/fallback.py``:
        its servers could not serve, the request is too long for it, its content
        filter refused it) and time is left; ``call_flow`` then runs a fresh retry loop
        (attempt numbers restart at 1, on the new model: it is not a retry of the old
        one). False: raise ``error``."""
        if self.deadline.expired:
            return False
        policy = self.core.token_policy
        step = next_fallback(
            self.core.fallbacks,
            error,
            model=self.spec.model,
            asked=self.models_tried[0] if self.models_tried else None,
            tried=self.models_tried,
            context_fallbacks=None if policy is None else policy.context_fallbacks,
        )
        if step is None:
            return False
        model, kind = step
        stop_open_attempt(self)
        self.machine.step("fall_back")
        from_model = self.spec.model
        if self._trace is not None:
            self._trace.on_event(FellBack(from_model, model, type(error).__name__, kind.value))
        self.fallback_steps += (FallbackStep(from_model, model, kind, type(error).__name__),)
        self.models_tried += (model,)
        fell_back(
            from_model=from_model, to_model=model, kind=kind, error=error, redactor=self.redactor
        )
        if kind is FallbackKind.UNAVAILABLE:
            self.degraded_from = self.degraded_from or from_model
        self._switch_model(model)
        self.attempt_number = 0
        self._requeues = 0
        self._paced = 0
        left_pacing(self)  # the next model's key is another quota
        self._quota_key = self._quota = self._quota_cost = None
        self._resending = False
        self._next_target = None
        self._failover = False
        # A deployment passed over for this model's quota may have room for the next
        # model's (a provider's limits are per model); one out of credit is ejected.
        self._skipped = frozenset()
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
        if target is not None and usable(self, target):
            endpoint = target
        else:  # none chosen (a first attempt, a requeue), or it left rotation meanwhile
            endpoint = pick_endpoint(
                self,
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
            self._permit = breaker_permit(self, endpoint)
        except CircuitOpenError:
            self.release_slot()
            raise
        self.core.picker.started(endpoint)
        self.http = http
        self._endpoint = endpoint
        if endpoint.name not in self._tried:
            self._tried += (endpoint.name,)
        self._attempt_error = None
        self.machine.step("begin_attempt")
        self.attempt_number += 1
        self.total_attempts += 1
        self.core.stats.attempt(retry=not self._resending and self.attempt_number > 1)
        affinity = self._affinity
        if affinity is not None or self._attempt_affinity is not None:
            self._attempt_affinity = affinity
            if affinity is not None:
                self.core.stats.affinity(hit=affinity == "hit")
        quota_sent(self)
        # Lower-case names, as the client's own: a call's "Authorization" replaces the
        # client's "authorization" instead of going out beside it.
        headers = {name.lower(): value for name, value in self.spec.headers.items()}
        headers[HEADER_ATTEMPT] = str(self.attempt_number - self._requeues - self._paced)
        if self._requeues:
            headers[HEADER_REQUEUE] = str(self._requeues)
        bounds = self.stream_bounds
        # A stream that may outlive the call's timeout announces its own bound, so
        # the server does not abort it at the total.
        announced = remaining if bounds is None else bounds.deadline_header(remaining)
        if math.isfinite(announced):
            headers[HEADER_DEADLINE_MS] = str(max(int(announced * 1000), 1))
        url = self.spec.absolute_url or endpoint.url_for(self.spec.path)
        base: Mapping[str, str] = self.core.headers
        content = self._content
        provider = endpoint.provider
        if provider is not None and self.spec.absolute_url is None:
            # A deployment: its credential, its name for the model, its query; none of
            # the client's or the call's own credentials (another provider's).
            base = self.core.provider_headers(provider)
            headers = {k: v for k, v in headers.items() if not is_account_header(k)}
            url = with_query(url, provider.query)
            content = self._content_for(provider)
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
        extensions["timeout"] = timeout
        self._request = attempt_request(
            http,
            self.spec.method,
            url,
            content=content,
            base=base,
            headers=headers,
            extensions=extensions,
        )
        if self.spec.stream and self.core.latency_routing is not None:
            self._waiting = (endpoint, self.core.picker.wait_began(endpoint, self._started))
        return self._request

    def _content_for(self, provider: Deployment) -> bytes | None:
        """The body an attempt to ``provider`` sends: the call's, with the provider's
        name for the model the call asked for (the answer's ``model`` stays the
        provider's, as it sent it)."""
        body, model = self.spec.body, self.spec.model
        if body is None or model is None or body.get("model") != model:
            return self._content
        name = provider.model_for(model)
        if name == model:
            return self._content
        return json.dumps({**body, "model": name}, separators=(",", ":")).encode()

    def _attempt_event(self, endpoint: EndpointState, url: str) -> AttemptStarted:
        permit, registry = self._permit, self.core.breakers
        breaker = (
            None if registry is None else registry.breaker_name(endpoint.name, self.spec.model)
        )
        state = None if permit is None else ("half_open" if permit.probe else "closed")
        lease = self._lease
        quota = self._quota
        paced = None if quota is None else quota.state()
        share, tokens, requests = (None, None, None) if paced is None else paced.view()
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
            quota_wait=0.0 if quota is None else quota.attempt_wait,
            quota_share=share,
            quota_remaining_tokens=tokens,
            quota_remaining_requests=requests,
            deployment=None if endpoint.provider is None else endpoint.name,
            tier=None if endpoint.provider is None else endpoint.tier,
            affinity=self._attempt_affinity,
            hedge=self.hedge,
        )

    def _check_throttle(self) -> None:
        throttle = self.core.throttle
        if throttle is not None and throttle.should_reject():
            raise ThrottledError(
                "Rejected locally by adaptive throttling: the server has been refusing"
                " most requests",
                probability=throttle.probability(),
            )
