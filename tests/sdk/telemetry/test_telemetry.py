"""Spans and metrics of a call, read back from the OpenTelemetry SDK's in-memory exporter.

Each scenario the issue names (success, retried success, budget-stopped failure,
breaker-open refusal, token refusal, cancelled stream, fallback) checks the span
tree (one logical span, one child per HTTP attempt) and its attributes, for
``Client`` and ``AsyncClient`` alike.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import respx
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import HistogramDataPoint, InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import stormguard
from stormguard import BreakerConfig, RetryBudget, RetryPolicy
from stormguard.telemetry import Telemetry
from stormguard.tokens import TokenPolicy
from tests.sdk.helpers import MESSAGES, Api, chat_json, chunk, event_stream, sse

SECRET = "sk-test-secret-key"


@dataclass
class Otel:
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader
    telemetry: Telemetry

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def logical(self) -> ReadableSpan:
        roots = [s for s in self.spans() if s.parent is None]
        assert len(roots) == 1, [s.name for s in roots]
        return roots[0]

    def attempts(self, parent: ReadableSpan | None = None) -> list[ReadableSpan]:
        parent = parent or self.logical()
        children = [
            s for s in self.spans() if s.parent is not None and s.parent.span_id == _id(parent)
        ]
        return sorted(children, key=lambda s: s.start_time or 0)

    def metrics(self) -> dict[str, list[Any]]:
        data = self.reader.get_metrics_data()
        out: dict[str, list[Any]] = {}
        if data is None:
            return out
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
        return out

    def counter(self, name: str, **attributes: Any) -> float:
        total = 0.0
        for point in self.metrics().get(name, []):
            if all(point.attributes.get(k) == v for k, v in attributes.items()):
                total += point.value
        return total


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


@pytest.fixture
def otel() -> Iterator[Otel]:
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    meter_provider = MeterProvider(metric_readers=[reader])
    telemetry = Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider)
    yield Otel(exporter, reader, telemetry)
    tracer_provider.shutdown()
    meter_provider.shutdown()


def no_secret(spans: list[ReadableSpan]) -> None:
    for span in spans:
        dumped = json.dumps({k: str(v) for k, v in (span.attributes or {}).items()})
        dumped += json.dumps([str(e.attributes) for e in span.events])
        assert SECRET not in dumped and "Bearer" not in dumped


def busy(status: int = 503, **headers: str) -> httpx.Response:
    return httpx.Response(status, json={"error": {"message": "busy"}}, headers=headers)


async def test_success(api: Api, mock: respx.MockRouter, otel: Otel) -> None:
    route = mock.post("/chat/completions").respond(
        200, json=chat_json(), headers={"x-queue-depth": "2", "x-kv-cache-usage": "0.25"}
    )
    client = api.client(telemetry=otel.telemetry)
    await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=16))

    logical = otel.logical()
    assert logical.name == "chat m" and logical.kind is SpanKind.CLIENT
    assert logical.status.status_code is StatusCode.UNSET
    attrs = dict(logical.attributes or {})
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.request.model"] == "m"
    assert attrs["gen_ai.request.max_tokens"] == 16
    assert attrs["gen_ai.request.stream"] is False
    assert attrs["gen_ai.response.model"] == "m"
    assert attrs["gen_ai.response.id"] == "chatcmpl-1"
    assert attrs["gen_ai.response.finish_reasons"] == ("stop",)
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (5, 2)
    assert (attrs["server.address"], attrs["server.port"]) == ("llm.test", 80)
    assert attrs["stormguard.attempts"] == 1 and attrs["stormguard.degraded"] is False
    assert "gen_ai.input.messages" not in attrs and "gen_ai.output.messages" not in attrs
    assert "stormguard.budget.available" in attrs

    [attempt] = otel.attempts()
    assert attempt.kind is SpanKind.CLIENT and attempt.name == "POST /v1/chat/completions"
    a = dict(attempt.attributes or {})
    assert a["http.request.method"] == "POST"
    assert a["url.full"] == "http://llm.test/v1/chat/completions"
    assert a["http.response.status_code"] == 200
    assert "http.request.resend_count" not in a and "error.type" not in a
    assert a["stormguard.attempt.outcome"] == "ok" and a["stormguard.attempt.backoff_s"] == 0.0
    assert a["stormguard.server.queue_depth"] == 2 and a["stormguard.server.kv_cache_usage"] == 0.25
    assert a["stormguard.breaker.name"] == "m@llm.test:80"
    assert a["stormguard.breaker.state"] == "closed"
    # The request carried the attempt span's context.
    context = attempt.context
    assert context is not None
    traceparent = route.calls.last.request.headers["traceparent"]
    assert traceparent.startswith(f"00-{context.trace_id:032x}-{context.span_id:016x}-")
    assert int(traceparent[-2:], 16) & 1  # sampled
    no_secret(otel.spans())

    assert otel.counter("stormguard.client.calls", **{"stormguard.call.outcome": "ok"}) == 1
    assert otel.counter("stormguard.client.attempts", **{"stormguard.attempt.outcome": "ok"}) == 1
    [duration] = otel.metrics()["gen_ai.client.operation.duration"]
    assert isinstance(duration, HistogramDataPoint)
    assert duration.explicit_bounds[0] == 0.01 and duration.explicit_bounds[-1] == 81.92
    usage = otel.metrics()["gen_ai.client.token.usage"]
    assert sorted((p.attributes["gen_ai.token.type"], p.sum) for p in usage) == [
        ("input", 5),
        ("output", 2),
    ]
    assert usage[0].explicit_bounds[-1] == 67108864
    assert "gen_ai.client.operation.time_to_first_chunk" not in otel.metrics()


async def test_retried_success(api: Api, mock: respx.MockRouter, otel: Otel) -> None:
    mock.post("/chat/completions").mock(
        side_effect=[
            busy(
                503, **{"x-load-shed": "queue_full", "retry-after-ms": "300", "x-queue-depth": "9"}
            ),
            httpx.Response(200, json=chat_json()),
        ]
    )
    client = api.client(telemetry=otel.telemetry)
    await api.run(client.chat.completions.create(messages=MESSAGES))

    logical = otel.logical()
    assert logical.status.status_code is StatusCode.UNSET
    assert logical.attributes is not None and logical.attributes["stormguard.attempts"] == 2
    first, second = otel.attempts()
    f, s = dict(first.attributes or {}), dict(second.attributes or {})
    assert f["http.response.status_code"] == 503 and f["error.type"] == "503"
    assert f["stormguard.attempt.outcome"] == "requeued"  # shed before processing
    assert f["stormguard.concurrency.limit"] == 20 and f["stormguard.attempt.queued_s"] == 0.0
    assert s["stormguard.concurrency.limit"] == 18  # the shed lowered it (x 0.9)
    assert f["stormguard.server.load_shed"] == "queue_full"
    assert f["stormguard.server.retry_after_s"] == 0.3 and f["stormguard.server.queue_depth"] == 9
    assert first.status.status_code is StatusCode.ERROR
    assert s["http.request.resend_count"] == 1 and s["stormguard.attempt.number"] == 2
    assert s["stormguard.attempt.backoff_s"] == pytest.approx(0.3)  # the Retry-After it slept
    assert second.status.status_code is StatusCode.UNSET
    assert otel.counter("stormguard.client.attempts") == 2
    assert (
        otel.counter("stormguard.client.attempts", **{"stormguard.attempt.outcome": "requeued"})
        == 1
    )
    assert logical.attributes["stormguard.queue_time_s"] == 0.0
    gauge = otel.metrics()["stormguard.client.concurrency.limit"]
    assert [(p.attributes["stormguard.attempt.endpoint"], p.value) for p in gauge] == [
        ("llm.test:80", 18)
    ]
    queued = otel.metrics()["stormguard.client.queue.duration"]
    assert [p.count for p in queued] == [2]


async def test_budget_stopped_failure(api: Api, mock: respx.MockRouter, otel: Otel) -> None:
    mock.post("/chat/completions").mock(return_value=busy(503))
    empty = RetryBudget(ratio=0.0, min_retries_per_second=0.0, clock=api.clock)
    client = api.client(telemetry=otel.telemetry, retry_budget=empty, concurrency=None)
    with pytest.raises(stormguard.ServiceUnavailableError):
        await api.run(client.chat.completions.create(messages=MESSAGES))

    logical = otel.logical()
    attrs = dict(logical.attributes or {})
    assert logical.status.status_code is StatusCode.ERROR
    assert attrs["error.type"] == "ServiceUnavailableError"
    assert attrs["stormguard.retry.stop_reason"] == "budget"
    assert attrs["stormguard.budget.refused"] == 1 and attrs["stormguard.budget.available"] == 0
    [event] = [e for e in logical.events if e.name == "stormguard.budget.refused"]
    assert event.attributes is not None and event.attributes["stormguard.budget.retries"] == 0
    [attempt] = otel.attempts()
    assert attempt.attributes is not None
    assert attempt.attributes["stormguard.attempt.outcome"] == "budget"
    assert otel.counter("stormguard.client.budget.refusals") == 1
    assert otel.counter("stormguard.client.calls", **{"stormguard.call.outcome": "error"}) == 1
    [duration] = otel.metrics()["gen_ai.client.operation.duration"]
    assert duration.attributes["error.type"] == "ServiceUnavailableError"


async def test_breaker_open_refusal(api: Api, mock: respx.MockRouter, otel: Otel) -> None:
    route = mock.post("/chat/completions").mock(return_value=busy(502))
    client = api.client(
        telemetry=otel.telemetry,
        retry_policy=RetryPolicy(max_attempts=1),
        breaker=BreakerConfig(consecutive_failures=1, open_time=5.0, jitter=0.0),
    )
    with pytest.raises(stormguard.InternalServerError):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    tripping = otel.logical()
    [transition] = [e for e in tripping.events if e.name == "stormguard.breaker.transition"]
    assert transition.attributes is not None
    assert dict(transition.attributes) == {
        "stormguard.breaker.name": "m@llm.test:80",
        "stormguard.breaker.from_state": "closed",
        "stormguard.breaker.state": "open",
        "stormguard.breaker.reason": "consecutive_failures",
        "stormguard.breaker.open_for_s": 5.0,
    }
    otel.exporter.clear()

    with pytest.raises(stormguard.CircuitOpenError):
        await api.run(client.chat.completions.create(messages=MESSAGES))
    assert route.call_count == 1
    refused = otel.logical()
    assert otel.attempts(refused) == []  # refused before any I/O: no attempt span
    attrs = dict(refused.attributes or {})
    assert refused.status.status_code is StatusCode.ERROR
    assert attrs["error.type"] == "CircuitOpenError" and attrs["stormguard.attempts"] == 0
    assert attrs["stormguard.breaker.name"] == "m@llm.test:80"
    assert attrs["stormguard.breaker.state"] == "open"
    assert attrs["stormguard.breaker.retry_in_s"] == pytest.approx(5.0)
    gauge = otel.metrics()["stormguard.client.breaker.state"]
    assert [(p.attributes["stormguard.breaker.name"], p.value) for p in gauge] == [
        ("m@llm.test:80", 2)
    ]
    assert otel.counter("stormguard.client.breaker.transitions") == 1

    otel.exporter.clear()  # after the open time, the next call is a half-open probe
    api.clock.advance(5.0)
    route.mock(return_value=httpx.Response(200, json=chat_json()))
    await api.run(client.chat.completions.create(messages=MESSAGES))
    probe_call = otel.logical()
    [probe] = otel.attempts(probe_call)
    assert (
        probe.attributes is not None and probe.attributes["stormguard.breaker.state"] == "half_open"
    )
    moves = [
        (e.attributes["stormguard.breaker.from_state"], e.attributes["stormguard.breaker.state"])
        for e in probe_call.events
        if e.name == "stormguard.breaker.transition" and e.attributes is not None
    ]
    assert moves == [("open", "half_open")]


async def test_token_refusal(api: Api, mock: respx.MockRouter, otel: Otel) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    policy = TokenPolicy(
        server_context_windows=False, server_tokenize=False, context_windows={"gpt-4o": 300}
    )
    client = api.client(model="gpt-4o", token_policy=policy, telemetry=otel.telemetry)
    long = [{"role": "user", "content": "word " * 400}]
    with pytest.raises(stormguard.ContextWindowExceededError):
        await api.run(client.chat.completions.create(messages=long, max_tokens=50))
    assert route.call_count == 0
    logical = otel.logical()
    assert logical.name == "chat gpt-4o" and otel.attempts(logical) == []
    attrs = dict(logical.attributes or {})
    assert logical.status.status_code is StatusCode.ERROR
    assert attrs["error.type"] == "ContextWindowExceededError"
    assert attrs["stormguard.tokens.context_window"] == 300
    assert attrs["stormguard.tokens.max_tokens"] == 50
    assert attrs["stormguard.tokens.prompt"] > 250
    assert attrs["stormguard.tokens.counter"] == "tiktoken:o200k_base"

    otel.exporter.clear()  # a call that fits carries its pre-check counts
    await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    attrs = dict(otel.logical().attributes or {})
    assert attrs["stormguard.tokens.prompt"] == 8
    assert attrs["stormguard.tokens.context_window"] == 300
    assert attrs["stormguard.tokens.rate_limit_wait_s"] == 0.0


async def test_cancelled_stream(api: Api, mock: respx.MockRouter, otel: Otel) -> None:
    mock.post("/chat/completions").mock(
        return_value=event_stream(sse(chunk("a"), chunk("b"), chunk("c")))
    )
    client = api.client(telemetry=otel.telemetry)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    assert otel.spans() == []  # the call is not over while the stream is open
    if api.mode == "sync":
        next(iter(stream))
        stream.close()
    else:
        await stream.__anext__()
        await stream.aclose()

    logical = otel.logical()
    attrs = dict(logical.attributes or {})
    assert logical.status.status_code is StatusCode.UNSET  # the caller left: not a failure
    assert attrs["stormguard.cancelled"] is True and attrs["gen_ai.request.stream"] is True
    assert attrs["gen_ai.response.time_to_first_chunk"] >= 0
    [attempt] = otel.attempts()
    assert attempt.attributes is not None and attempt.attributes["stormguard.cancelled"] is True
    assert attempt.end_time is not None and logical.end_time is not None
    assert attempt.end_time <= logical.end_time
    assert otel.counter("stormguard.client.calls", **{"stormguard.call.outcome": "cancelled"}) == 1
    assert len(otel.metrics()["gen_ai.client.operation.time_to_first_chunk"]) == 1


async def test_stream_spans_end_with_the_stream(
    api: Api, mock: respx.MockRouter, otel: Otel
) -> None:
    last = chunk("", choices=[{"index": 0, "delta": {}, "finish_reason": "length"}])
    usage = chunk(
        "", choices=[], usage={"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    )
    mock.post("/chat/completions").mock(return_value=event_stream(sse(chunk("a"), last, usage)))
    client = api.client(telemetry=otel.telemetry)
    stream = await api.run(client.chat.completions.create(messages=MESSAGES, stream=True))
    await api.collect(stream)
    logical = otel.logical()
    attrs = dict(logical.attributes or {})
    assert "stormguard.cancelled" not in attrs
    assert attrs["gen_ai.response.finish_reasons"] == ("length",)
    assert (attrs["gen_ai.usage.input_tokens"], attrs["gen_ai.usage.output_tokens"]) == (4, 2)
    assert attrs["gen_ai.response.id"] == "chatcmpl-1"
    [attempt] = otel.attempts()
    assert attempt.status.status_code is StatusCode.UNSET


async def test_fallback(api: Api, mock: respx.MockRouter, otel: Otel) -> None:
    answers = {
        "big": [busy(503, **{"x-load-shed": "queue_full", "x-should-retry": "false"})],
        "small": [httpx.Response(200, json=chat_json(model="small"))],
    }
    mock.post("/chat/completions").mock(
        side_effect=lambda request: answers[json.loads(request.content)["model"]].pop(0)
    )
    client = api.client(model="big", fallback_models=["small"], telemetry=otel.telemetry)
    await api.run(client.chat.completions.create(messages=MESSAGES))

    logical = otel.logical()
    assert logical.name == "chat big" and logical.status.status_code is StatusCode.UNSET
    attrs = dict(logical.attributes or {})
    assert attrs["gen_ai.request.model"] == "big" and attrs["gen_ai.response.model"] == "small"
    assert attrs["stormguard.degraded"] is True and attrs["stormguard.fallback.model"] == "small"
    [event] = [e for e in logical.events if e.name == "stormguard.fallback"]
    assert event.attributes is not None
    assert event.attributes["stormguard.fallback.from_model"] == "big"
    assert event.attributes["stormguard.fallback.reason"] == "ServiceUnavailableError"
    primary, fallback = otel.attempts()
    assert primary.attributes is not None and fallback.attributes is not None
    assert primary.attributes["gen_ai.request.model"] == "big"
    assert primary.attributes["stormguard.attempt.outcome"] == "should_retry_false"
    assert fallback.attributes["gen_ai.request.model"] == "small"
    assert "http.request.resend_count" not in fallback.attributes  # attempt 1 of the fallback
    assert otel.counter("stormguard.client.calls", **{"stormguard.degraded": True}) == 1


async def test_content_only_when_opted_in(api: Api, mock: respx.MockRouter, otel: Otel) -> None:
    mock.post("/chat/completions").respond(200, json=chat_json(content="the answer"))
    telemetry = Telemetry(capture_content=True, tracer_provider=otel.telemetry._tracer_provider)
    client = api.client(telemetry=telemetry)
    await api.run(client.chat.completions.create(messages=MESSAGES))
    attrs = dict(otel.logical().attributes or {})
    assert json.loads(str(attrs["gen_ai.input.messages"])) == [
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]}
    ]
    assert json.loads(str(attrs["gen_ai.output.messages"])) == [
        {
            "role": "assistant",
            "parts": [{"type": "text", "content": "the answer"}],
            "finish_reason": "stop",
        }
    ]
    no_secret(otel.spans())


async def test_text_completion_span_name(api: Api, mock: respx.MockRouter, otel: Otel) -> None:
    mock.post("/completions").respond(
        200,
        json={"id": "cmpl-1", "object": "text_completion", "model": "m", "choices": []},
    )
    client = api.client(telemetry=otel.telemetry)
    await api.run(client.completions.create(prompt="hi"))
    logical = otel.logical()
    assert logical.name == "text_completion m"
    assert logical.attributes is not None
    assert logical.attributes["gen_ai.operation.name"] == "text_completion"


class CountingObserver:
    """A custom observer: the events of each call, in order."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def start_call(self, event: Any) -> Any:
        names = [type(event).__name__]
        self.calls.append(names)
        observer = self

        class Call:
            def on_event(self, event: Any) -> None:
                names.append(type(event).__name__)

            def attempt_started(self, event: Any) -> dict[str, str]:
                names.append(type(event).__name__)
                return {"x-observed": "1"}

            def active(self) -> Any:
                return contextlib.nullcontext()

            def sending(self) -> Any:
                return contextlib.nullcontext()

        del observer
        return Call()

    def breaker_changed(self, transition: Any) -> None:
        pass


