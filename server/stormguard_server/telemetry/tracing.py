"""Server spans: each request joins the trace of the client attempt that sent it.

``TraceMiddleware`` extracts the W3C ``traceparent`` of the request and opens a
SERVER span for it (a child of the client's attempt span), current while the
app handles the request. ``RequestSpans`` is a ``RequestObserver``: when a
generation request is over it draws the phases of its ``RequestRecord`` under
that span, from the record's own timestamps:

    POST /v1/chat/completions (SERVER)
      ├─ admission        arrival → admitted / shed / caller gone (decision, queue position)
      ├─ engine prefill   admitted → first token
      └─ engine decode    first token → last token

Off unless a tracer provider is given (``stormguard-server --otlp-endpoint URL``).
"""

from __future__ import annotations

from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, TracerProvider
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stormguard import __version__
from stormguard.protocol import HEADER_ATTEMPT, HEADER_PRIORITY
from stormguard_server.clock import ClockLike, as_clock
from stormguard_server.telemetry.records import RequestRecord

__all__ = ["RequestSpans", "ServerTracing", "TraceMiddleware"]

_SCOPE = "stormguard_server"
# Probes and scrapes: frequent, never part of a caller's trace.
_UNTRACED = frozenset({"/health", "/ready", "/metrics"})
# OpenTelemetry's gen_ai.operation.name of each kind of request (records.RequestRecord.kind).
_OPERATION_NAMES = {
    "chat": "chat",
    "completion": "text_completion",
    "embedding": "embeddings",
    "response": "chat",
}


class ServerTracing:
    """The tracer of one server, its middleware and its request observer."""

    def __init__(self, tracer_provider: TracerProvider, *, clock: ClockLike | None = None) -> None:
        self.tracer_provider = tracer_provider
        self.tracer = tracer_provider.get_tracer(_SCOPE, __version__)
        self.observer = RequestSpans(self.tracer, clock=clock)

    def flush(self) -> None:
        """Export buffered spans now (at shutdown: uvicorn re-raises SIGTERM once it has
        stopped, so nothing after the server's lifespan is sure to run)."""
        force_flush = getattr(self.tracer_provider, "force_flush", None)
        if callable(force_flush):
            force_flush()


class TraceMiddleware:
    """A SERVER span per HTTP request, parented by the caller's ``traceparent``."""

    def __init__(self, app: ASGIApp, *, tracer: trace.Tracer) -> None:
        self.app = app
        self.tracer = tracer

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] in _UNTRACED:
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        parent = propagate.extract(headers)
        method, path = scope["method"], scope["path"]
        span = self.tracer.start_span(f"{method} {path}", context=parent, kind=SpanKind.SERVER)
        if span.is_recording():
            attributes: dict[str, Any] = {
                "http.request.method": method,
                "url.path": path,
                "http.route": path,
                "url.scheme": scope.get("scheme", "http"),
            }
            server = scope.get("server")
            if server:
                attributes["server.address"], attributes["server.port"] = server[0], server[1]
            for header, key in ((HEADER_ATTEMPT, "attempt"), (HEADER_PRIORITY, "priority")):
                value = headers.get(header)
                if value is not None:
                    attributes[f"stormguard.request.{key}"] = value[:32]
            span.set_attributes(attributes)

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start" and span.is_recording():
                status = int(message["status"])
                span.set_attribute("http.response.status_code", status)
                if status >= 500:
                    span.set_attribute("error.type", str(status))
                    span.set_status(Status(StatusCode.ERROR))
            await send(message)

        token = otel_context.attach(trace.set_span_in_context(span, parent))
        try:
            await self.app(scope, receive, send_and_note)
        except BaseException as exc:
            if span.is_recording():
                span.set_attribute("error.type", type(exc).__name__)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            otel_context.detach(token)
            span.end()


