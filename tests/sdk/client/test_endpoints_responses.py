"""``responses.create`` on Client and AsyncClient (respx, both modes): the request
openai-python sends, the ``Response`` record, and the pipeline behind it."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

import stormguard
from stormguard.tokens import TokenPolicy
from tests.sdk.helpers import Api
from tests.sdk.telemetry.test_telemetry import Otel, otel  # noqa: F401  (the fixture)


def response_json(text: str = "hello", status: str = "completed", **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "created_at": 1,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "model": "m",
        "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "id": "msg_1",
                "status": status,
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": text, "annotations": []},
                    {"type": "refusal", "refusal": "no"},
                    {"type": "output_text", "text": "!", "annotations": []},
                ],
            },
        ],
        "usage": {"input_tokens": 4, "output_tokens": 2, "total_tokens": 6},
    }
    body.update(extra)
    return body


def sent(route: respx.Route, index: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(route.calls[index].request.content)
    return body


async def test_responses_create_sends_openais_body_and_returns_a_response(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/responses").respond(
        200, json=response_json(), headers={"x-queue-depth": "2"}
    )
    client = api.client()
    result = await api.run(
        client.responses.create(
            input="Say hi",
            instructions="Be brief",
            max_output_tokens=16,
            temperature=0.2,
            top_p=stormguard.NOT_GIVEN,
            extra_query={"q": "1"},
        )
    )
    assert sent(route) == {
        "model": "m",
        "input": "Say hi",
        "instructions": "Be brief",
        "max_output_tokens": 16,
        "temperature": 0.2,
    }
    assert route.calls[0].request.url.query == b"q=1"
    assert isinstance(result, stormguard.Response)
    assert result.output_text == "hello!"
    assert result.output[1].content[0].text == "hello"
    assert result.usage is not None and result.usage.total_tokens == 6
    assert (result.status, result.server_load.queue_depth, result.attempts) == ("completed", 2, 1)


async def test_output_text_is_empty_without_output_text_parts(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/responses").respond(200, json=response_json(output=[], usage=None))
    result = await api.run(api.client().responses.create(input="x", model="other"))
    assert (result.output_text, result.usage, result.model) == ("", None, "m")


async def test_responses_are_retried_and_fall_back_like_chat(
    api: Api, mock: respx.MockRouter
) -> None:
    shed = httpx.Response(503, json={"error": {"message": "busy"}}, headers={"retry-after": "0"})

    def answer(request: httpx.Request) -> httpx.Response:
        model = json.loads(request.content)["model"]
        return shed if model == "big" else httpx.Response(200, json=response_json(model=model))

    route = mock.post("/responses").mock(side_effect=answer)
    client = api.client(
        model="big",
        fallback_models=["small"],
        concurrency=None,
        retry_policy=stormguard.RetryPolicy(max_attempts=2),
    )
    result = await api.run(client.responses.create(input=[{"role": "user", "content": "hi"}]))
    assert result.degraded and result.served_model == "small"
    assert [sent(route, i)["model"] for i in range(route.call_count)] == ["big", "big", "small"]
    assert sent(route)["input"] == [{"role": "user", "content": "hi"}]


async def test_a_400_is_a_bad_request_error_with_openais_fields(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/responses").respond(
        400,
        json={"error": {"message": "bad input", "type": "invalid_request_error", "param": "input"}},
    )
    with pytest.raises(stormguard.BadRequestError) as caught:
        await api.run(api.client().responses.create(input=""))
    assert (caught.value.param, caught.value.type) == ("input", "invalid_request_error")
    assert route.call_count == 1


async def test_responses_input_and_output_budget_are_prechecked(
    api: Api, mock: respx.MockRouter
) -> None:
    route = mock.post("/responses").respond(200, json=response_json())
    client = api.client(
        token_policy=TokenPolicy(
            context_windows={"m": 300}, server_context_windows=False, server_tokenize=False
        )
    )
    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
    ]
    result = await api.run(
        client.responses.create(input=items, instructions="Be brief", max_output_tokens=20)
    )
    assert result.precheck is not None and result.precheck.max_tokens == 20
    assert 0 < result.precheck.prompt_tokens <= 280
    with pytest.raises(stormguard.ContextWindowExceededError):
        await api.run(client.responses.create(input="hi", max_output_tokens=300))
    assert route.call_count == 1


# -- streamed ---------------------------------------------------------------------------


def events(*items: dict[str, Any], named: bool = True) -> bytes:
    out = ""
    for number, item in enumerate(items):
        data = json.dumps({**item, "sequence_number": number})
        out += (f"event: {item['type']}\n" if named else "") + f"data: {data}\n\n"
    return out.encode()


def stream_of(*texts: str, end: str = "response.completed") -> list[dict[str, Any]]:
    started = response_json(status="in_progress", output=[], usage=None)
    final = response_json("".join(texts), status=end.removeprefix("response."))
    return [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
        *({"type": "response.output_text.delta", "delta": t, "item_id": "msg_1"} for t in texts),
        {"type": "response.vendor.extension", "note": "unknown types come through"},
        {"type": "response.output_text.done", "text": "".join(texts)},
        {"type": end, "response": final},
    ]


def sse_response(body: bytes) -> httpx.Response:
    return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)


@pytest.mark.parametrize("named", [True, False])
async def test_a_stream_of_typed_events_ends_at_its_last_event(
    api: Api, mock: respx.MockRouter, named: bool
) -> None:
    route = mock.post("/responses").mock(
        return_value=sse_response(events(*stream_of("he", "llo"), named=named))
    )
    stream = await api.run(api.client().responses.create(input="hi", stream=True))
    assert isinstance(stream, (stormguard.Stream, stormguard.AsyncStream))
    got = await api.collect(stream)
    assert sent(route)["stream"] is True
    assert [e.type for e in got] == [
        "response.created",
        "response.in_progress",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.vendor.extension",
        "response.output_text.done",
        "response.completed",
    ]
    assert "".join(e.delta for e in got if e.type == "response.output_text.delta") == "hello"
    assert got[4].note == "unknown types come through"
    assert got[-1].response.output_text == "hello!"
    assert got[0].response.status == "in_progress"
    assert stream.attempts == 1 and stream.chunks_received == 7


async def test_an_incomplete_response_is_a_normal_end(api: Api, mock: respx.MockRouter) -> None:
    mock.post("/responses").mock(
        return_value=sse_response(events(*stream_of("a", end="response.incomplete")))
    )
    stream = await api.run(api.client().responses.create(input="hi", stream=True))
    got = await api.collect(stream)
    assert got[-1].response.status == "incomplete"


async def test_a_stream_cut_before_its_last_event_is_interrupted(
    api: Api, mock: respx.MockRouter
) -> None:
    mock.post("/responses").mock(return_value=sse_response(events(*stream_of("a")[:-1])))
    stream = await api.run(api.client().responses.create(input="hi", stream=True))
    with pytest.raises(stormguard.StreamInterruptedError, match="before its last event"):
        await api.collect(stream)


async def test_an_error_event_after_the_first_event_is_raised_not_retried(
    api: Api, mock: respx.MockRouter
) -> None:
    failed = response_json(status="failed", output=[], usage=None)
    failed["error"] = {"code": "server_error", "message": "engine failed"}
    body = events(
        *stream_of("a")[:3],
        {"type": "error", "code": "engine_unavailable", "message": "engine failed", "param": None},
        {"type": "response.failed", "response": failed},
    )
    route = mock.post("/responses").mock(return_value=sse_response(body))
    stream = await api.run(api.client().responses.create(input="hi", stream=True))
    got: list[Any] = []
    with pytest.raises(stormguard.InternalServerError, match="engine failed") as caught:
        if api.mode == "sync":
            for event in stream:
                got.append(event)
        else:
            async for event in stream:
                got.append(event)
    # The events before the failure were the caller's: they came first.
    assert [e.type for e in got] == [e["type"] for e in stream_of("a")[:3]]
    assert caught.value.code == "engine_unavailable"
    assert route.call_count == 1


@pytest.mark.parametrize(
    ("failure", "error_type"),
    [
        (
            {"type": "error", "code": "rate_limit_exceeded", "message": "slow down"},
            stormguard.RateLimitError,
        ),
        (
            {
                "type": "response.failed",
                "response": {"status": "failed", "error": {"code": "server_error", "message": "x"}},
            },
            stormguard.InternalServerError,
        ),
    ],
)
async def test_a_failure_before_the_first_event_is_retried(
    api: Api, mock: respx.MockRouter, failure: dict[str, Any], error_type: type[Exception]
) -> None:
    route = mock.post("/responses").mock(
        side_effect=[sse_response(events(failure)), sse_response(events(*stream_of("ok")))]
    )
    client = api.client(concurrency=None)
    stream = await api.run(client.responses.create(input="hi", stream=True))
    got = await api.collect(stream)
    assert got[-1].type == "response.completed"
    assert route.call_count == 2
    assert [a.error_type for a in stream.attempt_history] == [error_type.__name__, None]


async def test_a_responses_span_has_its_usage_status_and_text(
    api: Api,
    mock: respx.MockRouter,
    otel: Otel,  # noqa: F811
) -> None:
    mock.post("/responses").respond(200, json=response_json("hey"))
    client = api.client(telemetry=otel.telemetry)
    await api.run(client.responses.create(input="hi", max_output_tokens=9))
    span = otel.logical()
    attributes = span.attributes or {}
    assert span.name == "chat m"
    assert attributes["gen_ai.request.max_tokens"] == 9
    assert attributes["gen_ai.response.finish_reasons"] == ("completed",)
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
        4,
        2,
    )


def test_mypy_strict_accepts_openai_style_calls_of_the_new_endpoints() -> None:
    from pathlib import Path

    from mypy import api as mypy_api

    sample = Path(__file__).with_name("openai_style_typing_endpoints.py")
    out, err, status = mypy_api.run(["--strict", "--no-error-summary", str(sample)])
    assert status == 0, out + err