async def test_custom_observer_sees_the_events_in_order(api: Api, mock: respx.MockRouter) -> None:
    route = mock.post("/chat/completions").mock(
        side_effect=[busy(503), httpx.Response(200, json=chat_json())]
    )
    observer = CountingObserver()
    client = api.client(telemetry=observer)
    await api.run(client.chat.completions.create(messages=MESSAGES))
    assert observer.calls == [
        ["CallStarted", "AttemptStarted", "AttemptEnded", "AttemptStarted", "AttemptEnded",
         "CallEnded"]
    ]  # fmt: skip
    assert route.calls.last.request.headers["x-observed"] == "1"


async def test_no_provider_means_no_events_and_no_traceparent(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/chat/completions").respond(200, json=chat_json())
    telemetry = Telemetry()  # the global providers: not configured in this test process
    assert telemetry.start_call(None) is None  # type: ignore[arg-type]
    assert telemetry.quiet()  # known now: the pipeline builds no start event for it
    client = api.client(telemetry=telemetry)
    await api.run(client.chat.completions.create(messages=MESSAGES))
    assert "traceparent" not in route.calls.last.request.headers
    off = api.client(telemetry=None)
    await api.run(off.chat.completions.create(messages=MESSAGES))
    assert "traceparent" not in route.calls.last.request.headers


def test_a_configured_provider_is_not_quiet(otel: Otel) -> None:
    assert not otel.telemetry.quiet()
    client = stormguard.Client(
        base_url="http://llm.test/v1",
        model="m",
        http_client=httpx.Client(
            transport=httpx.MockTransport(lambda r: httpx.Response(200, json=chat_json()))
        ),
        telemetry=otel.telemetry,
    )
    client.chat.completions.create(messages=MESSAGES)
    assert [s.name for s in otel.spans()] == ["POST /v1/chat/completions", "chat m"]
    assert not otel.telemetry.quiet()


def test_httpx_instrumentation_adds_no_duplicate_attempt_spans(otel: Otel) -> None:
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=chat_json())

    http = httpx.Client(transport=httpx.MockTransport(handler))
    provider = otel.telemetry._tracer_provider
    HTTPXClientInstrumentor.instrument_client(http, tracer_provider=provider)
    try:
        client = stormguard.Client(
            base_url="http://llm.test/v1", model="m", http_client=http, telemetry=otel.telemetry
        )
        client.chat.completions.create(messages=MESSAGES)
        assert [s.name for s in otel.spans()] == ["POST /v1/chat/completions", "chat m"]
        otel.exporter.clear()
        http.get("http://llm.test/other")  # outside a stormguard call it still traces
        assert [s.name for s in otel.spans()] == ["GET"]
    finally:
        HTTPXClientInstrumentor.uninstrument_client(http)