class RequestSpans:
    """Admission and engine spans of each generation request, from its record."""

    def __init__(self, tracer: trace.Tracer, *, clock: ClockLike | None = None) -> None:
        self.tracer = tracer
        # Records carry the server clock's monotonic seconds; spans take wall-clock
        # nanoseconds.
        self._clock = as_clock(clock)
        self._offset_ns = round((self._clock.wall() - self._clock.now()) * 1e9)
        self._requests: dict[int, Span] = {}

    def _ns(self, monotonic_s: float) -> int:
        return int(monotonic_s * 1e9) + self._offset_ns

    def request_arrived(self, record: RequestRecord) -> None:
        span = trace.get_current_span()  # the request's SERVER span (TraceMiddleware)
        if not span.is_recording():
            return
        self._requests[id(record)] = span
        span.set_attributes(
            {
                "stormguard.request.id": record.request_id,
                "gen_ai.operation.name": _OPERATION_NAMES.get(record.kind, record.kind),
                "gen_ai.request.model": record.model,
                "gen_ai.request.max_tokens": record.max_tokens,
                "stormguard.request.prompt_tokens": record.prompt_tokens,
                "stormguard.request.priority": record.priority.value,
                "stormguard.request.attempt": str(record.attempt or 1),
            }
        )

    def request_done(self, record: RequestRecord) -> None:
        server_span = self._requests.pop(id(record), None)
        if server_span is None:
            return
        now = self._clock.now()
        parent = trace.set_span_in_context(server_span)
        outcome = record.outcome or "ok"
        server_span.set_attribute("stormguard.request.outcome", outcome)
        if record.shed_reason is not None:
            server_span.set_attribute("stormguard.server.load_shed", record.shed_reason.value)
        if record.cost is not None or record.shed_reason is not None:
            self._admission_span(record, parent, now)
        if record.started:
            self._engine_spans(record, parent, now)
        if record.output_tokens:
            server_span.set_attribute("gen_ai.usage.output_tokens", record.output_tokens)
            server_span.set_attribute("gen_ai.usage.input_tokens", record.prompt_tokens)

    def _admission_span(self, record: RequestRecord, parent: Any, now: float) -> None:
        end = record.admitted_at if record.admitted_at is not None else now
        span = self.tracer.start_span(
            "admission", context=parent, start_time=self._ns(record.arrival)
        )
        if record.admitted_at is not None:
            decision = "admitted"
        elif record.shed_reason is not None:
            decision = "shed"
        else:
            decision = "client_gone" if record.outcome == "client_gone" else "not_admitted"
        attributes: dict[str, Any] = {
            "stormguard.admission.decision": decision,
            "stormguard.admission.wait_s": max(end - record.arrival, 0.0),
        }
        if record.queue_position is not None:
            # Its place in the queue when it had to wait (None: admitted at once).
            attributes["stormguard.admission.queue_position"] = record.queue_position
        if record.cost is not None:
            attributes["stormguard.admission.cost_tokens"] = record.cost
        if record.shed_reason is not None:
            attributes["stormguard.server.load_shed"] = record.shed_reason.value
        span.set_attributes(attributes)
        span.end(end_time=self._ns(end))

    def _engine_spans(self, record: RequestRecord, parent: Any, now: float) -> None:
        start = record.admitted_at if record.admitted_at is not None else record.arrival
        first = record.first_token_at
        prefill_end = first if first is not None else (record.finished_at or now)
        prefill = self.tracer.start_span(
            "engine prefill", context=parent, start_time=self._ns(start)
        )
        prefill.set_attribute("stormguard.engine.prompt_tokens", record.prompt_tokens)
        if first is None:
            self._fail(prefill, record)
        prefill.end(end_time=self._ns(max(prefill_end, start)))
        if first is None:
            return
        end = record.finished_at if record.finished_at is not None else now
        decode = self.tracer.start_span("engine decode", context=parent, start_time=self._ns(first))
        decode.set_attribute("stormguard.engine.output_tokens", record.output_tokens)
        if record.finish_reason is not None:
            decode.set_attribute("gen_ai.response.finish_reasons", [record.finish_reason])
        if record.outcome != "ok":
            self._fail(decode, record)
        decode.end(end_time=self._ns(max(end, first)))

    @staticmethod
    def _fail(span: Span, record: RequestRecord) -> None:
        """A phase cut short: by an engine error (ERROR), or by a caller that left."""
        if record.outcome == "engine_error":
            span.set_attribute("error.type", "engine_error")
            span.set_status(Status(StatusCode.ERROR, (record.error or "")[:200]))
        elif record.outcome == "client_gone":
            span.set_attribute("stormguard.request.outcome", "client_gone")
