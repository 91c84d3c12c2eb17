"""Tools and structured output through the real openai package, against the app in
process: tool calls whose arguments are valid for their parameters (checked by the
``jsonschema`` package, another implementation than the server's), the rule for which
tools are called and when an agent loop ends, streamed tool calls as openai
assembles them, ``parse`` into pydantic models, ``max_tokens`` cutting a document,
the Responses API's function calls, events and ``parse``, and the 400s."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import jsonschema
import openai
import pydantic
import pytest
from openai import AsyncOpenAI

from stormguard_server.engine.tokenizer import split_tokens
from tests.server.api.test_responses import events_of
from tests.server.conftest import app_client
from tests.server.test_app import assert_openai_error

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MODEL = "stormguard-sim"

WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1},
        "unit": {"type": "string", "enum": ["c", "f"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "unit", "days"],
    "additionalProperties": False,
}
TIME = {
    "type": "object",
    "properties": {"zone": {"type": "string", "pattern": "^[A-Z][a-z]+/[A-Z][a-z]+$"}},
    "required": ["zone"],
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "get_weather", "parameters": WEATHER, "strict": True},
    },
    {"type": "function", "function": {"name": "get_time", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
RESPONSES_TOOLS: list[Any] = [
    {"type": "function", "name": "get_weather", "parameters": WEATHER, "strict": True},
    {"type": "function", "name": "get_time", "parameters": TIME, "strict": False},
]


class Weather(pydantic.BaseModel):
    city: str
    unit: Literal["c", "f"]
    days: int = pydantic.Field(ge=1, le=7)


class Step(pydantic.BaseModel):
    explanation: str
    output: str


class Answer(pydantic.BaseModel):
    steps: list[Step]
    final_answer: str
    confidence: float = pydantic.Field(ge=0, le=1)
    note: str | None


def user(text: str) -> list[Any]:
    return [{"role": "user", "content": text}]


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with app_client(max_body_bytes=1 << 20) as client:
        yield client


@pytest.fixture
def client(http: httpx.AsyncClient) -> AsyncOpenAI:
    return AsyncOpenAI(
        api_key="sk-test", base_url="http://testserver/v1", http_client=http, max_retries=0
    )


def assert_valid(arguments: str, name: str) -> dict[str, Any]:
    document = json.loads(arguments)
    jsonschema.validate(document, SCHEMAS[name])
    return dict(document)


# -- chat completions ----------------------------------------------------------------


async def test_a_tool_call_has_arguments_valid_for_its_parameters(client: AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(
        model="stormguard-sim", messages=user("what is the weather like?"), tools=TOOLS
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls or []
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"  # no tool mentioned: the first one
    assert_valid(call.function.arguments, "get_weather")
    # The arguments are the completion: their tokens are its usage.
    assert completion.usage is not None
    assert completion.usage.completion_tokens == len(split_tokens(call.function.arguments))


async def test_the_tools_mentioned_are_called_in_parallel_unless_told_not_to(
    client: AsyncOpenAI,
) -> None:
    asked = user("use get_time, then get_weather")
    both = await client.chat.completions.create(model=MODEL, messages=asked, tools=TOOLS)
    calls = both.choices[0].message.tool_calls or []
    assert [c.function.name for c in calls] == ["get_weather", "get_time"]  # tools' order
    assert len({c.id for c in calls}) == 2
    for call in calls:
        assert_valid(call.function.arguments, call.function.name)
    one = await client.chat.completions.create(
        model=MODEL, messages=asked, tools=TOOLS, parallel_tool_calls=False
    )
    assert [c.function.name for c in one.choices[0].message.tool_calls or []] == ["get_weather"]


async def test_the_same_request_gets_the_same_arguments(client: AsyncOpenAI) -> None:
    asked = user("use get_time and get_weather")
    one, two = [
        await client.chat.completions.create(model=MODEL, messages=asked, tools=TOOLS)
        for _ in range(2)
    ]
    first, second = one.choices[0].message.tool_calls, two.choices[0].message.tool_calls
    assert first and second
    assert [c.function.arguments for c in first] == [c.function.arguments for c in second]
    other = await client.chat.completions.create(
        model=MODEL, messages=user("use get_time and get_weather, please"), tools=TOOLS
    )
    assert [c.function.arguments for c in other.choices[0].message.tool_calls or []] != [
        c.function.arguments for c in first
    ]


async def test_an_agent_loop_ends_once_its_tools_have_answered(client: AsyncOpenAI) -> None:
    """The loop frameworks run: call, append the assistant message and a tool message per
    call, call again; the answer after the tool results is text."""
    messages: list[Any] = user("use get_weather and get_time")
    turns = 0
    while turns < 5:
        turns += 1
        completion = await client.chat.completions.create(
            model=MODEL, messages=messages, tools=TOOLS
        )
        message = completion.choices[0].message
        if not message.tool_calls:
            break
        messages.append(message)
        for call in message.tool_calls:
            messages.append({"role": "tool", "tool_call_id": call.id, "content": "sunny, 21C"})
    assert turns == 2
    assert completion.choices[0].finish_reason in ("stop", "length")
    assert message.content


async def test_tool_choice_none_required_and_named(client: AsyncOpenAI) -> None:
    answered = [
        *user("use get_weather"),
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    none = await client.chat.completions.create(
        model=MODEL, messages=user("use get_weather"), tools=TOOLS, tool_choice="none"
    )
    assert none.choices[0].message.tool_calls is None and none.choices[0].message.content
    # required and a named function call a tool even after a tool's result (as OpenAI).
    required = await client.chat.completions.create(
        model=MODEL, messages=answered, tools=TOOLS, tool_choice="required"
    )
    assert [c.function.name for c in required.choices[0].message.tool_calls or []] == [
        "get_weather"
    ]
    named = await client.chat.completions.create(
        model=MODEL,
        messages=answered,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_time"}},
    )
    [call] = named.choices[0].message.tool_calls or []
    assert call.function.name == "get_time"
    assert_valid(call.function.arguments, "get_time")


async def test_streamed_tool_calls_come_as_openai_streams_them(
    http: httpx.AsyncClient, client: AsyncOpenAI
) -> None:
    body = {"messages": user("use get_weather and get_time"), "tools": TOOLS, "stream": True}
    response = await http.post(CHAT, json=body)
    assert response.status_code == 200
    chunks = [
        json.loads(line[6:]) for line in response.text.split("\n\n") if line.startswith("data: {")
    ]
    assert response.text.rstrip().endswith("data: [DONE]")
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    first = deltas[0]
    assert first["role"] == "assistant" and first["content"] is None
    opening = first["tool_calls"][0]
    assert opening["index"] == 0 and opening["id"].startswith("call_")
    assert opening["type"] == "function" and opening["function"]["name"] == "get_weather"
    starts = [e for d in deltas for e in d.get("tool_calls", []) if "id" in e]
    assert [e["index"] for e in starts] == [0, 1]
    for delta in deltas[1:-1]:
        for entry in delta["tool_calls"]:
            assert set(entry) == {"index", "function"} or "id" in entry
    # The finish reason comes alone, in a chunk with an empty delta.
    assert deltas[-1] == {} and chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    # openai's own stream helper assembles the same calls a plain answer has.
    plain = await client.chat.completions.create(
        model=MODEL, messages=user("use get_weather and get_time"), tools=TOOLS
    )
    async with client.chat.completions.stream(
        model=MODEL, messages=user("use get_weather and get_time"), tools=TOOLS
    ) as stream:
        final = await stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    assert [c.function.arguments for c in final.choices[0].message.tool_calls or []] == [
        c.function.arguments for c in plain.choices[0].message.tool_calls or []
    ]


async def test_a_pydantic_tool_is_parsed_streamed_or_not(client: AsyncOpenAI) -> None:
    tools = [openai.pydantic_function_tool(Weather)]
    parsed = await client.chat.completions.parse(
        model=MODEL, messages=user("weather?"), tools=tools
    )
    [call] = parsed.choices[0].message.tool_calls or []
    assert isinstance(call.function.parsed_arguments, Weather)
    async with client.chat.completions.stream(
        model=MODEL, messages=user("weather?"), tools=tools
    ) as stream:
        final = await stream.get_final_completion()
    [streamed] = final.choices[0].message.tool_calls or []
    assert streamed.function.parsed_arguments == call.function.parsed_arguments


async def test_parse_gives_a_model_and_json_object_an_object(client: AsyncOpenAI) -> None:
    parsed = await client.chat.completions.parse(
        model=MODEL, messages=user("solve 2x = 4"), response_format=Answer
    )
    message = parsed.choices[0].message
    assert isinstance(message.parsed, Answer)
    assert parsed.choices[0].finish_reason == "stop"
    async with client.chat.completions.stream(
        model=MODEL, messages=user("solve 2x = 4"), response_format=Answer
    ) as stream:
        contents = [e.delta async for e in stream if e.type == "content.delta"]
        final = await stream.get_final_completion()
    assert len(contents) > 1 and "".join(contents) == message.content
    assert final.choices[0].message.parsed == message.parsed
    loose = await client.chat.completions.create(
        model=MODEL, messages=user("answer in json"), response_format={"type": "json_object"}
    )
    assert isinstance(json.loads(loose.choices[0].message.content or ""), dict)


async def test_max_tokens_cuts_a_document_with_length(client: AsyncOpenAI) -> None:
    whole = await client.chat.completions.parse(
        model=MODEL, messages=user("solve"), response_format=Answer
    )
    cut = await client.chat.completions.create(
        model=MODEL,
        messages=user("solve"),
        max_tokens=3,
        response_format=openai.lib._parsing._completions.type_to_response_format_param(Answer),  # type: ignore[arg-type]
    )
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage is not None and cut.usage.completion_tokens == 3
    assert (whole.choices[0].message.content or "").startswith(
        cut.choices[0].message.content or "x"
    )
    with pytest.raises(openai.LengthFinishReasonError):
        await client.chat.completions.parse(
            model=MODEL, messages=user("solve"), response_format=Answer, max_tokens=3
        )
    calls = await client.chat.completions.create(
        model=MODEL, messages=user("use get_weather"), tools=TOOLS, max_tokens=2
    )
    assert calls.choices[0].finish_reason == "length"
    [partial] = calls.choices[0].message.tool_calls or []
    assert len(split_tokens(partial.function.arguments)) == 2


# -- the Responses API ---------------------------------------------------------------


async def test_responses_function_calls_and_an_agent_loop(client: AsyncOpenAI) -> None:
    asked: list[Any] = [{"role": "user", "content": "use get_weather and get_time"}]
    response = await client.responses.create(model=MODEL, input=asked, tools=RESPONSES_TOOLS)
    assert response.status == "completed"
    calls = [item for item in response.output if item.type == "function_call"]
    assert [c.name for c in calls] == ["get_weather", "get_time"]
    for call in calls:
        assert call.call_id.startswith("call_") and call.status == "completed"
        assert_valid(call.arguments, call.name)
    assert [t.name for t in response.tools] == ["get_weather", "get_time"]  # type: ignore[union-attr]
    follow_up = [
        *asked,
        *response.output,
        *[{"type": "function_call_output", "call_id": c.call_id, "output": "ok"} for c in calls],
    ]
    answer = await client.responses.create(model=MODEL, input=follow_up, tools=RESPONSES_TOOLS)
    assert [item.type for item in answer.output] == ["message"]
    assert answer.output_text


async def test_responses_streamed_function_calls_in_openais_event_order(
    http: httpx.AsyncClient, client: AsyncOpenAI
) -> None:
    body = {"input": "use get_weather and get_time", "tools": RESPONSES_TOOLS, "stream": True}
    response = await http.post(RESPONSES, json=body)
    events = events_of(response.text)  # each validated by openai's event types
    kinds = [e["type"] for e in events]
    deltas = kinds.count("response.function_call_arguments.delta")
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        *["response.function_call_arguments.delta"]
        * (kinds.index("response.function_call_arguments.done") - 3),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"]
        * (deltas - (kinds.index("response.function_call_arguments.done") - 3)),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = [e for e in events if e["type"] == "response.function_call_arguments.done"]
    for event in done:
        pieces = [
            e["delta"]
            for e in events
            if e["type"] == "response.function_call_arguments.delta"
            and e["item_id"] == event["item_id"]
        ]
        assert "".join(pieces) == event["arguments"]
    async with client.responses.stream(
        model=MODEL, input="use get_weather and get_time", tools=RESPONSES_TOOLS
    ) as stream:
        final = await stream.get_final_response()
    assert [item.arguments for item in final.output if item.type == "function_call"] == [
        e["arguments"] for e in done
    ]


async def test_responses_parse_gives_a_model(client: AsyncOpenAI) -> None:
    parsed = await client.responses.parse(model=MODEL, input="solve 2x = 4", text_format=Answer)
    assert isinstance(parsed.output_parsed, Answer)
    assert parsed.text is not None and parsed.text.format is not None
    assert parsed.text.format.type == "json_schema"


# -- refusals ------------------------------------------------------------------------


def chat(**fields: Any) -> dict[str, Any]:
    return {"messages": user("use get_weather"), **fields}


def function(name: Any = "get_weather", parameters: Any = None, **more: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": name, **more}
    if parameters is not None:
        spec["parameters"] = parameters
    return {"type": "function", "function": spec}


def json_schema(schema: Any, **more: Any) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "Answer", "schema": schema, **more}}


@pytest.mark.parametrize(
    ("path", "body", "param", "says"),
    [
        (CHAT, chat(tools=[function(parameters="object")]), "tools.0.function.parameters", ""),
        (
            CHAT,
            chat(
                tools=[
                    function(parameters={"type": "object", "properties": {"a": {"type": "strin"}}})
                ]
            ),
            "tools.0.function.parameters",
            "'strin' is not a JSON Schema type",
        ),
        (
            CHAT,
            chat(tools=[function(parameters={"$ref": "#/$defs/missing"})]),
            "tools.0.function.parameters",
            "does not resolve",
        ),
        (CHAT, chat(tools=[{"type": "function", "function": {}}]), "tools.0.function.name", ""),
        (CHAT, chat(tools=[function(name="get weather")]), "tools.0.function.name", "a-z"),
        (CHAT, chat(tools=[function(), function()]), "tools", "unique"),
        (
            CHAT,
            chat(tools=[{"type": "custom", "custom": {"name": "x"}}]),
            "tools.0.type",
            "function",
        ),
        (
            CHAT,
            chat(
                tools=[function()], tool_choice={"type": "function", "function": {"name": "nope"}}
            ),
            "tool_choice",
            "nope",
        ),
        (CHAT, chat(tool_choice="required"), "tool_choice", "only allowed when 'tools'"),
        (
            CHAT,
            chat(
                tools=[
                    function(parameters={"type": "object", "properties": {"a": {}}}, strict=True)
                ]
            ),
            "tools.0.function.parameters",
            "'additionalProperties' is required",
        ),
        (
            CHAT,
            chat(response_format=json_schema({"type": "object", "properties": {"a": {"not": {}}}})),
            "response_format",
            "'not' is not supported",
        ),
        (
            CHAT,
            chat(
                response_format=json_schema(
                    {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
                    strict=True,
                )
            ),
            "response_format",
            "Missing 'a'",
        ),
        (CHAT, chat(response_format={"type": "json_schema"}), "response_format.json_schema", ""),
        (
            CHAT,
            chat(
                response_format=json_schema(
                    {"type": "object", "properties": {"n": {"$ref": "#"}}, "required": ["n"]}
                )
            ),
            "response_format",
            "no document",
        ),
        (
            RESPONSES,
            {"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": 3}}]},
            "tools.0.parameters",
            "",
        ),
        (RESPONSES, {"input": "x", "tools": [{"type": "function"}]}, "tools.0.name", ""),
        (RESPONSES, {"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type", ""),
        (
            RESPONSES,
            {
                "input": "x",
                "tools": [{"type": "function", "name": "f"}],
                "tool_choice": {"type": "function", "name": "g"},
            },
            "tool_choice",
            "",
        ),
        (
            RESPONSES,
            {
                "input": "x",
                "text": {
                    "format": {
                        "type": "json_schema",
                        "name": "A",
                        "schema": {"type": "object", "properties": {"a": {"if": {}}}},
                    }
                },
            },
            "text.format",
            "'if' is not supported",
        ),
    ],
)
async def test_what_cannot_be_answered_is_a_400_naming_the_field(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], param: str, says: str
) -> None:
    error = assert_openai_error(await http.post(path, json=body), 400)
    assert error["param"] == param, error
    assert says in error["message"]


async def test_openai_raises_bad_request_with_the_param(client: AsyncOpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await client.chat.completions.create(
            model=MODEL,
            messages=user("x"),
            tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "nope"}},
        )
    assert caught.value.param == "tool_choice"


HOSTILE: list[Any] = [
    {
        "type": "object",
        "properties": {"a": {"type": "array", "minItems": 10**9}},
        "required": ["a"],
    },
    {
        "type": "object",
        "properties": {"a": {"type": "string", "minLength": 10**9}},
        "required": ["a"],
    },
    {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}},
        "required": ["a"],
    },
    {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "(?:){1000000}" * 3}},
        "required": ["a"],
    },
    {
        "type": "object",
        "properties": {"a": {"type": "string", "pattern": "a{1000000}"}},
        "required": ["a"],
    },
    {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
    {
        "type": "object",
        "properties": {
            "a": {"type": "array", "minItems": 9000, "items": {"type": "array", "minItems": 9000}}
        },
        "required": ["a"],
    },
    json.loads('{"type":"object","properties":{"a":' * 40 + "{}" + "}}" * 40),
    {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(6000)}},
    {"type": "object", "properties": {"a": {"enum": list(range(2000))}}},
    {
        "type": "object",
        "properties": {"a": {"type": "string", "format": "date-time", "maxLength": 3}},
        "required": ["a"],
    },
    # Bounds near the float limit: 1.7e308 / 1e-300 overflows a float.
    {"properties": {"a": {"type": "number", "minimum": 1.7e308, "multipleOf": 1e-300}}},
    {"properties": {"a": {"type": "number", "maximum": -1.7e308, "multipleOf": 3e-300}}},
]


@pytest.mark.parametrize("schema", HOSTILE, ids=range(len(HOSTILE)))
async def test_a_hostile_schema_gets_a_400_or_a_bounded_answer_quickly(
    http: httpx.AsyncClient, schema: Any
) -> None:
    started = time.monotonic()
    for path, body in (
        (CHAT, chat(response_format=json_schema(schema), max_tokens=64)),
        (CHAT, chat(tools=[function(parameters=schema)], max_tokens=64)),
        (
            RESPONSES,
            {
                "input": "x",
                "tools": [{"type": "function", "name": "f", "parameters": schema}],
                "max_output_tokens": 64,
            },
        ),
    ):
        response = await http.post(path, json=body)
        assert response.status_code in (200, 400), response.text
        assert len(response.content) < 64_000
        if response.status_code == 400:
            assert_openai_error(response, 400)
    assert time.monotonic() - started < 10  # three requests; each is bounded well below


async def test_tools_are_checked_and_drawn_off_the_event_loop(
    http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large schema takes tens of milliseconds to check and draw from: a request with
    tools or a format does it in a worker thread, a plain one inline."""
    from stormguard_server import app as app_module
    from stormguard_server.api import responses as responses_module

    threads: list[str] = []

    def recording(real: Any) -> Any:
        def spec(body: Any) -> Any:
            threads.append(threading.current_thread().name)
            return real(body)

        return spec

    monkeypatch.setattr(app_module, "chat_spec", recording(app_module.chat_spec))
    monkeypatch.setattr(
        responses_module, "responses_spec", recording(responses_module.responses_spec)
    )
    loop_thread = threading.current_thread().name
    for path, body in (
        (CHAT, chat(tools=TOOLS, max_tokens=8)),
        (CHAT, chat(response_format={"type": "json_object"}, max_tokens=8)),
        (RESPONSES, {"input": "x", "tools": RESPONSES_TOOLS, "max_output_tokens": 8}),
        (CHAT, chat(max_tokens=8)),
        (RESPONSES, {"input": "x", "max_output_tokens": 8}),
    ):
        assert (await http.post(path, json=body)).status_code == 200
    assert [name == loop_thread for name in threads] == [False, False, False, True, True]
