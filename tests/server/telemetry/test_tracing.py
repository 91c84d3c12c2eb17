"""Server spans: the request joins the caller's trace; admission and engine phases under it."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from stormguard.protocol import Priority, ShedReason
from stormguard_server.app import build_state, create_app
from stormguard_server.config import ServerConfig
from stormguard_server.telemetry.records import RequestRecord
from stormguard_server.telemetry.tracing import RequestSpans
from tests.server.conftest import FAST_ENGINE

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
PARENT_ID = 0xB7AD6B7169203331
TRACEPARENT = f"00-{TRACE_ID:032x}-{PARENT_ID:016x}-01"
CHAT = {"model": "stormguard-sim", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


@pytest.fixture
async def traced(exporter: InMemorySpanExporter) -> AsyncIterator[httpx.AsyncClient]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = ServerConfig(engine=dataclasses.replace(FAST_ENGINE, warmup_probe_tokens=1))
    app = create_app(state=build_state(config, tracer_provider=provider))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://testserver") as client:
            yield client


def by_name(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    return {s.name: s for s in spans}


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def check_tree(spans: list[ReadableSpan]) -> dict[str, ReadableSpan]:
    named = by_name(spans)
    server = named["POST /v1/chat/completions"]
    assert server.kind is SpanKind.SERVER
    assert server.context is not None and server.context.trace_id == TRACE_ID
    assert parent_of(server) == PARENT_ID  # a child of the client's attempt span
    for phase in ("admission", "engine prefill", "engine decode"):
        assert parent_of(named[phase]) == server.context.span_id, phase
    admission, prefill, decode = named["admission"], named["engine prefill"], named["engine decode"]
    assert admission.start_time is not None and admission.end_time is not None
    assert prefill.start_time is not None and prefill.end_time is not None
    assert decode.start_time is not None and decode.end_time is not None and server.end_time
    assert admission.end_time <= prefill.start_time + 1000  # admitted, then the engine
    assert prefill.end_time <= decode.start_time + 1000 and decode.end_time <= server.end_time
    return named


async def test_a_request_joins_the_callers_trace(
    traced: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    headers = {"traceparent": TRACEPARENT, "x-stormguard-attempt": "2"}
    resp = await traced.post("/v1/chat/completions", json=CHAT, headers=headers)
    assert resp.status_code == 200
    named = check_tree(list(exporter.get_finished_spans()))
    server = named["POST /v1/chat/completions"].attributes or {}
    assert server["http.response.status_code"] == 200
    assert server["stormguard.request.attempt"] == "2"
    assert server["stormguard.request.id"] == resp.headers["x-request-id"]
    assert server["stormguard.request.outcome"] == "ok"
    admission = named["admission"].attributes or {}
    assert admission["stormguard.admission.decision"] == "admitted"
    assert "stormguard.admission.queue_position" not in admission  # admitted without queueing
    assert admission["stormguard.admission.cost_tokens"] >= 5
    decode = named["engine decode"].attributes or {}
    assert decode["stormguard.engine.output_tokens"] == 5
    assert decode["gen_ai.response.finish_reasons"] == ("length",)


async def test_a_stream_is_traced_to_its_end(
    traced: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    body = {**CHAT, "stream": True}
    async with traced.stream(
        "POST", "/v1/chat/completions", json=body, headers={"traceparent": TRACEPARENT}
    ) as resp:
        assert resp.status_code == 200
        body = b"".join([chunk async for chunk in resp.aiter_bytes()])
    assert body.endswith(b"data: [DONE]\n\n")
    check_tree(list(exporter.get_finished_spans()))


async def test_no_traceparent_starts_a_trace_and_refusals_are_spans_too(
    traced: httpx.AsyncClient, exporter: InMemorySpanExporter
) -> None:
    too_long = {**CHAT, "max_tokens": 100_000}
    resp = await traced.post("/v1/chat/completions", json=too_long)
    assert resp.status_code == 400
    [span] = exporter.get_finished_spans()
    assert span.parent is None and span.kind is SpanKind.SERVER
    assert span.attributes is not None and span.attributes["http.response.status_code"] == 400
    assert span.status.status_code is StatusCode.UNSET  # a caller's 4xx is no server error
    exporter.clear()
    assert (await traced.get("/ready")).status_code == 200
    assert exporter.get_finished_spans() == ()  # probes are not traced


def test_a_shed_request_has_an_admission_span_with_the_reason() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    spans = RequestSpans(tracer)
    record = RequestRecord(
        request_id="chatcmpl-x", kind="chat", model="m", priority=Priority.SHEDDABLE,
        attempt=3, deadline_ms=None, prompt_tokens=10, max_tokens=5, arrival=100.0,
    )  # fmt: skip
    with tracer.start_as_current_span("POST /v1/chat/completions", kind=SpanKind.SERVER) as server:
        spans.request_arrived(record)
        record.cost, record.queue_position = 16, 7
        record.shed_reason, record.outcome = ShedReason.QUEUE_FULL, "shed"
        spans.request_done(record)
    named = by_name(list(exporter.get_finished_spans()))
    assert set(named) == {"POST /v1/chat/completions", "admission"}  # never reached the engine
    admission = named["admission"]
    assert parent_of(admission) == server.get_span_context().span_id
    assert dict(admission.attributes or {}) | {"stormguard.admission.wait_s": 0} == {
        "stormguard.admission.decision": "shed",
        "stormguard.admission.wait_s": 0,
        "stormguard.admission.queue_position": 7,
        "stormguard.admission.cost_tokens": 16,
        "stormguard.server.load_shed": "queue_full",
    }
    attrs = named["POST /v1/chat/completions"].attributes or {}
    assert attrs["stormguard.server.load_shed"] == "queue_full"
    assert attrs["stormguard.request.priority"] == "sheddable"
    assert attrs["stormguard.request.outcome"] == "shed"


def test_tracing_is_off_by_default() -> None:
    state = build_state(ServerConfig())
    assert state.tracing is None
    assert not any(isinstance(o, RequestSpans) for o in state.observers)
    assert not isinstance(trace.get_current_span(), ReadableSpan)


def test_the_cli_flag_turns_tracing_on() -> None:
    from stormguard_server.cli import build_parser, config_from_args

    args = build_parser().parse_args(["--otlp-endpoint", "http://127.0.0.1:4318"])
    assert config_from_args(args).otlp_endpoint == "http://127.0.0.1:4318"
    assert config_from_args(build_parser().parse_args([])).otlp_endpoint is None
