"""The spans and measurements of one logical call (``Telemetry.start_call``'s answer).

Loaded with the first call that records anything: this is where the
OpenTelemetry API's tracing, context and propagation modules are imported.
What each event says as attributes is ``_span_attributes.py``; the captured
prompt and answer (``capture_content``) are ``_captured_content.py``.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from .._core.http import httpx
from .._core.redact import display_url
from . import _names as n
from ._captured_content import _input_messages, _output_messages
from ._current_call import CURRENT
from ._events import (
    AttemptEnded,
    AttemptStarted,
    BudgetRefused,
    CallEnded,
    CallEvent,
    CallStarted,
    FellBack,
    FirstChunk,
    PrecheckPassed,
    ResponseSummary,
)
from ._metrics import ClientMetrics
from ._span_attributes import (
    _attempt_error_type,
    _budget_attributes,
    _load_attributes,
    _precheck_attributes,
    _refusal_attributes,
    _short,
)

__all__ = ["CallTrace", "HedgeTrace"]


def _suppressing_http_instrumentation() -> contextlib.AbstractContextManager[object]:
    """opentelemetry-instrumentation's public ``suppress_http_instrumentation()`` when
    that package is loaded (HTTP instrumentations such as the httpx one import it and
    honour it); with it not loaded, no instrumentation is there to suppress."""
    utils = sys.modules.get("opentelemetry.instrumentation.utils")
    suppress = getattr(utils, "suppress_http_instrumentation", None)
    return contextlib.nullcontext() if suppress is None else suppress()


class _Settings(Protocol):
    """What a call's trace reads of the ``Telemetry`` that started it, at its start and
    at its end (the observer imports this module, so this one names only the shape)."""

    capture_content: bool
    provider_name: str


class CallTrace:
    """The spans and measurements of one logical call (a ``CallObserver``)."""

    #: A hedge of the call was sent (``hedge_trace``): ``lost`` until the hedge's
    #: answer becomes the call's (``HedgeTrace.decided``); the call span says which.
    hedge_outcome: str | None = None
    #: The hedge's answer is the call's: the end of the call's own attempts (cancelled)
    #: ends only their span, and the hedge's end is the call's.
    race_lost = False
    #: The call's own end, held while the race is undecided (``HedgeTrace.decided``).
    held: CallEnded | None = None

    def __init__(
        self,
        telemetry: _Settings,
        event: CallStarted,
        tracer: Tracer | None,
        instruments: ClientMetrics | None,
    ) -> None:
        self.telemetry = telemetry
        self.started = event
        #: Every text from the server (and every error message) goes through it first.
        self.scrub = event.scrub
        self.tracer = tracer
        self.instruments = instruments
        self.t0 = time.perf_counter()
        self.ttfc: float | None = None
        self.attempt: Span | None = None
        self.attempt_stream_open = False
        self.last_model = event.model
        #: The deployment and tier of the current (or last) attempt, for its metrics.
        self.deployment: tuple[str, int] | None = None
        name = event.operation if event.model is None else f"{event.operation} {event.model}"
        self.span: Span = (
            trace.INVALID_SPAN if tracer is None else tracer.start_span(name, kind=SpanKind.CLIENT)
        )
        self.recording = self.span.is_recording()
        if self.recording:
            self.span.set_attributes(self._common_attributes())
            if event.max_tokens is not None:
                self.span.set_attribute(n.GEN_AI_REQUEST_MAX_TOKENS, event.max_tokens)
            self.span.set_attribute(n.GEN_AI_REQUEST_STREAM, event.stream)
            if telemetry.capture_content and event.body is not None:
                messages = _input_messages(event.body)
                if messages is not None:
                    self.span.set_attribute(n.GEN_AI_INPUT_MESSAGES, messages)

    def _common_attributes(self) -> dict[str, Any]:
        event = self.started
        attributes: dict[str, Any] = {
            n.GEN_AI_OPERATION_NAME: event.operation,
            n.GEN_AI_PROVIDER_NAME: self.telemetry.provider_name,
        }
        if event.model is not None:
            attributes[n.GEN_AI_REQUEST_MODEL] = event.model
        if event.server_address is not None:
            attributes[n.SERVER_ADDRESS] = event.server_address
        if event.server_port is not None:
            attributes[n.SERVER_PORT] = event.server_port
        return attributes

    # -- scopes -------------------------------------------------------------------------

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The logical span is the current span while the driver works on the call."""
        token = otel_context.attach(trace.set_span_in_context(self.span))
        call_token = CURRENT.set(self)
        try:
            yield
        finally:
            CURRENT.reset(call_token)
            otel_context.detach(token)

    @contextlib.contextmanager
    def sending(self) -> Iterator[None]:
        """The attempt span is current during the send, and HTTP instrumentation
        (opentelemetry-instrumentation-httpx) is suppressed: the attempt span is the
        HTTP client span, so a second one would only duplicate it."""
        token = otel_context.attach(trace.set_span_in_context(self.attempt or self.span))
        try:
            with _suppressing_http_instrumentation():
                yield
        finally:
            otel_context.detach(token)

    # -- attempts -----------------------------------------------------------------------

    def attempt_started(self, event: AttemptStarted) -> Mapping[str, str]:
        self._end_attempt()
        self.last_model = event.model
        deployment = event.deployment
        if deployment is not None and event.tier is not None:
            self.deployment = (deployment, event.tier)
            if self.recording:  # the call's span: the deployment that served it, at the end
                self.span.set_attributes({n.DEPLOYMENT: deployment, n.TIER: event.tier})
        if self.instruments is not None and event.concurrency_limit is not None:
            self.instruments.queue_duration.record(event.queued, self._metric_attributes())
            self.instruments.concurrency_limit(event.endpoint, event.concurrency_limit)
        if self.instruments is not None and event.quota_share is not None:
            self.instruments.quota_wait.record(event.quota_wait, self._metric_attributes())
        if self.tracer is None:
            return {}
        url = httpx.URL(event.url)
        parent = trace.set_span_in_context(self.span)
        attempt = self.tracer.start_span(
            f"{event.method} {url.path}", context=parent, kind=SpanKind.CLIENT
        )
        self.attempt = attempt
        if attempt.is_recording():
            attributes: dict[str, Any] = {
                n.HTTP_REQUEST_METHOD: event.method,
                n.URL_FULL: self.scrub(display_url(url)),
                n.URL_TEMPLATE: url.path,
                n.SERVER_ADDRESS: url.host,
                n.SERVER_PORT: url.port or (443 if url.scheme == "https" else 80),
                n.ATTEMPT_NUMBER: event.number,
                n.ATTEMPT_ENDPOINT: event.endpoint,
                n.ATTEMPT_BACKOFF: event.backoff,
                n.GEN_AI_OPERATION_NAME: self.started.operation,
            }
            if event.number > 1:
                attributes[n.HTTP_REQUEST_RESEND_COUNT] = event.number - 1
            if event.model is not None:
                attributes[n.GEN_AI_REQUEST_MODEL] = event.model
            if event.breaker is not None:
                attributes[n.BREAKER_NAME] = event.breaker
            if event.breaker_state is not None:
                attributes[n.BREAKER_STATE] = event.breaker_state
            if event.concurrency_limit is not None:
                attributes[n.CONCURRENCY_LIMIT] = event.concurrency_limit
                attributes[n.ATTEMPT_QUEUED] = event.queued
            if event.failover:
                attributes[n.ATTEMPT_FAILOVER] = True
            if event.affinity is not None:
                attributes[n.AFFINITY] = event.affinity
            if event.hedge:
                attributes[n.HEDGE] = True
            if deployment is not None and event.tier is not None:
                attributes[n.DEPLOYMENT] = deployment
                attributes[n.TIER] = event.tier
            if event.quota_share is not None:
                attributes[n.ATTEMPT_QUOTA_WAIT] = event.quota_wait
                attributes[n.QUOTA_SHARE] = event.quota_share
                if event.quota_remaining_tokens is not None:
                    attributes[n.QUOTA_REMAINING_TOKENS] = event.quota_remaining_tokens
                if event.quota_remaining_requests is not None:
                    attributes[n.QUOTA_REMAINING_REQUESTS] = event.quota_remaining_requests
            attempt.set_attributes(attributes)
        headers: dict[str, str] = {}
        propagate.inject(headers, context=trace.set_span_in_context(attempt))
        return headers

    def _attempt_ended(self, event: AttemptEnded) -> None:
        if self.instruments is not None:
            self.instruments.attempts.add(1, self._metric_attributes(outcome=event.outcome))
            if event.outcome == "paced":
                self.instruments.paced_429s.add(1, self._metric_attributes())
        attempt = self.attempt
        if attempt is None:
            return
        if attempt.is_recording():
            attributes: dict[str, Any] = {n.ATTEMPT_OUTCOME: event.outcome}
            if event.status_code is not None:
                attributes[n.HTTP_RESPONSE_STATUS_CODE] = event.status_code
            attributes.update(_load_attributes(event.server_load, self.scrub))
            attempt.set_attributes(attributes)
            failed = event.outcome != "ok"
            if failed:
                error_type = _attempt_error_type(event)
                attempt.set_attribute(n.ERROR_TYPE, error_type)
                attempt.set_status(Status(StatusCode.ERROR, event.error_type or error_type))
        if event.outcome == "ok" and self.started.stream:
            self.attempt_stream_open = True  # the stream's body goes on: end with the call
            return
        self._end_attempt()

    def _end_attempt(self, error: BaseException | None = None, cancelled: bool = False) -> None:
        attempt, self.attempt = self.attempt, None
        self.attempt_stream_open = False
        if attempt is None:
            return
        if attempt.is_recording():
            if cancelled:
                attempt.set_attribute(n.CANCELLED, True)
            elif error is not None:
                attempt.set_attribute(n.ERROR_TYPE, type(error).__name__)
                attempt.set_status(Status(StatusCode.ERROR, type(error).__name__))
        attempt.end()

    # -- events -------------------------------------------------------------------------

    def hedge_trace(self) -> HedgeTrace:
        """The observer of a hedge of this call (``_call/hedge_race.py``): until the
        race is decided (``HedgeTrace.decided``), the call's own end is held."""
        self.hedge_outcome = "lost"
        hedge = HedgeTrace(self)
        self.deciding = hedge
        return hedge

    #: The hedge whose race is undecided: the call's own end waits for it.
    deciding: HedgeTrace | None = None

    def _hedged_end(self, event: CallEnded) -> None:
        if self.race_lost:  # the call's own attempts, cancelled: the hedge's end is the call's
            self._end_attempt(event.error, cancelled=True)
        elif self.deciding is not None:
            self._end_attempt(event.error, cancelled=event.cancelled)
            self.held = event
        else:
            self._call_ended(event)

    def on_event(self, event: CallEvent) -> None:
        if isinstance(event, AttemptEnded):
            self._attempt_ended(event)
        elif isinstance(event, CallEnded):
            if self.hedge_outcome is None:
                self._call_ended(event)
            else:
                self._hedged_end(event)
        elif isinstance(event, FirstChunk):
            if self.ttfc is not None:
                return  # a hedge's stream and the call's own both got one: the first
            self.ttfc = time.perf_counter() - self.t0
            if self.recording:
                self.span.set_attribute(n.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK, self.ttfc)
        elif isinstance(event, BudgetRefused):
            if self.instruments is not None:
                self.instruments.budget_refusals.add(1, self._metric_attributes())
            if self.recording:
                self.span.add_event(n.EVENT_BUDGET_REFUSED, _budget_attributes(event.budget))
        elif isinstance(event, PrecheckPassed):
            if self.recording:
                self.span.set_attributes(_precheck_attributes(event))
        elif isinstance(event, FellBack):
            self.last_model = event.to_model
            if self.recording:
                self.span.add_event(
                    n.EVENT_FALLBACK,
                    {
                        n.FALLBACK_FROM: event.from_model or "",
                        n.FALLBACK_MODEL: event.to_model,
                        n.FALLBACK_REASON: event.reason,
                        n.FALLBACK_KIND: event.kind,
                    },
                )
                self.span.set_attribute(n.FALLBACK_KIND, event.kind)

    def _call_ended(self, event: CallEnded) -> None:
        duration = time.perf_counter() - self.t0
        error = event.error
        error_type = None if error is None else type(error).__name__
        self._end_attempt(error, cancelled=event.cancelled)
        response = event.response
        if self.recording:
            span = self.span
            span.set_attributes(self._end_attributes(event, response))
            span.set_attributes(_refusal_attributes(error))
            if error_type is not None:
                span.set_attribute(n.ERROR_TYPE, error_type)
                # Scrubbed before the cut: a key straddling it would leave half behind.
                span.set_status(Status(StatusCode.ERROR, _short(self.scrub(str(error)))))
        self.span.end()
        instruments = self.instruments
        if instruments is None:
            return
        outcome = "cancelled" if event.cancelled else ("error" if error is not None else "ok")
        base = self._metric_attributes()
        if response is not None and response.response_model is not None:
            base[n.GEN_AI_RESPONSE_MODEL] = self.scrub(response.response_model)
        instruments.calls.add(
            1, {**base, n.CALL_OUTCOME: outcome, n.DEGRADED: event.degraded_from is not None}
        )
        timed = base if error_type is None else {**base, n.ERROR_TYPE: error_type}
        instruments.duration.record(duration, timed)
        if self.ttfc is not None:
            instruments.time_to_first_chunk.record(self.ttfc, timed)
        if response is not None:
            if response.input_tokens is not None:
                instruments.token_usage.record(
                    response.input_tokens, {**base, n.GEN_AI_TOKEN_TYPE: "input"}
                )
            if response.output_tokens is not None:
                instruments.token_usage.record(
                    response.output_tokens, {**base, n.GEN_AI_TOKEN_TYPE: "output"}
                )

    def _end_attributes(self, event: CallEnded, response: ResponseSummary | None) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            n.ATTEMPTS: event.attempts,
            n.CALL_QUEUED: event.queued,
            n.DEGRADED: event.degraded_from is not None,
            n.QUOTA_WAIT: event.quota_wait,
            n.QUOTA_PACED_429S: event.paced_429s,
            **_budget_attributes(event.budget),
        }
        if event.retry_stopped_by is not None:
            attributes[n.RETRY_STOP_REASON] = event.retry_stopped_by
        if event.degraded_from is not None and event.model is not None:
            attributes[n.FALLBACK_MODEL] = event.model
        if event.cancelled:
            attributes[n.CANCELLED] = True
        if self.hedge_outcome is not None:
            attributes[n.HEDGE_OUTCOME] = self.hedge_outcome
        if response is not None:
            scrub = self.scrub  # the id, model and finish reasons are the server's text
            if response.response_id is not None:
                attributes[n.GEN_AI_RESPONSE_ID] = scrub(response.response_id)
            if response.response_model is not None:
                attributes[n.GEN_AI_RESPONSE_MODEL] = scrub(response.response_model)
            if response.finish_reasons:
                attributes[n.GEN_AI_RESPONSE_FINISH_REASONS] = [
                    scrub(reason) for reason in response.finish_reasons
                ]
            if response.input_tokens is not None:
                attributes[n.GEN_AI_USAGE_INPUT_TOKENS] = response.input_tokens
            if response.output_tokens is not None:
                attributes[n.GEN_AI_USAGE_OUTPUT_TOKENS] = response.output_tokens
            if self.telemetry.capture_content and response.output_text:
                attributes[n.GEN_AI_OUTPUT_MESSAGES] = scrub(_output_messages(response))
        return attributes

    def _metric_attributes(self, **extra: str) -> dict[str, Any]:
        attributes: dict[str, Any] = {
            n.GEN_AI_OPERATION_NAME: self.started.operation,
            n.GEN_AI_PROVIDER_NAME: self.telemetry.provider_name,
        }
        if self.started.model is not None:
            attributes[n.GEN_AI_REQUEST_MODEL] = self.started.model
        if self.started.server_address is not None:
            attributes[n.SERVER_ADDRESS] = self.started.server_address
        if extra.get("outcome") is not None:
            attributes[n.ATTEMPT_OUTCOME] = extra["outcome"]
        if self.deployment is not None:  # per deployment: a handful of series per client
            attributes[n.DEPLOYMENT], attributes[n.TIER] = self.deployment
        return attributes