def test_transport_mode_traces_the_call(otel: Otel) -> None:
    openai = pytest.importorskip("openai")

    def handler(request: httpx.Request) -> httpx.Response:
        assert "traceparent" in request.headers
        return httpx.Response(200, json=chat_json())

    http = stormguard.httpx_client(
        base_url="http://llm.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        telemetry=otel.telemetry,
    )
    oai = openai.OpenAI(
        base_url="http://llm.test/v1", api_key=SECRET, http_client=http, max_retries=0
    )
    oai.chat.completions.create(model="m", messages=MESSAGES)
    logical = otel.logical()
    assert logical.name == "chat m" and len(otel.attempts()) == 1
    assert logical.attributes is not None
    assert logical.attributes["gen_ai.usage.output_tokens"] == 2  # read from the raw body
    no_secret(otel.spans())


def test_transport_mode_stream_ends_when_read_to_the_end(otel: Otel) -> None:
    openai = pytest.importorskip("openai")

    def handler(request: httpx.Request) -> httpx.Response:
        return event_stream(sse(chunk("a"), chunk("b")))

    http = stormguard.httpx_client(
        base_url="http://llm.test/v1",
        http_client=httpx.Client(transport=httpx.MockTransport(handler)),
        telemetry=otel.telemetry,
    )
    oai = openai.OpenAI(base_url="http://llm.test/v1", api_key=SECRET, http_client=http)
    chunks = list(oai.chat.completions.create(model="m", messages=MESSAGES, stream=True))
    assert len(chunks) == 2
    logical = otel.logical()
    assert logical.attributes is not None
    assert "stormguard.cancelled" not in logical.attributes  # read to its end, not left
    assert logical.attributes["gen_ai.response.time_to_first_chunk"] >= 0


