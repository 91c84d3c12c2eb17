"""The real openai package against the real reference server on a free loopback port:
an agent loop over chat tool calls, streamed tool calls, ``parse`` into a pydantic
model, and the Responses API's function calls and ``parse``."""

from __future__ import annotations

import json
from typing import Any, Literal

import jsonschema
import openai
import pydantic
import pytest

from tests.e2e.server_process import RunningServer

pytestmark = pytest.mark.e2e

MODEL = "stormguard-sim"
LIMIT = 256  # the test server's context is 2,048 tokens; its admission budget less
FORECAST = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 3},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}


class Forecast(pydantic.BaseModel):
    city: str
    sky: Literal["clear", "cloudy", "rain"]
    highs: list[float]


def test_chat_tools_stream_and_parse(stormguard_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=stormguard_server.base_url, api_key="test", max_retries=0)
    tools: list[Any] = [
        {
            "type": "function",
            "function": {"name": "forecast", "parameters": FORECAST, "strict": True},
        }
    ]
    messages: list[Any] = [{"role": "user", "content": "call forecast for Paris"}]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, max_tokens=LIMIT
    )
    assert first.choices[0].finish_reason == "tool_calls"
    [call] = first.choices[0].message.tool_calls or []
    jsonschema.validate(json.loads(call.function.arguments), FORECAST)
    messages += [
        first.choices[0].message,
        {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
    ]
    final = client.chat.completions.create(
        model=MODEL, messages=messages, tools=tools, max_tokens=LIMIT
    )
    assert final.choices[0].message.tool_calls is None and final.choices[0].message.content

    with client.chat.completions.stream(
        model=MODEL,
        messages=[{"role": "user", "content": "call forecast for Paris"}],
        tools=tools,
        max_tokens=LIMIT,
    ) as stream:
        streamed = stream.get_final_completion()
    [again] = streamed.choices[0].message.tool_calls or []
    assert again.function.arguments == call.function.arguments

    parsed = client.chat.completions.parse(
        model=MODEL,
        messages=[{"role": "user", "content": "forecast?"}],
        response_format=Forecast,
        max_tokens=LIMIT,
    )
    assert isinstance(parsed.choices[0].message.parsed, Forecast)


def test_responses_function_calls_and_parse(stormguard_server: RunningServer) -> None:
    client = openai.OpenAI(base_url=stormguard_server.base_url, api_key="test", max_retries=0)
    tools: list[Any] = [
        {"type": "function", "name": "forecast", "parameters": FORECAST, "strict": True}
    ]
    response = client.responses.create(
        model=MODEL, input="call forecast", tools=tools, max_output_tokens=LIMIT
    )
    [call] = [item for item in response.output if item.type == "function_call"]
    jsonschema.validate(json.loads(call.arguments), FORECAST)
    answer = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "call forecast"},
            *response.output,
            {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"},
        ],
        tools=tools,
        max_output_tokens=LIMIT,
    )
    assert answer.output_text

    parsed = client.responses.parse(
        model=MODEL, input="forecast?", text_format=Forecast, max_output_tokens=LIMIT
    )
    assert isinstance(parsed.output_parsed, Forecast)