class HedgeTrace(CallTrace):
    """The spans of a hedge's attempt: its own attempt span under the call's span
    (``stormguard.hedge``), beside the call's own attempt in flight. The hedge's end
    is the call's end only once its answer is the call's (``decided``): kept until
    then, dropped if the call's own attempt answered first."""

    def __init__(self, parent: CallTrace) -> None:  # the call's span is the parent's
        self.parent = parent
        self.telemetry = parent.telemetry
        self.started = parent.started
        self.scrub = parent.scrub
        self.tracer = parent.tracer
        self.instruments = parent.instruments
        self.t0 = parent.t0
        self.ttfc = None
        self.attempt = None
        self.attempt_stream_open = False
        self.last_model = parent.last_model
        self.deployment = parent.deployment
        self.span = parent.span
        self.recording = parent.recording
        #: None until the race is decided; True: the hedge's answer is the call's.
        self.won: bool | None = None
        self._end: CallEnded | None = None

    def hedge_trace(self) -> HedgeTrace:
        raise RuntimeError("a hedge is not hedged")

    def decided(self, won: bool, attempts: int) -> None:
        """The race is over, both racers ended or handed over (``won``: the hedge's
        answer is the call's; ``attempts``: both racers'). The end held of the
        winner is the call's end now; a winner's stream reports its own later; the
        loser's is dropped."""
        parent = self.parent
        parent.deciding = None
        held, parent.held = parent.held, None
        mine, self._end = self._end, None
        self.won = won
        if won:
            parent.hedge_outcome = "won"
            parent.race_lost = True
            if mine is not None:
                parent._call_ended(replace(mine, attempts=attempts))
        elif held is not None:
            parent._call_ended(replace(held, attempts=attempts))

    def on_event(self, event: CallEvent) -> None:
        if isinstance(event, CallEnded):
            self._end_attempt(event.error, cancelled=event.cancelled)
            if self.won is None:
                self._end = event
            elif self.won:
                self.parent._call_ended(event)
        elif isinstance(event, FirstChunk):
            self.parent.on_event(event)
        elif isinstance(event, AttemptEnded):
            self._attempt_ended(event)