async def test_async_transport_mode_stream(otel: Otel) -> None:
    openai = pytest.importorskip("openai")

    def handler(request: httpx.Request) -> httpx.Response:
        return event_stream(sse(chunk("a"), chunk("b")))

    http = stormguard.async_httpx_client(
        base_url="http://llm.test/v1",
        http_client=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
        telemetry=otel.telemetry,
    )
    oai = openai.AsyncOpenAI(base_url="http://llm.test/v1", api_key=SECRET, http_client=http)
    stream = await oai.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    assert [c.choices[0].delta.content async for c in stream] == ["a", "b"]
    logical = otel.logical()
    assert logical.attributes is not None and "stormguard.cancelled" not in logical.attributes
    await http.aclose()


async def test_cancelled_task_mid_stream_ends_the_spans(mock: respx.MockRouter, otel: Otel) -> None:
    import asyncio

    gate = asyncio.Event()

    async def body() -> Any:
        yield sse(chunk("a"), done=False)
        await gate.wait()  # never set: the stream hangs until the task is cancelled
        yield sse(chunk("b"))

    mock.post("/chat/completions").mock(
        return_value=httpx.Response(
            200, headers={"content-type": "text/event-stream"}, content=body()
        )
    )
    client = stormguard.AsyncClient(
        base_url="http://llm.test/v1", model="m", telemetry=otel.telemetry
    )
    first = asyncio.Event()

    async def consume() -> None:
        stream = await client.chat.completions.create(messages=MESSAGES, stream=True)
        async for _ in stream:
            first.set()

    task = asyncio.create_task(consume())
    await first.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    logical = otel.logical()
    assert logical.status.status_code is StatusCode.UNSET
    assert logical.attributes is not None and logical.attributes["stormguard.cancelled"] is True
    [attempt] = otel.attempts()
    assert attempt.attributes is not None and attempt.attributes["stormguard.cancelled"] is True
    await client.close()


