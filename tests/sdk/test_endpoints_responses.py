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
            context_windows={"m": 300}, server_windows=False, server_tokenize=False
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