def test_precheck_lookups_are_traced_by_httpx_instrumentation_under_the_call(otel: Otel) -> None:
    from opentelemetry.instrumentation.httpx import HTTPXClientInstrumentor

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/tokenize"):
            return httpx.Response(200, json={"count": 5, "max_model_len": 4096})
        if request.url.path.endswith("/models"):
            return httpx.Response(200, json={"object": "list", "data": []})
        return httpx.Response(200, json=chat_json())

    http = httpx.Client(transport=httpx.MockTransport(handler))
    HTTPXClientInstrumentor.instrument_client(http, tracer_provider=otel.telemetry._tracer_provider)
    try:
        client = stormguard.Client(
            base_url="http://llm.test/v1",
            model="m",
            http_client=http,
            telemetry=otel.telemetry,
            token_policy=TokenPolicy(),
        )
        client.chat.completions.create(messages=MESSAGES)
    finally:
        HTTPXClientInstrumentor.uninstrument_client(http)
    logical = otel.logical()
    children = otel.attempts(logical)
    ours = [s for s in children if s.name == "POST /v1/chat/completions"]
    lookups = [s for s in children if s.name != "POST /v1/chat/completions"]
    assert len(ours) == 1 and lookups  # the pre-check's lookups are not attempts
    assert logical.attributes is not None and logical.attributes["stormguard.attempts"] == 1


async def test_quota_waits_and_paced_429s(api: Api, mock: respx.MockRouter, otel: Otel) -> None:
    quota = {
        "x-ratelimit-limit-tokens": "600",
        "x-ratelimit-remaining-tokens": "0",
        "x-ratelimit-limit-requests": "100",
        "x-ratelimit-remaining-requests": "7",
    }
    rate = {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}
    mock.post("/chat/completions").mock(
        side_effect=[
            httpx.Response(200, json=chat_json(), headers=quota),
            httpx.Response(429, json=rate, headers={**quota, "retry-after": "1"}),
            httpx.Response(200, json=chat_json(), headers=quota),
        ]
    )
    client = api.client(telemetry=otel.telemetry)
    await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    otel.exporter.clear()
    await api.run(client.chat.completions.create(messages=MESSAGES, max_tokens=10))
    logical = otel.logical()
    attrs = logical.attributes or {}
    assert attrs["stormguard.quota.paced_429s"] == 1
    assert attrs["stormguard.quota.wait_s"] > 1.0  # the share's wait, then the 429's
    first, second = otel.attempts(logical)
    assert (first.attributes or {})["stormguard.attempt.outcome"] == "paced"
    for span in (first, second):
        seen = span.attributes or {}
        assert seen["stormguard.attempt.quota_wait_s"] > 0
        assert 0 < seen["stormguard.quota.share"] <= 1
        assert seen["stormguard.quota.remaining_tokens"] == 0
        assert seen["stormguard.quota.remaining_requests"] == 7
    assert otel.counter("stormguard.client.quota.paced_429s") == 1
    waits = otel.metrics()["stormguard.client.quota.wait.duration"]
    assert sum(point.count for point in waits) == 2
    no_secret(otel.spans())
